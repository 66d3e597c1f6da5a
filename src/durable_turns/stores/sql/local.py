"""Leases for the SQL stores of one machine: a lock outside the database, then an epoch.

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
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ...records import SessionKey
from ..kit import claim_found, retry_until
from .store import Grant

if TYPE_CHECKING:
    from .store import SqlLease, SqlStore

__all__ = ["RELEASED_KEPT", "LocalLeases", "Locks"]

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
