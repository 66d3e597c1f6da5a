"""The shared store: PostgreSQL (psycopg 3), for many workers on many machines.

- Every statement is a :class:`~durable_turns.stores._sql.SqlRules` rule (``%s`` placeholders,
  ``lock_rows``: each write locks its session's row first). This module brings the
  connections, the transactions, the schema, the lease and the feed's wake-up.
- Connections come from a ``psycopg_pool.ConnectionPool`` (sync psycopg connections; the pool
  replaces a connection found broken and sets each new one up). A job that uses one runs on
  one of the store's threads (a ``Worker``), so the event loop never blocks and a local tool
  gets the step's connection (``ctx.store.unwrap()``) inside the step's transaction: its
  writes commit with the step, exactly once. A step holds a pooled connection from its first
  local tool (or its commit) until its commit ends; reads take one for a statement. Leases
  (claim, heartbeat, release) use a pool of their own, so a pool busy with long local tools
  never starves a heartbeat.
- Step connections have ``idle_in_transaction_session_timeout`` (``idle_timeout``, by
  default the lease TTL): a worker paused inside a local tool has its transaction ended by
  the server, so its row locks in the application's tables never block the worker that
  takes the session over (and its step can never commit: its connection is gone).
- The lease is a row lease: ``sessions.lease_until`` (database time, so the workers' clocks
  never matter). ``claim()`` takes a free or expired lease, whoever held it, and bumps
  ``sessions.epoch``; ``claim_ready()`` does the same for many sessions in one statement
  (``FOR UPDATE SKIP LOCKED``: workers claiming together never wait on each other and never
  get the same session). A heartbeat renews a lease every ``lease_ttl / 3`` seconds while
  held; a crashed or paused holder loses it ``lease_ttl`` seconds after its last heartbeat.
  Every step commit locks the session row and checks the epoch in its own transaction
  (``SELECT epoch ... FOR UPDATE``): a holder that was taken over gets
  :class:`~durable_turns.errors.LeaseLostError` and nothing of its step, local tools'
  writes included, is committed.
- The feed: every transaction that writes events, enqueues or cancels sends one
  ``pg_notify('durable_turns', payload)``; the payload is JSON,
  ``{"from": store, "changes": [[agent, session, seq], ...]}`` (``seq`` the newest event
  committed, ``null`` for a change of the chain: a new turn, a resume, a cancel), never any
  content. One listening connection per store, open while anyone subscribes or watches,
  skips its own store's notifications (published already), coalesces what arrives together
  (one re-read per session, none when its subscribers already have that seq) and tells the
  feed;
  it also re-reads every ``poll_interval`` seconds and after a reconnect, so a lost
  notification is only a delay. Workers wake only on chain changes.
- The schema is migrated by the store, under an advisory lock, so many processes may open a
  new database at once. ``MIGRATIONS`` is append-only (a migration that changes a table's
  shape moves its rows in the same transaction, as version 3 does); the table
  ``durable_turns_schema`` holds the version. Tables live in the connection's ``search_path``
  schema (put ``options=-csearch_path=myschema`` in the DSN to use another one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import pq
from psycopg_pool import ConnectionPool

from ..errors import FatalToolError, LeaseLostError, LeaseTimeoutError, StoreError
from ..records import NewEntry, SessionKey, TurnRecord
from ._base import BufferedTransaction, LeaseBase
from ._feed import Feed, FeedStore
from ._log import LEGACY_TO_LOG, LOOKUP_INDEX
from ._sql import LAST_ROW, NEEDS_DRIVING, SqlReads, SqlRules, counters
from ._thread import Worker

T = TypeVar("T")
log = logging.getLogger("durable_turns")


class _Default:
    """The type of ``idle_timeout``'s default (the lease TTL)."""


_DEFAULT = _Default()

# Append-only, rows moved never lost: index + 1 = schema version (the row of
# durable_turns_schema). A database made by an older durable_turns is brought up to date
# by running the ones it lacks, in one transaction.
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
    # 2: who holds a lease (an operator's question: "which worker has this session?"), and
    # the runnable turns indexed for the workers' SKIP LOCKED claim.
    """
    ALTER TABLE sessions ADD COLUMN lease_owner TEXT;
    CREATE INDEX turns_runnable ON turns (sid) WHERE status IN ('queued', 'running');
    """,
    # 3: one append-only row per step (stores/_log.py); the rows of the three tables before
    # it are moved into it, in the migration's transaction.
    """
    CREATE TABLE log (
        sid BIGINT NOT NULL, seq BIGINT NOT NULL, sub INTEGER NOT NULL,
        gen INTEGER NOT NULL, n INTEGER NOT NULL, turn_id TEXT,
        body TEXT, step TEXT, memo TEXT, events TEXT,
        PRIMARY KEY (sid, seq, sub)
    );
    """ + LOOKUP_INDEX + ";" + ";".join(LEGACY_TO_LOG),
    # 4: the log's messages again, many per row, read instead of the log's rows they copy
    # (stores/_sql.py); filled from the next commit that moves a session's chain.
    """
    CREATE TABLE log_transcript (
        sid BIGINT NOT NULL, gen INTEGER NOT NULL, n INTEGER NOT NULL, seq BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (sid, gen, n)
    );
    """,
]

CHANNEL = "durable_turns"
"""The NOTIFY channel; a payload is
``{"from": origin, "changes": [[agent, session, seq], ...]}``."""
LISTENER_NAME = "durable_turns listener"
"""The ``application_name`` of a store's listening connection (in ``pg_stat_activity``)."""
_MIGRATION_LOCK = 0x44545552  # "DTUR": the advisory lock key around migrations
_NOTIFY_LIMIT = 7900  # PostgreSQL refuses payloads of 8000 bytes or more
_RULES = SqlRules("%s", lock_rows=True)
_TRY_LEASE = (
    "UPDATE sessions SET lease_until = clock_timestamp() + make_interval(secs => %s), "
    "lease_owner = %s "
    "WHERE sid = %s AND (lease_until IS NULL OR lease_until < clock_timestamp()) RETURNING sid")
_RENEW = ("UPDATE sessions SET lease_until = clock_timestamp() + make_interval(secs => %s) "
          "WHERE sid = %s AND epoch = %s RETURNING sid")
_RELEASE = ("UPDATE sessions SET lease_until = NULL, lease_owner = NULL "
            "WHERE sid = %s AND epoch = %s")
# Sessions of these agents with a queued or running turn and a free or expired lease, claimed
# in one statement. SKIP LOCKED: a row another worker is claiming (or a step is committing)
# is passed over, never waited for; READ COMMITTED re-checks the lease condition on the row
# it locks, so two workers never both get a session.
_CLAIM_READY = f"""
WITH ready AS (
    SELECT s.sid FROM sessions s
    WHERE s.agent = ANY(%(agents)s)
      AND (s.lease_until IS NULL OR s.lease_until < clock_timestamp())
      AND EXISTS (SELECT 1 FROM turns t WHERE t.sid = s.sid AND {NEEDS_DRIVING})
    ORDER BY s.sid
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
), claimed AS (
    UPDATE sessions s
    SET epoch = s.epoch + 1, lease_owner = %(owner)s,
        lease_until = clock_timestamp() + make_interval(secs => %(ttl)s)
    FROM ready WHERE s.sid = ready.sid
    RETURNING s.sid, s.agent, s.session, s.epoch, s.generation
)
SELECT c.sid, c.agent, c.session, c.epoch, c.generation, l.seq, l.gen, l.n
FROM claimed c LEFT JOIN LATERAL ({LAST_ROW.format("c.sid")}) l ON true ORDER BY c.sid
"""
_LEASE_FREE = "(s.lease_until IS NULL OR s.lease_until < clock_timestamp())"
_NOTIFY = "SELECT pg_notify(%s, %s)"


Changes = list[tuple[SessionKey, int | None]]


def _payload(origin: str, changes: Changes) -> str:
    """A notification's payload: ``{"from": origin, "changes": [[agent, session, seq], ...]}``;
    without ``changes`` (anything may have changed) when they would not fit PostgreSQL's
    payload limit."""
    text = json.dumps({"from": origin,
                       "changes": [[k.agent, k.session, seq] for k, seq in changes]})
    return text if len(text.encode()) < _NOTIFY_LIMIT else json.dumps({"from": origin})


def _parse_payload(text: str) -> tuple[str | None, Changes | None]:
    """Who sent a payload and the changes it names; ``None`` changes for "anything may have
    changed" (none named, or a payload this version cannot read)."""
    try:
        data = json.loads(text)
        if isinstance(data, list):  # [agent, session, seq], as the first version sent it
            data = {"changes": [data]}
        origin = data.get("from")
        out = [(SessionKey(str(a), str(s)), None if q is None else int(q))
               for a, s, q in data.get("changes") or ()]
    except (ValueError, TypeError, AttributeError):
        return None, None
    return (None if origin is None else str(origin)), (out or None)


def _notify(c: psycopg.Connection[Any], origin: str, key: SessionKey, seq: int | None) -> None:
    c.execute(_NOTIFY, (CHANNEL, _payload(origin, [(key, seq)])))


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
    """One of the store's threads, with the pooled connection it holds (while it holds one).

    Every method but :meth:`run` runs on the lane's thread.
    """

    def __init__(self, name: str, pool: ConnectionPool[psycopg.Connection[Any]],
                 timeout: float) -> None:
        self.worker = Worker(name)
        self._pool = pool
        self._timeout = timeout
        self.conn: psycopg.Connection[Any] | None = None

    def connection(self) -> psycopg.Connection[Any]:
        if self.conn is None:
            self.conn = self._pool.getconn(self._timeout)
        return self.conn

    def put_back(self) -> None:
        """Return the connection to the pool (a broken one is replaced by the pool)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            self._pool.putconn(conn)

    def once(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``fn`` on a pooled connection, given back at once."""
        try:
            return fn(self.connection())
        finally:
            self.put_back()

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        return await self.worker.run(lambda: fn(self.connection()))


class _PgTransaction(BufferedTransaction):
    """One step's transaction: it takes a pooled connection at its first local tool or at its
    commit and keeps it until the commit ends."""

    lease: _PgLease

    def __init__(self, lease: _PgLease) -> None:
        super().__init__(lease)
        self._store = lease.store
        self._lane: _Lane | None = None
        self._begun = False

    def _begin(self, c: psycopg.Connection[Any]) -> None:
        """Begin on ``c``, or check the transaction begun is still alive: a connection lost
        mid-step (its backend killed, the idle timeout) took the step's earlier writes with
        it."""
        if not self._begun:
            c.execute("BEGIN")
            self._begun = True
        elif c.broken or c.closed:
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
        lane = self._lane
        try:
            if exc_type is None:
                if lane is None:
                    lane = self._lane = await store._take_lane()
                await store._guard(lane.worker.run(lambda: self._commit_and_put_back(lane)))
                self.committed()
                store._feed.published(self.lease.key, self.writes.events)
            elif lane is not None:
                with contextlib.suppress(StoreError):  # the error that got us here matters
                    await store._guard(lane.worker.run(lambda: self._rollback_and_put_back(lane)))
        finally:
            if lane is not None:
                if lane.conn is not None:  # a job failed before giving it back
                    await lane.worker.run(lane.put_back)
                store._give_lane(lane)
                self._lane = None

    def _commit_and_put_back(self, lane: _Lane) -> None:
        try:
            self._commit(lane.connection())
        finally:
            lane.put_back()

    def _rollback_and_put_back(self, lane: _Lane) -> None:
        try:
            if lane.conn is not None and self._begun:
                _rollback(lane.conn)
        finally:
            self._begun = False
            lane.put_back()

    def _commit(self, c: psycopg.Connection[Any]) -> None:
        lease = self.lease
        try:
            self._begin(c)
            if not _RULES.holds(c, lease.sid, lease.epoch):
                raise LeaseLostError(str(lease.key), lease.epoch)
            _RULES.flush(c, lease.sid, lease.generation, self.first_index(), self.writes,
                         seq=lease.last_seq)
            if self.writes.events:
                _notify(c, self._store.origin, lease.key, self.writes.events[-1].seq)
            c.execute("COMMIT")
        except BaseException:
            _rollback(c)
            self._begun = False
            raise
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
                row = await store._guard(store._leases.worker.run(lambda: store._leases.once(
                    lambda c: c.execute(_RENEW, (store.lease_ttl, self.sid, self.epoch))
                    .fetchone())))
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
            await store._guard(store._leases.worker.run(lambda: store._leases.once(
                lambda c: c.execute(_RELEASE, (sid, epoch)))))
        except StoreError as e:  # the lease expires on its own
            log.warning("release of %s failed (it expires in %ss): %s", self.key,
                        store.lease_ttl, e)


class PostgresStore(SqlReads, FeedStore):
    """A session store in a PostgreSQL database, shared by many worker processes.

    Args:
        dsn: a libpq connection string or URL (``postgresql://user@host:5432/db``).
        lease_ttl: seconds a lease outlives its holder's last heartbeat; a crashed or paused
            worker's sessions are taken over this long after it stopped.
        pool_size: pooled connections for steps and reads (besides one for leases and one
            for ``unwrap()``, and one listening while anyone subscribes).
        poll_interval: seconds between re-reads while anyone subscribes, in case a
            notification was lost.
        connect_timeout: seconds to wait for a connection.
        idle_timeout: seconds a step's transaction may sit idle (a local tool between two
            statements) before the server ends it, releasing its locks; the step is then
            abandoned and driven again. Default: ``lease_ttl`` (by then a paused worker's
            session is another's anyway). ``None``: never.
    """

    def __init__(self, dsn: str, *, lease_ttl: float = 15.0, pool_size: int = 4,
                 poll_interval: float = 1.0, connect_timeout: float = 10.0,
                 idle_timeout: float | _Default | None = _DEFAULT) -> None:
        if lease_ttl <= 0 or poll_interval <= 0:
            raise ValueError("lease_ttl and poll_interval must be positive")
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if isinstance(idle_timeout, _Default):
            idle_timeout = lease_ttl
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive (or None)")
        self.dsn = dsn
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.idle_timeout = idle_timeout
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        """What ``sessions.lease_owner`` says of this store's leases (host:pid)."""
        self.origin = uuid.uuid4().hex[:16]
        """This store's name in its notifications (``from``): its listener skips its own,
        whose events it published already."""
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._pools: list[ConnectionPool[psycopg.Connection[Any]]] = []
        self._lanes: list[_Lane] = []
        self._free: asyncio.Queue[_Lane] = asyncio.Queue()
        self._leases_lane: _Lane | None = None
        self._inspect: psycopg.Connection[Any] | None = None
        self._feed = Feed(self.events_after, self.newest_seq, on_active=self._start_listener)
        self._listener: asyncio.Task[None] | None = None
        self._held: set[_PgLease] = set()

    def __repr__(self) -> str:
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.Error:
            return "PostgresStore(<an unparsable DSN>)"
        params.pop("password", None)  # never in a message or a log
        return f"PostgresStore({psycopg.conninfo.make_conninfo('', **params)!r})"

    # -- opening ---------------------------------------------------------------------------

    def _connect_args(self) -> dict[str, Any]:
        return {"autocommit": True, "connect_timeout": max(1, round(self._connect_timeout))}

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.dsn, **self._connect_args())
        except psycopg.Error as e:
            raise StoreError(f"cannot connect to PostgreSQL ({self!r}): {e}") from e

    def _configure(self, c: psycopg.Connection[Any]) -> None:
        """Set up a new pooled connection (on a pool thread)."""
        assert self.idle_timeout is not None
        c.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                  (f"{max(1, round(self.idle_timeout * 1000))}ms",))

    def _pool(self, name: str, size: int) -> ConnectionPool[psycopg.Connection[Any]]:
        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self.dsn, kwargs=self._connect_args(), min_size=size, max_size=size, open=False,
            configure=self._configure if self.idle_timeout is not None else None, name=name,
            timeout=self._connect_timeout,
            reconnect_timeout=max(self._connect_timeout, 60.0), num_workers=1)
        self._pools.append(pool)
        return pool

    async def open(self) -> None:
        if self._leases_lane is not None:
            return
        leases_pool = self._pool("durable-turns-leases", 1)
        steps_pool = self._pool("durable-turns-steps", self._pool_size)
        leases = _Lane("durable-turns-pg-leases", leases_pool, self._connect_timeout)
        lanes: list[_Lane] = []
        try:
            # A plain connection first: a server that is down or refuses us is said at once,
            # with its reason (a pool would retry quietly until its timeout).
            self._inspect = await leases.worker.run(self._connect)
            await self._guard(leases.worker.run(lambda: self._open_pools(leases)))
            lanes = [_Lane(f"durable-turns-pg-{i}", steps_pool, self._connect_timeout)
                     for i in range(self._pool_size)]
        except BaseException:
            inspect, self._inspect = self._inspect, None
            if inspect is not None:
                inspect.close()
            await self._stop([leases])
            raise
        self._leases_lane, self._lanes = leases, lanes
        self._free = asyncio.Queue()
        for lane in lanes:
            self._free.put_nowait(lane)
        if self._feed.active:
            # Someone subscribed before the open: the listener their subscription started
            # found the store closed and ended, and the feed starts one only when it gets
            # its first listener.
            self._start_listener()

    def _open_pools(self, leases: _Lane) -> None:
        try:
            for pool in self._pools:
                pool.open(wait=True, timeout=self._connect_timeout)
        except psycopg_pool.PoolTimeout as e:
            raise StoreError(f"cannot open a pool of connections to PostgreSQL ({self!r}) "
                             f"in {self._connect_timeout}s") from e
        leases.once(lambda c: _in_transaction(c, self._migrate))

    @staticmethod
    def _migrate(c: psycopg.Connection[Any]) -> None:
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
        elif version < len(MIGRATIONS):
            c.execute("UPDATE durable_turns_schema SET version = %s", (len(MIGRATIONS),))

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
        if inspect is not None:
            await leases.worker.run(inspect.close)
        await self._stop([*lanes, leases])

    async def _stop(self, lanes: list[_Lane]) -> None:
        pools, self._pools = self._pools, []
        closer, timeout = lanes[-1].worker, self._connect_timeout

        def close_pools() -> None:
            for pool in pools:
                with contextlib.suppress(Exception):
                    pool.close(timeout=timeout)

        await closer.run(close_pools)
        for lane in lanes:
            lane.worker.stop()

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
        except psycopg_pool.PoolTimeout as e:
            raise StoreError(f"no PostgreSQL connection came free in "
                             f"{self._connect_timeout}s ({self!r}): {e}") from e

    _rules = _RULES

    async def _query(self, fn: Callable[[Any], Any]) -> Any:
        return await self._read(fn)

    async def _read(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        async with self._lane() as lane:
            try:
                out: T = await lane.worker.run(lambda: lane.once(fn))
            except psycopg.OperationalError:
                # A pooled connection whose backend went away since its last use (a server
                # restart, pg_terminate_backend): the pool replaces it; read once more.
                out = await self._guard(lane.worker.run(lambda: lane.once(fn)))
            except psycopg.Error as e:
                raise StoreError(f"PostgreSQL failed ({self!r}): {e}") from e
            return out

    async def _write_tx(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        async with self._lane() as lane:
            out: T = await self._guard(lane.worker.run(
                lambda: lane.once(lambda c: _in_transaction(c, fn))))
            return out

    # -- leases and writes -----------------------------------------------------------------

    def _try_claim(self, c: psycopg.Connection[Any],
                   key: SessionKey) -> tuple[int, int, int, int, int] | None:
        sid = _RULES.sid(c, key, create=True)
        if c.execute(_TRY_LEASE, (self.lease_ttl, self.owner, sid)).fetchone() is None:
            return None
        return _RULES.claim(c, key)

    async def claim(self, key: SessionKey, *, timeout: float | None = None) -> _PgLease:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        leases = self._leases
        while True:
            got = await self._guard(leases.worker.run(lambda: leases.once(
                lambda c: _in_transaction(c, lambda c: self._try_claim(c, key)))))
            if got is not None:
                sid, epoch, gen, seq, count = got
                return _PgLease(self, key, sid, epoch, gen, seq, count)
            if deadline is not None and time.monotonic() >= deadline:
                raise LeaseTimeoutError(str(key), timeout)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)

    async def claim_ready(self, agents: Collection[str], limit: int = 100) -> list[_PgLease]:
        if limit <= 0 or not agents:
            return []
        params = {"agents": list(agents), "limit": limit, "owner": self.owner,
                  "ttl": self.lease_ttl}
        leases = self._leases
        rows = await self._guard(leases.worker.run(lambda: leases.once(
            lambda c: c.execute(_CLAIM_READY, params).fetchall())))
        return [_PgLease(self, SessionKey(agent, session), sid, epoch, gen,
                         *counters(None if seq is None else (seq, last_gen, n), gen))
                for sid, agent, session, epoch, gen, seq, last_gen, n in rows]

    async def enqueue(self, key: SessionKey, entry: NewEntry) -> tuple[TurnRecord, bool]:
        def enqueue(c: psycopg.Connection[Any]) -> tuple[TurnRecord, bool]:
            out = _RULES.enqueue(c, key, entry)
            if out[1]:
                _notify(c, self.origin, key, None)
            return out

        return await self._write_tx(enqueue)

    async def request_cancel(
        self, key: SessionKey, turn_id: str | None, reason: str
    ) -> list[str]:
        def cancel(c: psycopg.Connection[Any]) -> list[str]:
            ids = _RULES.request_cancel(c, key, turn_id, reason)
            if ids:
                _notify(c, self.origin, key, None)
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
                    self.dsn, **self._connect_args(), application_name=LISTENER_NAME)
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
                    # Listening now: what committed before it (or while the connection was
                    # down) is read once, by everyone.
                    self._feed.changed_any()
                    while self._feed.active:
                        batch = _Batch(self._feed, self.origin)
                        async for n in conn.notifies(timeout=self.poll_interval):
                            batch.add(n.payload)
                        batch.flush()
                        self._feed.changed_any()  # the periodic re-read
            except psycopg.Error as e:
                log.warning("lost the notification connection (reconnecting): %s", e)


class _Batch:
    """Notifications that arrive together, told to the feed once per session: the listener
    adds each as it comes and the feed hears of them when the event loop next runs (after
    the whole burst psycopg read), with the newest seq per session."""

    def __init__(self, feed: Feed, origin: str) -> None:
        self._feed = feed
        self._origin = origin
        self._changes: dict[SessionKey, int | None] = {}
        self._anything = False
        self._scheduled = False

    def add(self, text: str) -> None:
        origin, changes = _parse_payload(text)
        if origin == self._origin:
            return  # this store's own commit: published already
        if changes is None:
            self._anything = True
        else:
            for key, seq in changes:
                if key in self._changes:
                    old = self._changes[key]
                    # A chain change (None) outranks events: workers must hear of it.
                    seq = None if old is None or seq is None else max(old, seq)
                self._changes[key] = seq
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        changes, self._changes = self._changes, {}
        anything, self._anything = self._anything, False
        if anything:
            self._feed.changed_any()
            return
        for key, seq in changes.items():
            self._feed.changed(key, seq)
