"""What the SQL stores of one machine share: leases held by a lock outside the database,
and the step link of a write connection that serves every session.

A one-machine store holds a session by a lock that dies with its holder (an OS file lock;
for a store of one process, a set in memory), so a crashed holder never blocks a replay and
no lease needs a heartbeat. :class:`LocalLeases` is the ``Leases`` of such a dialect, written
once over its :class:`Locks`:

- a claim takes the lock without waiting, backing off between tries
  (:func:`~durable_turns.stores.kit.retry_until`), then raises the session's epoch;
- a session this store released last is claimed in one statement (where statements are
  serialised): the store keeps the released lease's counters, and trusts them when the new
  epoch directly follows the released one (nobody wrote in between);
- ``claim_ready`` claims, without waiting, sessions with work whose lock looks free
  (:func:`~durable_turns.stores.kit.claim_found`).

Such a store writes through one connection, so a step holds the store's write lock
(an ``asyncio.Lock``) from its first use of the connection (a local tool or its commit) to the
end of its commit, and nobody else's statement lands in its transaction: :class:`SharedLink`
is that ``StepLink``, over the dialect's :class:`SharedWriter`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...records import SessionKey
from ..kit import claim_found, retry_until
from ._dialect import Grant, tool_ended_transaction

if TYPE_CHECKING:
    from ._store import SqlLease, SqlStore

__all__ = ["RELEASED_KEPT", "LocalLeases", "Locks", "ProcessLocks", "SharedLink", "SharedWriter"]

T = TypeVar("T")

RELEASED_KEPT = 4096
"""Sessions whose counters a store keeps after its lease ends, for its next claim of them."""


class Locks(Protocol):
    """Per-session exclusive locks that live outside the database and end with their holder."""

    def take(self, key: SessionKey) -> Any | None:
        """Lock the session without waiting: a token for :meth:`give_back`, or ``None`` when
        another holder has it.

        Raises:
            StoreError: the store is not open.
        """
        ...

    def give_back(self, token: Any) -> None:
        """Unlock what :meth:`take` locked."""
        ...

    def free(self, keys: Iterable[SessionKey], limit: int) -> list[SessionKey]:
        """Up to ``limit`` of ``keys`` that nobody holds now (a hint: a claim may still lose
        the race for one)."""
        ...


class LocalLeases:
    """The ``Leases`` of a one-machine dialect (see the module's docstring).

    Args:
        locks: the dialect's locks.
    """

    def __init__(self, locks: Locks) -> None:
        self._locks = locks
        self._released: dict[SessionKey, tuple[int, int, int, int, int]] = {}
        """Counters of the leases this store released last: ``(sid, epoch, generation, newest
        seq, message count)``."""

    async def claim(self, store: SqlStore, key: SessionKey, timeout: float | None) -> Grant:
        """``Leases.claim``."""
        async def attempt() -> Any | None:
            return self._locks.take(key)

        token = await retry_until(attempt, key, timeout)
        try:
            sid, epoch, generation, seq, count = await self._new_epoch(store, key)
        except BaseException:
            self._locks.give_back(token)
            raise
        return Grant(sid, epoch, generation, seq, count, token)

    async def _new_epoch(self, store: SqlStore,
                         key: SessionKey) -> tuple[int, int, int, int, int]:
        """Raise the session's epoch (its lock is held): ``(sid, epoch, generation, newest
        seq, message count)``."""
        st = store.statements
        known = self._released.pop(key, None)
        if known is None or not store.dialect.syntax.serialised:
            return await store.transact(lambda c: st.claim(c, key))
        sid, released, generation, seq, count = known
        epoch, gen = await store.statement(lambda c: st.bump(c, sid))
        if epoch != released + 1 or gen != generation:
            seq, count = await store.read(lambda c: st.last_row(c, sid, gen))
        return sid, epoch, gen, seq, count

    async def claim_ready(self, store: SqlStore, agents: Collection[str],
                          limit: int) -> list[tuple[SessionKey, Grant]]:
        """``Leases.claim_ready``."""
        async def find(n: int) -> list[SessionKey]:
            return self._locks.free(await store.find_sessions("unfinished"), n)

        async def claim(key: SessionKey) -> tuple[SessionKey, Grant]:
            return key, await self.claim(store, key, 0)

        return await claim_found(find, claim, agents, limit)

    async def release(self, store: SqlStore, lease: SqlLease) -> None:
        """``Leases.release``: keep the lease's counters for this store's next claim of the
        session, and unlock."""
        if len(self._released) >= RELEASED_KEPT:
            self._released.pop(next(iter(self._released)))
        self._released[lease.key] = (lease.sid, lease.epoch, lease.generation, lease.last_seq,
                                     lease.message_count)
        self._locks.give_back(lease.hold)


class ProcessLocks:
    """Session locks of one process (:class:`Locks`): the set of sessions held. For a store
    no other process opens (in memory, or a backend with one live instance per storage)."""

    def __init__(self) -> None:
        self._held: set[SessionKey] = set()

    def take(self, key: SessionKey) -> SessionKey | None:
        """``Locks.take``."""
        if key in self._held:
            return None
        self._held.add(key)
        return key

    def give_back(self, token: SessionKey) -> None:
        """``Locks.give_back``."""
        self._held.discard(token)

    def free(self, keys: Iterable[SessionKey], limit: int) -> list[SessionKey]:
        """``Locks.free``."""
        return [k for k in keys if k not in self._held][:limit]


class SharedWriter(Protocol):
    """What :class:`SharedLink` needs of a dialect whose one write connection serves every
    session, and whose transactions are begun and ended by calls on it (SQL text, for SQLite)."""

    @property
    def write_lock(self) -> asyncio.Lock:
        """Held by whoever uses the write connection."""
        ...

    def writer(self) -> Any:
        """The write connection (a ``Connection``, and the raw handle local tools get).

        Raises:
            StoreError: the store is not open.
        """
        ...

    def run_local_job(self, job: Callable[[Any], T]) -> Awaitable[T]:
        """Run a local tool's job on the write connection (where user code may block)."""
        ...

    async def run_write(self, job: Callable[[Any], T], *, began: bool = False,
                        waiting: Callable[[Any], T] | None = None) -> T:
        """Run a write job on the write connection: ``waiting`` instead where ``job`` would
        wait for another writer; a job that ``began`` holds the write lock already.

        Raises:
            StoreError: the database failed.
        """
        ...

    def committed(self) -> None:
        """A step committed (for the dialect's upkeep: checkpoints)."""
        ...

    def begin(self, c: Any) -> None:
        """Begin a write transaction on ``c`` (taking the database's write lock)."""
        ...

    def commit(self, c: Any) -> None:
        """Commit ``c``'s transaction."""
        ...

    def rollback(self, c: Any) -> None:
        """Undo ``c``'s transaction, if one is open."""
        ...

    def in_transaction(self, c: Any) -> bool:
        """Whether ``c`` is inside a transaction."""
        ...

    def atomic(self, c: Any, job: Callable[[Any], T]) -> T:
        """``Dialect.atomic``."""
        ...


class SharedLink:
    """The ``StepLink`` of a :class:`SharedWriter`: its write connection, under its write
    lock from the step's first use of it to the end of its commit. The first local tool
    begins the transaction (a rollback then undoes exactly its writes: the store's own rows
    are written at commit); every later one runs nested in it (``atomic``).

    Args:
        writer: the dialect.

    Raises:
        StoreError: the store is not open.
    """

    # One per step: no instance dict, and nothing else allocated with it.
    __slots__ = ("_begun", "_conn", "_held", "_writer")

    def __init__(self, writer: SharedWriter) -> None:
        self._writer = writer
        self._conn = writer.writer()
        self._held = False
        self._begun = False

    def connection(self) -> Any:
        """``StepLink.connection``."""
        return self._conn

    def _give_back(self) -> None:
        if self._held:
            self._held = False
            self._writer.write_lock.release()

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        """``StepLink.run_local``."""
        # The lock taken inline, not in a helper: a coroutine call costs a step about 1 µs.
        if not self._held:
            await self._writer.write_lock.acquire()
            self._held = True
        return await self._writer.run_local_job(lambda c: self._local(c, fn))

    def _local(self, c: Any, fn: Callable[[Any], T]) -> T:
        w = self._writer
        if self._begun:
            try:
                out = w.atomic(c, fn)  # nested: a raise undoes this tool's writes only
            except BaseException:
                if not w.in_transaction(c):
                    self._begun = False  # the tool ended the transaction, then raised
                raise
        else:
            w.begin(c)
            self._begun = True
            try:
                out = fn(c)
            except BaseException:
                # The first writer of the transaction: undoing it all undoes just the tool.
                self._begun = False
                w.rollback(c)
                raise
        if not w.in_transaction(c):
            self._begun = False
            raise tool_ended_transaction()
        return out

    async def commit(self, job: Callable[[Any], None], *,
                     alone: Callable[[Any], None] | None = None) -> None:
        """``StepLink.commit``."""
        w = self._writer
        try:
            if not self._held:
                await w.write_lock.acquire()
                self._held = True
            if self._begun:
                await w.run_write(lambda c: self._finish(c, job), began=True)
            elif alone is not None:
                await w.run_write(alone, waiting=lambda c: w.atomic(c, job))
            else:
                await w.run_write(lambda c: w.atomic(c, job))
        finally:
            self._give_back()
        w.committed()

    def _finish(self, c: Any, job: Callable[[Any], None]) -> None:
        w = self._writer
        self._begun = False
        try:
            job(c)
            w.commit(c)
        except BaseException:
            w.rollback(c)
            raise

    async def end(self) -> None:
        """``StepLink.end``."""
        try:
            if self._begun:
                self._begun = False
                with contextlib.suppress(Exception):  # the error that got us here matters
                    self._writer.rollback(self._conn)
        finally:
            self._give_back()
