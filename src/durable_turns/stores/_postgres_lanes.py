"""The PostgreSQL store's connections: the kit's ``Connection`` on psycopg, PostgreSQL's
transactions (its SQL), the store's lanes (a thread and the connection it keeps) and the step
link that holds a lane from a step's first local tool to the end of its commit."""

from __future__ import annotations

import contextlib
import select
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import pq

from ..errors import StoreError
from .kit import StoreThread
from .sql import tool_ended_transaction

__all__ = ["Lane", "LaneDialect", "PgConnection", "PgTransactions", "StepLane"]

T = TypeVar("T")


class PgTransactions:
    """PostgreSQL's transactions, as SQL on a connection in autocommit (``Dialect.atomic``
    and what a step's link calls)."""

    @staticmethod
    def begin(c: psycopg.Connection[Any]) -> None:
        """Begin a transaction on ``c``."""
        c.execute("BEGIN")

    @staticmethod
    def commit(c: psycopg.Connection[Any]) -> None:
        """Commit ``c``'s transaction."""
        c.execute("COMMIT")

    @staticmethod
    def rollback(c: psycopg.Connection[Any]) -> None:
        """Undo ``c``'s transaction, if one is open (and the connection usable)."""
        if PgTransactions.in_transaction(c):
            c.execute("ROLLBACK")

    @staticmethod
    def in_transaction(c: psycopg.Connection[Any]) -> bool:
        """Whether ``c`` is inside a transaction (and usable)."""
        return not c.closed and not c.broken and not _idle(c)

    @staticmethod
    def lost(c: psycopg.Connection[Any]) -> bool:
        """Whether ``c`` broke (a killed backend): a transaction begun on it is gone."""
        return bool(c.broken or c.closed)

    @staticmethod
    def atomic(c: psycopg.Connection[Any], job: Callable[[Any], T]) -> T:
        """``Dialect.atomic``: ``BEGIN`` … ``COMMIT``, or a savepoint inside an open
        transaction (a job that ended the transaction itself leaves nothing to release)."""
        if not PgTransactions.in_transaction(c):
            c.execute("BEGIN")
            try:
                out = job(c)
                c.execute("COMMIT")
            except BaseException:
                PgTransactions.rollback(c)
                raise
            return out
        c.execute("SAVEPOINT dt_atomic")
        try:
            out = job(c)
        except BaseException:
            if PgTransactions.in_transaction(c):
                c.execute("ROLLBACK TO SAVEPOINT dt_atomic")
                c.execute("RELEASE SAVEPOINT dt_atomic")
            raise
        if PgTransactions.in_transaction(c):
            c.execute("RELEASE SAVEPOINT dt_atomic")
        return out


class LaneDialect(Protocol):
    """What a :class:`StepLane` needs of its dialect."""

    async def take_lane(self, wait: float | None = None) -> Lane:
        """A lane for steps and reads, waiting for one to come free."""
        ...

    def give_lane(self, lane: Lane) -> None:
        """Give back a lane of :meth:`take_lane`."""
        ...

    async def guard(self, job: Awaitable[Any]) -> Any:
        """Await a job, a database failure raised as ``StoreError``."""
        ...


class PgConnection(psycopg.Connection[Any]):
    """A psycopg connection that is also the kit's ``Connection`` (``rows``, ``changes``):
    what local tools get as the raw handle and what the kit's jobs run on."""

    def rows(self, sql: str, params: Sequence[Any] = (), /) -> list[Any]:
        """``Connection.rows``."""
        cur = self.execute(sql, params or None)  # none: a % in the text is not a placeholder
        return cur.fetchall() if cur.description is not None else []

    def changes(self, sql: str, params: Sequence[Any] = (), /) -> int:
        """``Connection.changes``."""
        return self.execute(sql, params or None).rowcount


def _idle(c: psycopg.Connection[Any]) -> bool:
    return c.info.transaction_status == pq.TransactionStatus.IDLE


def _gone(c: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection's server hung up: nothing is due on it, so anything to read
    (the FATAL it sent as it went, or the end of the stream) says so. One ``select``."""
    try:
        readable, _w, _x = select.select([c.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


class Lane:
    """One of the store's threads and the connection it keeps: made at its first job, and
    made again, before a job begins, when the server hung up on it meanwhile (a restart, a
    killed backend), so the first request after a database comes back works at once.

    Every method but the worker's ``run`` runs on the lane's thread.
    """

    def __init__(self, name: str, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self.worker = StoreThread(name)
        self._connect = connect
        self.conn: psycopg.Connection[Any] | None = None

    def fresh(self) -> psycopg.Connection[Any]:
        """The connection, idle and working as far as can be told without a round trip.

        Raises:
            StoreError: no new connection could be made.
        """
        self.reset()
        c = self.conn
        if c is None or _gone(c):
            self.drop()
            c = self.conn = self._connect()
        return c

    def reset(self) -> None:
        """Leave the connection idle (a job that failed mid-transaction), or drop it."""
        c = self.conn
        if c is None:
            return
        if c.closed or c.broken:
            self.drop()
        elif not _idle(c):
            try:
                c.execute("ROLLBACK")
            except psycopg.Error:
                self.drop()

    def drop(self) -> None:
        c, self.conn = self.conn, None
        if c is not None:
            with contextlib.suppress(Exception):
                c.close()

    def once(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``fn`` on a fresh connection, left idle after."""
        c = self.fresh()
        try:
            return fn(c)
        finally:
            self.reset()


class StepLane:
    """A step's link (``StepLink``): a lane and its connection, taken at the step's first
    local tool or at its commit and kept until the commit ends. Its connection is made fresh
    at the first job only: one lost mid-step is never replaced (the step is abandoned). The
    first local tool begins the transaction; every later one runs in a savepoint."""

    def __init__(self, dialect: LaneDialect) -> None:
        self._dialect = dialect
        self._lane: Lane | None = None
        self._began = False  # the lane's connection was taken (made fresh) for this step
        self._tx = False  # the step's transaction is open on it

    def connection(self) -> psycopg.Connection[Any] | None:
        return None if self._lane is None else self._lane.conn

    def _conn(self, lane: Lane) -> psycopg.Connection[Any]:
        if not self._began:
            self._began = True
            return lane.fresh()
        if lane.conn is None:
            raise StoreError("the step's connection was lost mid-step; nothing of the step "
                             "was committed")
        return lane.conn

    async def _take(self) -> Lane:
        if self._lane is None:
            self._lane = await self._dialect.take_lane()
        return self._lane

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        lane = await self._take()
        # Not guarded: what the tool raises (a psycopg error of its own SQL too) is its error.
        return await lane.worker.run(lambda: self._local(self._conn(lane), fn))

    def _local(self, c: psycopg.Connection[Any], fn: Callable[[Any], T]) -> T:
        d = PgTransactions
        if not self._tx:
            d.begin(c)
            self._tx = True
            try:
                out = fn(c)
            except BaseException:
                if d.lost(c):
                    pass  # the transaction is gone: the step's commit is refused (_finish)
                else:
                    self._tx = False  # the first writer: undoing it all undoes the tool
                    d.rollback(c)
                raise
        elif d.lost(c):
            self._tx = False
            raise StoreError("the step's connection was lost mid-step; nothing of the step "
                             "was committed")
        else:
            try:
                out = d.atomic(c, fn)
            except BaseException:
                if not d.lost(c) and not d.in_transaction(c):
                    self._tx = False  # the tool ended the transaction, then raised
                raise
        if not d.in_transaction(c):
            self._tx = False
            raise tool_ended_transaction()
        return out

    def _finish(self, c: psycopg.Connection[Any], job: Callable[[Any], None]) -> None:
        d = PgTransactions
        if not self._tx:
            d.begin(c)
        elif d.lost(c):
            self._tx = False
            raise StoreError("the step's connection was lost mid-step; nothing of the step was "
                             "committed")
        self._tx = False
        try:
            job(c)
            d.commit(c)
        except BaseException:
            d.rollback(c)
            raise

    async def commit(self, job: Callable[[Any], None], *,
                     alone: Callable[[Any], None] | None = None) -> None:
        try:
            lane = await self._take()
            await self._dialect.guard(
                lane.worker.run(lambda: self._finish(self._conn(lane), job)))
        finally:
            await self.end()

    async def end(self) -> None:
        lane, self._lane = self._lane, None
        self._tx = False
        if lane is not None:
            try:
                await lane.worker.run(lane.reset)  # idle again (rolled back), or dropped
            finally:
                self._dialect.give_lane(lane)  # cancelled too: run() waits for the job first
