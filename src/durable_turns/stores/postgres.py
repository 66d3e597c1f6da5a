"""The shared store: PostgreSQL (psycopg 3), for many workers on many machines.

- Every statement is a :class:`~durable_turns.stores._sql.SqlRules` rule (``%s`` placeholders,
  ``lock_rows``: each write locks its session's row first). This module brings the
  connections, the transactions, the schema, the lease and the feed's wake-up.
- Connections are sync psycopg connections, each used on its own thread (a ``Worker``), so a
  local tool gets the step's connection (``ctx.store.unwrap()``) inside the step's
  transaction and its writes commit with the step, exactly once. A step holds a connection
  of the pool from its first local tool (or its commit) until its commit ends; reads take one
  for a statement. Leases (claim, heartbeat, release) use a connection of their own, so a pool
  busy with long local tools never starves a heartbeat.
- The lease is a row lease: ``sessions.lease_until`` (database time, so the workers' clocks
  never matter). ``claim()`` takes a free or expired lease, whoever held it, and bumps
  ``sessions.epoch``; a heartbeat renews it every ``lease_ttl / 3`` seconds while held; a
  crashed or paused holder loses it ``lease_ttl`` seconds after its last heartbeat. Every
  step commit locks the session row and checks the epoch in its own transaction
  (``SELECT epoch ... FOR UPDATE``): a holder that was taken over gets
  :class:`~durable_turns.errors.LeaseLostError` and nothing of its step, local tools'
  writes included, is committed.
- The feed: every commit that writes events, every enqueue and cancel sends
  ``pg_notify('durable_turns', '[agent, session, seq]')`` in its own transaction (never any
  content). One listening connection per store, open while anyone subscribes or watches,
  tells the feed; it also re-reads every ``poll_interval`` seconds and after a reconnect, so
  a lost notification is only a delay.
- The schema is migrated by the store, under an advisory lock, so many processes may open a
  new database at once. ``MIGRATIONS`` is append-only; ``durable_turns_schema`` holds the
  version. Tables live in the connection's ``search_path`` schema (put
  ``options=-csearch_path=myschema`` in the DSN to use another one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from ..errors import FatalToolError, LeaseLostError, LeaseTimeoutError, StoreError
from ..messages import Message
from ..records import EntryKind, SessionKey, TurnRecord
from ._base import BufferedTransaction, LeaseBase
from ._feed import Feed, FeedStore
from ._sql import SqlReads, SqlRules
from ._thread import Worker

T = TypeVar("T")
log = logging.getLogger("durable_turns")

# Append-only: index + 1 = schema version (the row of durable_turns_schema).
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        sid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        agent TEXT NOT NULL,
        session TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'new',
        generation INTEGER NOT NULL DEFAULT 0,
        epoch BIGINT NOT NULL DEFAULT 0,
        lease_until TIMESTAMPTZ,
        UNIQUE (agent, session)
    );
    CREATE TABLE turns (
        ordinal BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        sid BIGINT NOT NULL REFERENCES sessions (sid),
        turn_id TEXT NOT NULL,
        kind TEXT NOT NULL DEFAULT 'turn',
        status TEXT NOT NULL,
        opening TEXT NOT NULL,
        event TEXT, policy TEXT, request TEXT,
        text TEXT, error TEXT, reason TEXT, cancel TEXT,
        data TEXT,
        UNIQUE (sid, turn_id)
    );
    CREATE INDEX turns_open ON turns (sid) WHERE status IN ('queued', 'running', 'suspended');
    CREATE INDEX turns_by_id ON turns (turn_id);
    CREATE TABLE messages (
        sid BIGINT NOT NULL, gen INTEGER NOT NULL, idx INTEGER NOT NULL,
        turn_id TEXT, body TEXT NOT NULL,
        PRIMARY KEY (sid, gen, idx)
    );
    CREATE TABLE steps (
        sid BIGINT NOT NULL, gen INTEGER NOT NULL, step_id TEXT NOT NULL,
        turn_id TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (sid, gen, step_id)
    );
    CREATE TABLE events (
        sid BIGINT NOT NULL, seq BIGINT NOT NULL, turn_id TEXT NOT NULL,
        type TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (sid, seq)
    );
    """,
]

CHANNEL = "durable_turns"
"""The NOTIFY channel; a payload is ``[agent, session, seq]`` (JSON)."""
_MIGRATION_LOCK = 0x44545552  # "DTUR": the advisory lock key around migrations
_RULES = SqlRules("%s", lock_rows=True)
_TRY_LEASE = (
    "UPDATE sessions SET lease_until = clock_timestamp() + make_interval(secs => %s) "
    "WHERE sid = %s AND (lease_until IS NULL OR lease_until < clock_timestamp()) RETURNING sid")
_RENEW = ("UPDATE sessions SET lease_until = clock_timestamp() + make_interval(secs => %s) "
          "WHERE sid = %s AND epoch = %s RETURNING sid")
_LEASE_FREE = "(s.lease_until IS NULL OR s.lease_until < clock_timestamp())"
_RELEASE = "UPDATE sessions SET lease_until = NULL WHERE sid = %s AND epoch = %s"
_NOTIFY = "SELECT pg_notify(%s, %s)"


def _payload(key: SessionKey, seq: int | None) -> str:
    return json.dumps([key.agent, key.session, seq])


def _notify(c: psycopg.Connection[Any], key: SessionKey, seq: int | None) -> None:
    c.execute(_NOTIFY, (CHANNEL, _payload(key, seq)))


def _idle(c: psycopg.Connection[Any]) -> bool:
    return c.info.transaction_status == pq.TransactionStatus.IDLE


def _rollback(c: psycopg.Connection[Any]) -> None:
    if not c.closed and not c.broken and not _idle(c):
        c.execute("ROLLBACK")


def _in_transaction(c: psycopg.Connection[Any], fn: Callable[[psycopg.Connection[Any]], T]) -> T:
    c.execute("BEGIN")
    try:
        out = fn(c)
        c.execute("COMMIT")
    except BaseException:
        _rollback(c)
        raise
    return out


class _Lane:
    """One connection and the thread it is used on."""

    def __init__(self, name: str, connect: Callable[[], psycopg.Connection[Any]],
                 pids: set[int]) -> None:
        self.worker = Worker(name)
        self._connect = connect
        self._pids = pids
        self.conn: psycopg.Connection[Any] | None = None

    def connection(self) -> psycopg.Connection[Any]:
        """The lane's connection (on its thread), reconnected if it was lost."""
        if self.conn is None or self.conn.closed or self.conn.broken:
            if self.conn is not None:
                self._pids.discard(self.conn.info.backend_pid)
            self.conn = self._connect()
            self._pids.add(self.conn.info.backend_pid)
        return self.conn

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        return await self.worker.run(lambda: fn(self.connection()))

    async def stop(self) -> None:
        conn = self.conn
        if conn is not None:
            await self.worker.run(conn.close)
        self.worker.stop()


class _PgTransaction(BufferedTransaction):
    """One step's transaction: it takes a pool connection at its first local tool or at its
    commit and keeps it until the commit ends."""

    lease: _PgLease

    def __init__(self, lease: _PgLease) -> None:
        super().__init__(lease)
        self._store = lease.store
        self._lane: _Lane | None = None
        self._begun = False
        self._began_on: psycopg.Connection[Any] | None = None

    def _begin(self, c: psycopg.Connection[Any]) -> None:
        """Begin on ``c``, or check the transaction begun is still ``c``'s: a connection lost
        (and replaced) mid-step took the step's earlier writes with it."""
        if not self._begun:
            c.execute("BEGIN")
            self._begun, self._began_on = True, c
        elif c is not self._began_on:
            self._begun = False
            raise StoreError("the step's PostgreSQL connection was lost mid-step; nothing of "
                             "the step was committed")

    def unwrap(self) -> psycopg.Connection[Any]:
        """The step's connection, inside its transaction (for local tools)."""
        if self._lane is None or self._lane.conn is None:
            raise StoreError("the step's connection is only available inside a local tool")
        return self._lane.conn

    async def __aenter__(self) -> _PgTransaction:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        store = self._store
        try:
            if exc_type is None:
                if self._lane is None:
                    self._lane = await store._take_lane()
                await store._guard(self._lane.run(self._commit))
                self.committed()
                store._feed.published(self.lease.key, self.writes.events)
            elif self._lane is not None and self._begun:
                with contextlib.suppress(StoreError):  # the error that got us here matters
                    await store._guard(self._lane.run(self._rollback))
        finally:
            if self._lane is not None:
                store._give_lane(self._lane)
                self._lane = None

    def _commit(self, c: psycopg.Connection[Any]) -> None:
        lease = self.lease
        try:
            self._begin(c)
            if not _RULES.holds(c, lease.sid, lease.epoch):
                raise LeaseLostError(str(lease.key), lease.epoch)
            _RULES.flush(c, lease.sid, lease.generation, self.first_index(), self.writes)
            if self.writes.events:
                _notify(c, lease.key, self.writes.events[-1].seq)
            c.execute("COMMIT")
        except BaseException:
            self._rollback(c)
            raise
        self._begun = False

    def _rollback(self, c: psycopg.Connection[Any]) -> None:
        _rollback(c)
        self._begun = False

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        if self._lane is None:
            self._lane = await self._store._take_lane()
        # Not guarded: what the tool raises (a psycopg error of its own SQL too) is its error.
        return await self._lane.run(lambda c: self._run_local(c, fn))

    def _run_local(self, c: psycopg.Connection[Any], fn: Callable[[Any], T]) -> T:
        self._begin(c)
        c.execute("SAVEPOINT local_tool")
        try:
            out = fn(c)
        except BaseException:
            if c.broken:
                pass  # the transaction is gone: the step's commit is refused (see _begin)
            elif _idle(c):
                self._begun = False
            else:
                c.execute("ROLLBACK TO SAVEPOINT local_tool")
                c.execute("RELEASE SAVEPOINT local_tool")
            raise
        if _idle(c):
            self._begun = False
            raise FatalToolError(
                "a local tool ended the store's transaction (COMMIT/ROLLBACK on the raw "
                "handle); write through ctx.store.unwrap() without managing transactions"
            )
        c.execute("RELEASE SAVEPOINT local_tool")
        return out


class _PgLease(LeaseBase):
    def __init__(self, store: PostgresStore, key: SessionKey, sid: int, epoch: int,
                 generation: int, last_seq: int, count: int) -> None:
        super().__init__(key, epoch, generation, last_seq, count)
        self.store = store
        self.sid = sid
        self.lost = False
        """Set when a heartbeat found the lease taken over (commits are refused anyway)."""
        self._beat: asyncio.Task[None] | None = asyncio.ensure_future(self._heartbeat())
        store._held.add(self)

    def transaction(self) -> _PgTransaction:
        return _PgTransaction(self)

    async def cancel_requested(self, turn_id: str) -> str | None:
        sid = self.sid
        return await self.store._read(lambda c: _RULES.cancel_of(c, sid, turn_id))

    async def _heartbeat(self) -> None:
        store = self.store
        every = store.lease_ttl / 3
        while store._leases_lane is not None:
            await asyncio.sleep(every)
            try:
                row = await store._guard(store._leases.run(
                    lambda c: c.execute(_RENEW, (store.lease_ttl, self.sid, self.epoch))
                    .fetchone()))
            except StoreError as e:
                log.warning("heartbeat of %s failed (retrying): %s", self.key, e)
                continue
            if row is None:
                self.lost = True
                return

    async def stop_heartbeat(self) -> bool:
        """Stop renewing the lease (it then expires); whether it was still beating."""
        self.store._held.discard(self)
        beat, self._beat = self._beat, None
        if beat is None:
            return False
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
        return True

    async def release(self) -> None:
        if not await self.stop_heartbeat() or self.lost:
            return
        store, sid, epoch = self.store, self.sid, self.epoch
        try:
            await store._guard(store._leases.run(lambda c: c.execute(_RELEASE, (sid, epoch))))
        except StoreError as e:  # the lease expires on its own
            log.warning("release of %s failed (it expires in %ss): %s", self.key,
                        store.lease_ttl, e)


class PostgresStore(SqlReads, FeedStore):
    """A session store in a PostgreSQL database, shared by many worker processes.

    Args:
        dsn: a libpq connection string or URL (``postgresql://user@host:5432/db``).
        lease_ttl: seconds a lease outlives its holder's last heartbeat; a crashed or paused
            worker's sessions are taken over this long after it stopped.
        pool_size: connections for steps and reads (besides one for leases and one for
            ``unwrap()``, and one listening while anyone subscribes).
        poll_interval: seconds between re-reads while anyone subscribes, in case a
            notification was lost.
        connect_timeout: seconds to wait for a connection.
    """

    def __init__(self, dsn: str, *, lease_ttl: float = 15.0, pool_size: int = 4,
                 poll_interval: float = 1.0, connect_timeout: float = 10.0) -> None:
        if lease_ttl <= 0 or poll_interval <= 0:
            raise ValueError("lease_ttl and poll_interval must be positive")
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self.dsn = dsn
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._lanes: list[_Lane] = []
        self._free: asyncio.Queue[_Lane] = asyncio.Queue()
        self._leases_lane: _Lane | None = None
        self._inspect: psycopg.Connection[Any] | None = None
        self._feed = Feed(self.events_after, self.newest_seq, on_active=self._start_listener)
        self._listener: asyncio.Task[None] | None = None
        self._held: set[_PgLease] = set()
        self._own_pids: set[int] = set()
        """Server processes of this store's connections: their notifications are of commits
        this store published itself, so the listener skips them."""

    def __repr__(self) -> str:
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.Error:
            return "PostgresStore(<an unparsable DSN>)"
        params.pop("password", None)  # never in a message or a log
        return f"PostgresStore({psycopg.conninfo.make_conninfo('', **params)!r})"

    # -- opening ---------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.dsn, autocommit=True,
                                   connect_timeout=max(1, round(self._connect_timeout)))
        except psycopg.Error as e:
            raise StoreError(f"cannot connect to PostgreSQL ({self!r}): {e}") from e

    async def open(self) -> None:
        if self._leases_lane is not None:
            return
        leases = _Lane("durable-turns-pg-leases", self._connect, self._own_pids)
        lanes: list[_Lane] = []
        try:
            await self._guard(leases.run(self._migrate))
            self._inspect = await leases.worker.run(self._connect)
            for i in range(self._pool_size):
                lane = _Lane(f"durable-turns-pg-{i}", self._connect, self._own_pids)
                lanes.append(lane)
                await lane.worker.run(lane.connection)
        except BaseException:
            for lane in [leases, *lanes]:
                with contextlib.suppress(Exception):
                    await lane.stop()
            raise
        self._leases_lane, self._lanes = leases, lanes
        self._free = asyncio.Queue()
        for lane in lanes:
            self._free.put_nowait(lane)

    @staticmethod
    def _migrate(c: psycopg.Connection[Any]) -> None:
        def run(c: psycopg.Connection[Any]) -> None:
            c.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            c.execute("CREATE TABLE IF NOT EXISTS durable_turns_schema (version INTEGER NOT NULL)")
            row = c.execute("SELECT version FROM durable_turns_schema").fetchone()
            version = 0 if row is None else int(row[0])
            if version > len(MIGRATIONS):
                raise StoreError(
                    f"the database has durable_turns schema version {version}, newer than "
                    f"this durable_turns knows ({len(MIGRATIONS)}); upgrade durable_turns")
            for sql in MIGRATIONS[version:]:
                c.execute(sql.encode())  # several statements: no parameters
            if row is None:
                c.execute("INSERT INTO durable_turns_schema VALUES (%s)", (len(MIGRATIONS),))
            else:
                c.execute("UPDATE durable_turns_schema SET version = %s", (len(MIGRATIONS),))

        _in_transaction(c, run)

    async def close(self) -> None:
        self._feed.close()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        for lease in list(self._held):  # unreleased leases expire after lease_ttl
            await lease.stop_heartbeat()
        leases, lanes, inspect = self._leases_lane, self._lanes, self._inspect
        self._leases_lane, self._lanes, self._inspect = None, [], None
        if leases is None:
            return
        for _ in lanes:
            await self._free.get()  # wait for the steps and reads in flight
        for lane in [*lanes, leases]:
            await lane.stop()
        if inspect is not None:
            inspect.close()

    def unwrap(self) -> psycopg.Connection[Any]:
        """A connection (autocommit) for set-up and inspection outside any step."""
        if self._inspect is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        return self._inspect

    # -- connections -----------------------------------------------------------------------

    @property
    def _leases(self) -> _Lane:
        if self._leases_lane is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        return self._leases_lane

    async def _take_lane(self) -> _Lane:
        if self._leases_lane is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        return await self._free.get()

    def _give_lane(self, lane: _Lane) -> None:
        self._free.put_nowait(lane)

    @contextlib.asynccontextmanager
    async def _lane(self) -> AsyncIterator[_Lane]:
        lane = await self._take_lane()
        try:
            yield lane
        finally:
            self._give_lane(lane)

    async def _guard(self, job: Any) -> Any:
        """Await a job, turning a database failure into StoreError (what the job raises of
        its own, LeaseLostError for one, propagates as it is)."""
        try:
            return await job
        except psycopg.Error as e:
            raise StoreError(f"PostgreSQL failed ({self!r}): {e}") from e

    _rules = _RULES

    async def _query(self, fn: Callable[[Any], Any]) -> Any:
        return await self._read(fn)

    async def _read(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        async with self._lane() as lane:
            out: T = await self._guard(lane.run(fn))
            return out

    async def _write_tx(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        async with self._lane() as lane:
            out: T = await self._guard(lane.run(lambda c: _in_transaction(c, fn)))
            return out

    # -- leases and writes -----------------------------------------------------------------

    def _try_claim(self, c: psycopg.Connection[Any],
                   key: SessionKey) -> tuple[int, int, int, int, int] | None:
        sid = _RULES.sid(c, key, create=True)
        if c.execute(_TRY_LEASE, (self.lease_ttl, sid)).fetchone() is None:
            return None
        return _RULES.claim(c, key)

    async def claim(self, key: SessionKey, *, timeout: float | None = None) -> _PgLease:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while True:
            got = await self._guard(self._leases.run(
                lambda c: _in_transaction(c, lambda c: self._try_claim(c, key))))
            if got is not None:
                sid, epoch, gen, seq, count = got
                return _PgLease(self, key, sid, epoch, gen, seq, count)
            if deadline is not None and time.monotonic() >= deadline:
                raise LeaseTimeoutError(str(key), timeout)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)

    async def enqueue_turn(
        self,
        key: SessionKey,
        turn_id: str,
        opening: Message,
        event: dict[str, Any] | None = None,
        policy: dict[str, Any] | None = None,
        *,
        kind: EntryKind = "turn",
        supersede: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> tuple[TurnRecord, bool]:
        def enqueue(c: psycopg.Connection[Any]) -> tuple[TurnRecord, bool]:
            out = _RULES.enqueue(c, key, turn_id, opening, event, policy, kind, supersede, data)
            if out[1]:
                _notify(c, key, None)
            return out

        return await self._write_tx(enqueue)

    async def request_cancel(
        self, key: SessionKey, turn_id: str | None, reason: str
    ) -> list[str]:
        def cancel(c: psycopg.Connection[Any]) -> list[str]:
            ids = _RULES.request_cancel(c, key, turn_id, reason)
            if ids:
                _notify(c, key, None)
            return ids

        ids = await self._write_tx(cancel)
        if ids:
            self._feed.changed(key)
        return ids

    async def set_turn_data(self, key: SessionKey, turn_id: str, name: str, value: Any, *,
                            only_new: bool = False) -> Any:
        return await self._write_tx(
            lambda c: _RULES.set_turn_data(c, key, turn_id, name, value, only_new))

    # -- reads -----------------------------------------------------------------------------

    async def find_claimable(self, limit: int = 100) -> list[SessionKey]:
        return await self._read(lambda c: _RULES.find_sessions(
            c, "unfinished", None, where=_LEASE_FREE, limit=limit))

    # -- the event feed (subscribe and watch come from FeedStore) ---------------------------

    def _start_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        """Tell the feed of other connections' commits, while anyone listens."""
        pause = 0.05
        while self._feed.active and self._leases_lane is not None:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True,
                    connect_timeout=max(1, round(self._connect_timeout)))
            except psycopg.Error as e:
                log.warning("cannot listen for notifications (retrying): %s", e)
                self._feed.changed_any()  # meanwhile, the re-poll
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.poll_interval)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    pause = 0.05
                    # Listening now: what committed before it is read once, by everyone.
                    self._feed.changed_any()
                    while self._feed.active:
                        async for n in conn.notifies(timeout=self.poll_interval):
                            if n.pid not in self._own_pids:  # else published already
                                self._notified(n.payload)
                        self._feed.changed_any()  # the periodic re-read
            except psycopg.Error as e:
                log.warning("lost the notification connection (reconnecting): %s", e)

    def _notified(self, payload: str) -> None:
        try:
            agent, session, _seq = json.loads(payload)
        except (ValueError, TypeError):
            return
        self._feed.changed(SessionKey(agent, session))
