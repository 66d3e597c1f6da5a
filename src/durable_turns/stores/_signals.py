"""Where a cancel goes while a running step holds the store's write lock (F7).

A local tool runs inside its step's transaction, so on a store with one writer at a time
(SQLite's file lock, the memory store's connection) the step holds the write lock for as long
as the tool runs. A cancel sent meanwhile must not wait behind it: F7 has it take effect at
the step's end (the boundary before the batch's next call, or before the next model call),
and a cancel is durable once ``request_cancel`` returns. So such a store keeps *signals*: a
place of their own, written at once, that the store reads with its chain's own cancels:

- ``request_cancel`` writes the chain's cancel as usual when the write lock is free; when a
  running step holds it, the cancel becomes a signal (durable at once) and its returned ids
  are the entries it reached, and the store *folds* it into the chain (the entries' cancel)
  as soon as the lock is free;
- ``Lease.cancel_requested`` and ``entries()`` see a signal as the entry's cancel, so the
  engine's look after a local tool's step finds it, whichever process sent it;
- a signal left unfolded (its sender died before the lock came free) is folded by the next
  store that opens the storage, or that hears of it (SQLite's change detector).

The same place keeps *accepts* of commands that must not wait either (``NewEntry.at_once``:
a steer, F25, durable once ``start()`` returns): the entry's JSON, folded into the chain
(appended) once the lock is free; the chain's reads show it meanwhile, and a reader that can
write (no step of this process holds the lock) folds it first.

A store whose writes never wait behind a running step (PostgreSQL: row locks) needs none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Protocol

from ..records import SessionKey

__all__ = ["ProcessSignals", "Signals"]


class Signals(Protocol):
    """A store's signals (see the module docstring). Every method returns promptly: none
    waits behind a running step."""

    def blocked(self) -> bool:
        """Whether this process's write lock is held now (by a step, perhaps while a local
        tool runs): a write would wait for it. (Held only briefly otherwise, so a cancel
        made a signal for nothing is folded microseconds later.)"""
        ...

    async def put(self, key: SessionKey, turn_ids: Sequence[str], reason: str) -> list[str]:
        """Keep a cancel of these entries, durably; returns those it reached (an entry that
        has a signal already keeps its first reason)."""
        ...

    async def of(self, key: SessionKey) -> dict[str, str]:
        """The session's signals: each entry's cancel reason, by its id."""
        ...

    async def pending(self) -> list[tuple[SessionKey, str, str]]:
        """Every signal not folded yet: ``(session, entry id, reason)``."""
        ...

    async def drop(self, key: SessionKey, turn_ids: Iterable[str]) -> None:
        """Forget these signals: they were folded into the chain."""
        ...

    async def put_entry(self, key: SessionKey, turn_id: str, body: str) -> bool:
        """Keep an accepted entry (its JSON), durably; ``False``: one of that id is kept."""
        ...

    async def entries_of(self, key: SessionKey) -> dict[str, str]:
        """The session's kept entries, in the order they were kept: JSON by id."""
        ...

    async def pending_entries(self) -> list[SessionKey]:
        """The sessions with kept entries not folded yet."""
        ...

    async def drop_entry(self, key: SessionKey, turn_id: str) -> None:
        """Forget a kept entry: it was folded into the chain."""
        ...


class ProcessSignals:
    """Signals in this process's memory: for a store that only this process uses.

    Args:
        write_lock: the lock a step of the store holds from its first write to its commit.
    """

    def __init__(self, write_lock: asyncio.Lock) -> None:
        self._lock = write_lock
        self._kept: dict[SessionKey, dict[str, str]] = {}
        self._entries: dict[SessionKey, dict[str, str]] = {}

    def blocked(self) -> bool:
        return self._lock.locked()

    async def put(self, key: SessionKey, turn_ids: Sequence[str], reason: str) -> list[str]:
        kept = self._kept.setdefault(key, {})
        reached = [t for t in turn_ids if t not in kept]
        for t in reached:
            kept[t] = reason
        return reached

    async def of(self, key: SessionKey) -> dict[str, str]:
        return dict(self._kept.get(key, {}))

    async def pending(self) -> list[tuple[SessionKey, str, str]]:
        return [(k, t, r) for k, kept in self._kept.items() for t, r in kept.items()]

    async def drop(self, key: SessionKey, turn_ids: Iterable[str]) -> None:
        kept = self._kept.get(key)
        if kept is None:
            return
        for t in turn_ids:
            kept.pop(t, None)
        if not kept:
            del self._kept[key]

    async def put_entry(self, key: SessionKey, turn_id: str, body: str) -> bool:
        kept = self._entries.setdefault(key, {})
        if turn_id in kept:
            return False
        kept[turn_id] = body
        return True

    async def entries_of(self, key: SessionKey) -> dict[str, str]:
        return dict(self._entries.get(key, {}))

    async def pending_entries(self) -> list[SessionKey]:
        return list(self._entries)

    async def drop_entry(self, key: SessionKey, turn_id: str) -> None:
        kept = self._entries.get(key)
        if kept is not None:
            kept.pop(turn_id, None)
            if not kept:
                del self._entries[key]
