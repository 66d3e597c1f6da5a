"""The shared store: PostgreSQL (psycopg 3), for many workers on many machines; a dialect of
the SQL kit (``stores.sql``), which writes its statements, its write path and its schema.

- Statements are not serialised: every write locks its session's row first (``lock_rows``:
  ``FOR UPDATE``), so the chain rules and the fencing check see no concurrent writer.
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
- The lease is a row lease with a TTL, renewed by heartbeats (``_postgres_leases``); its
  columns (``sessions.lease_until``, ``sessions.lease_owner``) are the dialect's own. Every
  step commit
  locks the session row and checks the epoch in its own transaction: a holder that was taken
  over gets :class:`~durable_turns.errors.LeaseLostError` and nothing of its step, local
  tools' writes included, is committed.
- The feed: ``NOTIFY`` and ``LISTEN`` (``_postgres_listen``).
- The schema is migrated by the store, under an advisory lock, so many processes may open a
  new database at once; the table ``durable_turns_schema`` holds the version. Tables live in
  the connection's ``search_path`` schema (put ``options=-csearch_path=myschema`` in the DSN
  to use another one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import pq
from psycopg_pool import ConnectionPool

from ..errors import StoreError
from ..records import SessionKey
from . import StoreCapabilities
from ._postgres_leases import Beat, RowLeases
from ._postgres_listen import CHANNEL, LISTENER_NAME, NotifyWire, listen, notify
from .feed import Feed
from .kit import Worker
from .sql import (
    SCHEMA_VERSION,
    Column,
    Index,
    SqlLease,
    SqlStore,
    Syntax,
    create_statements,
    migrate,
)

__all__ = ["CHANNEL", "CREATE", "LISTENER_NAME", "SYNTAX", "PostgresStore"]

T = TypeVar("T")
log = logging.getLogger("durable_turns")


class _Default:
    """The type of ``idle_timeout``'s default (the lease TTL)."""


_DEFAULT = _Default()

SYNTAX = Syntax(
    placeholder="%s",
    lock_rows=True,
    types={"id": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "int": "INTEGER",
           "bigint": "BIGINT", "text": "TEXT", "time": "TIMESTAMPTZ"},
    foreign_keys=True,
    session_columns=(Column("lease_until", "time"), Column("lease_owner", "text")),
    indexes=(Index("turns_by_id", "turns", "turn_id"),
             Index("turns_runnable", "turns", "sid", "status IN ('queued', 'running')")),
    columns_query="SELECT table_name, column_name FROM information_schema.columns "
                  "WHERE table_schema = current_schema()",
    indexes_query="SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()",
)
"""PostgreSQL's SQL: its lease's columns, the index of its workers' claims and of turns
looked up by id."""
CREATE: tuple[str, ...] = tuple(create_statements(SYNTAX))
"""The statements that create a new store's tables and indexes."""

_MIGRATION_LOCK = 0x44545552  # "DTUR": the advisory lock key around migrations
def _idle(c: psycopg.Connection[Any]) -> bool:
    return c.info.transaction_status == pq.TransactionStatus.IDLE


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


class _Link:
    """A step's link (``StepLink``): a lane and its pooled connection, taken at the step's
    first local tool or at its commit and kept until the commit ends."""

    def __init__(self, dialect: PostgresDialect) -> None:
        self._dialect = dialect
        self._lane: _Lane | None = None

    def connection(self) -> psycopg.Connection[Any] | None:
        return None if self._lane is None else self._lane.conn

    async def _take(self) -> _Lane:
        if self._lane is None:
            self._lane = await self._dialect.take_lane()
        return self._lane

    async def run_local(self, job: Callable[[Any], T]) -> T:
        lane = await self._take()
        # Not guarded: what the tool raises (a psycopg error of its own SQL too) is its error.
        return await lane.run(job)

    async def commit(self, job: Callable[[Any], None], *, began: bool,
                     waiting: Callable[[Any], None] | None = None) -> None:
        try:
            lane = await self._take()

            def commit() -> None:
                try:
                    job(lane.connection())
                finally:
                    lane.put_back()

            await self._dialect.guard(lane.worker.run(commit))
        finally:
            await self.end()

    async def rollback(self, job: Callable[[Any], None]) -> None:
        lane = self._lane
        if lane is None:
            return

        def rollback() -> None:
            try:
                if lane.conn is not None:
                    job(lane.conn)
            finally:
                lane.put_back()

        try:
            with contextlib.suppress(StoreError):  # the error that got us here matters
                await self._dialect.guard(lane.worker.run(rollback))
        finally:
            await self.end()

    async def end(self) -> None:
        lane, self._lane = self._lane, None
        if lane is not None:
            if lane.conn is not None:  # a job failed before giving it back
                await lane.worker.run(lane.put_back)
            self._dialect.give_lane(lane)


class PostgresDialect:
    """PostgreSQL's dialect of the SQL kit (``Dialect``); see the module's docstring.

    Args: as :class:`PostgresStore`'s.
    """

    syntax = SYNTAX

    def __init__(self, dsn: str, *, lease_ttl: float, pool_size: int, poll_interval: float,
                 connect_timeout: float, idle_timeout: float | None) -> None:
        self.dsn = dsn
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.idle_timeout = idle_timeout
        self.capabilities = StoreCapabilities(
            durable=True, shared_by="machines", exactly_once_local=True, lease_ttl=lease_ttl,
            paramstyle="format")
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.origin = uuid.uuid4().hex[:16]
        self.leases = RowLeases(self)
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self.live = NotifyWire(dsn, self._connect_args(), self.origin)
        """``Dialect.live``: NOTIFY on the channel ``durable_turns_live``."""
        self._pools: list[ConnectionPool[psycopg.Connection[Any]]] = []
        self._lanes: list[_Lane] = []
        self._free: asyncio.Queue[_Lane] = asyncio.Queue()
        self._leases_lane: _Lane | None = None
        self._inspect: psycopg.Connection[Any] | None = None
        self._listener: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.Error:
            return "PostgresStore(<an unparsable DSN>)"
        params.pop("password", None)  # never in a message or a log
        return f"PostgresStore({psycopg.conninfo.make_conninfo('', **params)!r})"

    @property
    def is_open(self) -> bool:
        """Whether the store is open."""
        return self._leases_lane is not None

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

    async def open(self, store: SqlStore) -> None:
        """``Dialect.open``."""
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
            await self.guard(leases.worker.run(lambda: self._open_pools(store, leases)))
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
        if store.feed.active:
            # Someone subscribed before the open: the listener their subscription started
            # found the store closed and ended, and the feed starts one only when it gets
            # its first listener.
            self.listen(store.feed)

    def _open_pools(self, store: SqlStore, leases: _Lane) -> None:
        try:
            for pool in self._pools:
                pool.open(wait=True, timeout=self._connect_timeout)
        except psycopg_pool.PoolTimeout as e:
            raise StoreError(f"cannot open a pool of connections to PostgreSQL ({self!r}) "
                             f"in {self._connect_timeout}s") from e
        leases.once(lambda c: store.in_transaction(c, self._migrate))

    @staticmethod
    def _migrate(c: psycopg.Connection[Any]) -> None:
        c.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        c.execute("CREATE TABLE IF NOT EXISTS durable_turns_schema (version INTEGER NOT NULL)")
        row = c.execute("SELECT version FROM durable_turns_schema").fetchone()
        version = 0 if row is None else int(row[0])
        if not migrate(c, SYNTAX, version, "the database"):
            return
        if row is None:
            c.execute("INSERT INTO durable_turns_schema VALUES (%s)", (SCHEMA_VERSION,))
        else:
            c.execute("UPDATE durable_turns_schema SET version = %s", (SCHEMA_VERSION,))

    async def close(self) -> None:
        """``Dialect.close``."""
        await self.live.close()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        for beat in list(self.leases.held):  # unreleased leases expire after lease_ttl
            await self.leases.stop(beat)
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
        """``Dialect.unwrap``."""
        if self._inspect is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        return self._inspect

    # -- connections -----------------------------------------------------------------------

    @property
    def leases_lane(self) -> _Lane:
        """The lane of the leases' own pool.

        Raises:
            StoreError: the store is not open.
        """
        if self._leases_lane is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        return self._leases_lane

    async def run_lease_job(self, job: Callable[[Any], T]) -> T:
        """Run ``job`` on a connection of the leases' own pool (guarded).

        Raises:
            StoreError: the store is not open, or PostgreSQL failed.
        """
        lane = self.leases_lane
        out: T = await self.guard(lane.worker.run(lambda: lane.once(job)))
        return out

    async def take_lane(self) -> _Lane:
        """A lane of the steps' pool, waiting for one to come free.

        Raises:
            StoreError: the store is not open.
        """
        if self._leases_lane is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        return await self._free.get()

    def give_lane(self, lane: _Lane) -> None:
        """Give back a lane of :meth:`take_lane`."""
        self._free.put_nowait(lane)

    @contextlib.asynccontextmanager
    async def _lane(self) -> AsyncIterator[_Lane]:
        lane = await self.take_lane()
        try:
            yield lane
        finally:
            self.give_lane(lane)

    async def guard(self, job: Any) -> Any:
        """Await a job, turning a database failure into StoreError (what the job raises of
        its own, LeaseLostError for one, propagates as it is)."""
        try:
            return await job
        except psycopg.Error as e:
            raise StoreError(f"PostgreSQL failed ({self!r}): {e}") from e
        except psycopg_pool.PoolTimeout as e:
            raise StoreError(f"no PostgreSQL connection came free in "
                             f"{self._connect_timeout}s ({self!r}): {e}") from e

    async def read(self, job: Callable[[Any], T]) -> T:
        """``Dialect.read``."""
        async with self._lane() as lane:
            try:
                out: T = await lane.worker.run(lambda: lane.once(job))
            except psycopg.OperationalError:
                # A pooled connection whose backend went away since its last use (a server
                # restart, pg_terminate_backend): the pool replaces it; read once more.
                out = await self.guard(lane.worker.run(lambda: lane.once(job)))
            except psycopg.Error as e:
                raise StoreError(f"PostgreSQL failed ({self!r}): {e}") from e
            return out

    async def write(self, job: Callable[[Any], T], *,
                    waiting: Callable[[Any], T] | None = None) -> T:
        """``Dialect.write``."""
        async with self._lane() as lane:
            out: T = await self.guard(lane.worker.run(lambda: lane.once(job)))
            return out

    def step(self) -> _Link:
        """``Dialect.step``."""
        return _Link(self)

    def in_transaction(self, c: Any) -> bool:
        """``Dialect.in_transaction``."""
        return not c.closed and not c.broken and not _idle(c)

    def lost(self, c: Any) -> bool:
        """``Dialect.lost``."""
        return bool(c.broken or c.closed)

    def notify(self, c: Any, key: SessionKey, seq: int | None,
               live: Sequence[str] = ()) -> None:
        """``Dialect.notify``: the live frames first, in the same statement."""
        notify(c, self.origin, key, seq, live)

    def listen(self, feed: Feed) -> None:
        """``Dialect.listen``."""
        if self._listener is None or self._listener.done():
            self._listener = asyncio.ensure_future(listen(
                feed, self.dsn, self._connect_args(), self.origin, self.poll_interval,
                lambda: self.is_open, self.live))


class PostgresStore(SqlStore):
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

    Raises:
        ValueError: a ``lease_ttl``, ``poll_interval``, ``pool_size`` or ``idle_timeout``
            out of range.
    """

    dialect: PostgresDialect

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
        super().__init__(PostgresDialect(
            dsn, lease_ttl=lease_ttl, pool_size=pool_size, poll_interval=poll_interval,
            connect_timeout=connect_timeout, idle_timeout=idle_timeout))
        self.dsn = dsn
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.idle_timeout = idle_timeout
        self.owner = self.dialect.owner
        """What ``sessions.lease_owner`` says of this store's leases (host:pid)."""
        self.origin = self.dialect.origin
        """This store's name in its notifications (``from``): its listener skips its own,
        whose events it published already."""

    def __repr__(self) -> str:
        return repr(self.dialect)

    def unwrap(self) -> psycopg.Connection[Any]:
        """A connection (autocommit) for set-up and inspection outside any step.

        Raises:
            StoreError: the store is not open.
        """
        return self.dialect.unwrap()

    async def stop_heartbeat(self, lease: SqlLease) -> bool:
        """Stop renewing ``lease`` without releasing it, so it expires ``lease_ttl`` seconds
        on: what a paused or cut-off holder looks like to the others.

        Returns:
            Whether it was still beating.
        """
        beat: Beat = lease.hold
        return await self.dialect.leases.stop(beat)
