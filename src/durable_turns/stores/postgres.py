"""The shared store: PostgreSQL (psycopg 3), for many workers on many machines; a dialect of
the SQL kit (``stores.sql``), which writes its statements, its write path and its schema.

- Statements are not serialised: every write locks its session's row first (``lock_rows``:
  ``FOR UPDATE``), so the chain rules and the fencing check see no concurrent writer.
- Connections: each of the store's threads (a ``StoreThread``: ``pool_size`` of them for steps and
  reads, one for leases, so long local tools never starve a heartbeat) keeps one sync psycopg
  connection, so the event loop never blocks and a local tool gets the step's connection
  (``ctx.store.unwrap()``) inside the step's transaction: its writes commit with the step,
  exactly once. A step holds a thread and its connection from its first local tool (or its
  commit) until its commit ends; a read or a write takes one for a statement. Before a job
  begins, a thread looks (one ``select``, no round trip) whether the server hung up on its
  idle connection (a restart, a killed backend) and connects again at once: the first
  request after the database comes back works, with no backoff to wait out.
- Bounded waits: a read or a write waits at most ``wait_timeout`` (5 s) for a connection,
  a free one or a new one, then fails with ``StoreError`` having written nothing; a database
  that refuses connections (stopped, restarting) fails it at once. TCP keepalives end a
  connection whose server stopped answering within a few seconds.
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
import math
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import psycopg

from ..errors import StoreError
from ..records import SessionKey
from . import StoreCapabilities
from ._feed import Feed
from ._postgres_lanes import Lane, PgConnection, PgTransactions, StepLane
from ._postgres_leases import Beat, RowLeases
from ._postgres_listen import CHANNEL, LISTENER_NAME, NotifyWire, listen, notify
from .sql import (
    Column,
    Index,
    SqlLease,
    SqlStore,
    Syntax,
    create_statements,
    upgrade,
)

__all__ = ["CHANNEL", "CREATE", "LISTENER_NAME", "SYNTAX", "PgConnection", "PostgresStore"]

T = TypeVar("T")
log = logging.getLogger("durable_turns")


class _Default:
    """The type of ``idle_timeout``'s default (the lease TTL)."""


_DEFAULT = _Default()

SYNTAX = Syntax(
    placeholder="%s",
    lock_rows=True,
    contains="strpos({text}, {part}) > 0",
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
WAIT_TIMEOUT = 5.0
"""Seconds a read or a write waits for a connection (a free one, or a new one) by default."""


class PostgresDialect(PgTransactions):
    """PostgreSQL's dialect of the SQL kit (``Dialect``); see the module's docstring.

    Args: as :class:`PostgresStore`'s.
    """

    syntax = SYNTAX
    signals = None
    """``Dialect.signals``: none needed, a cancel's write takes row locks only (a step's
    open transaction holds none of the rows it updates until its commit)."""

    def __init__(self, dsn: str, *, lease_ttl: float, pool_size: int, poll_interval: float,
                 connect_timeout: float, idle_timeout: float | None,
                 wait_timeout: float = WAIT_TIMEOUT, live: bool = True) -> None:
        self.dsn = dsn
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.idle_timeout = idle_timeout
        self.wait_timeout = wait_timeout
        self.capabilities = StoreCapabilities(
            durable=True, shared_by="machines", exactly_once_local=True, local_off_loop=True,
            lease_ttl=lease_ttl, paramstyle="format")
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.origin = uuid.uuid4().hex[:16]
        self.leases = RowLeases(self)
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self.live = NotifyWire(dsn, self._connect_args(), self.origin) if live else None
        """``Dialect.live``: NOTIFY on the channel ``durable_turns_live`` (``None``: live
        text stays in this process)."""
        self._lanes: list[Lane] = []
        self._free: asyncio.Queue[Lane] = asyncio.Queue()
        self._leases_lane: Lane | None = None
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
        # libpq's connect_timeout is whole seconds, 2 at least. The keepalives and the user
        # timeout end a connection whose server stopped answering (a host that went away,
        # a cut network) within a few seconds, instead of the kernel's many minutes.
        wait = min(self._connect_timeout, self.wait_timeout)
        return {"autocommit": True, "connect_timeout": max(2, math.ceil(wait)),
                "keepalives": 1, "keepalives_idle": max(1, round(self.wait_timeout)),
                "keepalives_interval": 1, "keepalives_count": 3,
                "tcp_user_timeout": max(1000, round(self.wait_timeout * 1000))}

    def _connect(self) -> PgConnection:
        try:
            return PgConnection.connect(self.dsn, **self._connect_args())
        except psycopg.Error as e:
            raise StoreError(f"cannot connect to PostgreSQL ({self!r}): {e}") from e

    def _open_connection(self) -> psycopg.Connection[Any]:
        """A lane's new connection, set up (on the lane's thread)."""
        c = self._connect()
        if self.idle_timeout is not None:
            try:
                c.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                          (f"{max(1, round(self.idle_timeout * 1000))}ms",))
            except psycopg.Error as e:
                c.close()
                raise StoreError(f"cannot set up a connection to PostgreSQL ({self!r}): "
                                 f"{e}") from e
        return c

    async def open(self, store: SqlStore) -> None:
        """``Dialect.open``."""
        if self._leases_lane is not None:
            return
        leases = Lane("durable-turns-pg-leases", self._open_connection)
        lanes = [Lane(f"durable-turns-pg-{i}", self._open_connection)
                 for i in range(self._pool_size)]
        try:
            self._inspect = await leases.worker.run(self._connect)
            migrate = lambda c: self.atomic(c, self._migrate)  # noqa: E731
            await self.guard(leases.worker.run(lambda: leases.once(migrate)))
            # Every lane's connection now, together: a step never waits for one to be made.
            await asyncio.gather(*(lane.worker.run(lane.fresh) for lane in lanes))
        except BaseException:
            inspect, self._inspect = self._inspect, None
            if inspect is not None:
                inspect.close()
            await self._stop([*lanes, leases])
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

    @staticmethod
    def _migrate(c: PgConnection) -> None:
        c.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        upgrade(c, SYNTAX, "the database")  # the version in durable_turns_schema

    async def close(self) -> None:
        """``Dialect.close``."""
        if self.live is not None:
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

    @staticmethod
    async def _stop(lanes: list[Lane]) -> None:
        for lane in lanes:
            await lane.worker.run(lane.drop)
            lane.worker.stop()

    def unwrap(self) -> psycopg.Connection[Any]:
        """``Dialect.unwrap``."""
        if self._inspect is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        return self._inspect

    # -- connections -----------------------------------------------------------------------

    @property
    def leases_lane(self) -> Lane:
        """The lane the leases use (its own connection, so heartbeats never wait for steps).

        Raises:
            StoreError: the store is not open.
        """
        if self._leases_lane is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        return self._leases_lane

    async def run_lease_job(self, job: Callable[[Any], T]) -> T:
        """Run ``job`` on the leases' own connection (guarded).

        Raises:
            StoreError: the store is not open, or PostgreSQL failed.
        """
        lane = self.leases_lane
        out: T = await self.guard(lane.worker.run(lambda: lane.once(job)))
        return out

    async def take_lane(self, wait: float | None = None) -> Lane:
        """A lane for steps and reads, waiting for one to come free (at most ``wait``
        seconds; ``None``: as long as it takes).

        Raises:
            StoreError: the store is not open, or none came free in time.
        """
        if self._leases_lane is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        if wait is None:
            return await self._free.get()
        try:
            async with asyncio.timeout(wait):
                return await self._free.get()
        except TimeoutError:
            raise StoreError(f"no connection to PostgreSQL came free in {wait:g}s ({self!r}): "
                             "every one is busy, or the database is slow") from None

    def give_lane(self, lane: Lane) -> None:
        """Give back a lane of :meth:`take_lane`."""
        self._free.put_nowait(lane)

    @contextlib.asynccontextmanager
    async def _lane(self) -> AsyncIterator[Lane]:
        lane = await self.take_lane(self.wait_timeout)
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

    async def read(self, job: Callable[[Any], T]) -> T:
        """``Dialect.read``: waits at most ``wait_timeout`` for a connection."""
        async with self._lane() as lane:
            try:
                out: T = await lane.worker.run(lambda: lane.once(job))
            except psycopg.OperationalError:
                # The backend went away between the lane's look and the statement (a
                # restart, pg_terminate_backend): a read may simply be made again.
                out = await self.guard(lane.worker.run(lambda: lane.once(job)))
            except psycopg.Error as e:
                raise StoreError(f"PostgreSQL failed ({self!r}): {e}") from e
            return out

    async def write(self, job: Callable[[Any], T], *,
                    waiting: Callable[[Any], T] | None = None) -> T:
        """``Dialect.write``: waits at most ``wait_timeout`` for a connection."""
        async with self._lane() as lane:
            out: T = await self.guard(lane.worker.run(lambda: lane.once(job)))
            return out

    def step(self) -> StepLane:
        """``Dialect.step``."""
        return StepLane(self)

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
        pool_size: connections (each with a thread) for steps and reads (besides one for
            leases and one for ``unwrap()``, one listening while anyone subscribes, and one
            sending live text while a turn streams).
        poll_interval: seconds between re-reads while anyone subscribes, in case a
            notification was lost.
        connect_timeout: seconds to wait for a new connection (at most ``wait_timeout``).
        wait_timeout: seconds a read or a write (what a host's request asks) waits for a
            connection, a free one or a new one, before it fails with ``StoreError``,
            nothing written: the bound of a request while the database is away.
        live: carry live text (``message.delta``…) to the subscribers of other processes,
            as ``NOTIFY`` frames (``False``: only this process's subscribers get it).
        idle_timeout: seconds a step's transaction may sit idle (a local tool between two
            statements) before the server ends it, releasing its locks; the step is then
            abandoned and driven again. Default: ``lease_ttl`` (by then a paused worker's
            session is another's anyway). ``None``: never.

    Raises:
        ValueError: a ``lease_ttl``, ``poll_interval``, ``pool_size``, ``idle_timeout`` or
            ``wait_timeout`` out of range.
    """

    dialect: PostgresDialect

    def __init__(self, dsn: str, *, lease_ttl: float = 15.0, pool_size: int = 4,
                 poll_interval: float = 1.0, connect_timeout: float = 10.0,
                 idle_timeout: float | _Default | None = _DEFAULT,
                 wait_timeout: float = WAIT_TIMEOUT, live: bool = True) -> None:
        if lease_ttl <= 0 or poll_interval <= 0 or wait_timeout <= 0:
            raise ValueError("lease_ttl, poll_interval and wait_timeout must be positive")
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if isinstance(idle_timeout, _Default):
            idle_timeout = lease_ttl
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive (or None)")
        super().__init__(PostgresDialect(
            dsn, lease_ttl=lease_ttl, pool_size=pool_size, poll_interval=poll_interval,
            connect_timeout=connect_timeout, idle_timeout=idle_timeout,
            wait_timeout=wait_timeout, live=live))
        self.dsn = dsn
        self.wait_timeout = wait_timeout
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
