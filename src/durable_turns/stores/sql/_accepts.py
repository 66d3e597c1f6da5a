"""A SQL store's accepts that never wait behind a running step (F25: a steer).

A command accepted with ``NewEntry.at_once`` (a joining command: a steer) must be durable
as soon as ``start()`` returns, also while a local tool runs — and a local tool runs inside
its step's transaction, which on a dialect with one writer at a time (SQLite's file lock, the
memory store's connection) holds the write lock for as long as the tool runs, in this
process or another. So where the lock is held, the entry is kept as a signal instead (the
dialect's :class:`~durable_turns.stores._signals.Signals`, durable at once) and *folded*
into the chain — appended, as an accept would have — as soon as the lock is free:

- by this store's fold, which waits for the lock;
- by the first read of the session's chain that may write (no step of this process holds
  the lock), before it reads: the driver's look at a turn's model-call boundary, right after
  the tool's step committed, so the steer joins there (a driver's read never shows an entry
  still kept: it joins or applies only what the chain has);
- by the next store that opens the storage, or that hears of it (SQLite's change detector),
  should its accepting process die first.

A fold of a folded entry changes nothing (an id the chain has is a redelivery), so a crash
between a fold and its signal's drop loses nothing and appends nothing twice. Meanwhile the
chain's other reads show a kept entry as queued, after the stored ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ...errors import StoreError
from ...records import ChainEntry, NewEntry, SessionKey, TurnStatus
from .._feed import Feed
from .._signals import Signals
from ._statements import Statements

T = TypeVar("T")

__all__ = ["Accepts"]

log = logging.getLogger("durable_turns")

FOLD_BACKOFF = 0.05
"""Seconds before a fold the store refused is tried again; doubled each time, up to 2 s."""
_FIELDS = ("turn_id", "kind", "args", "event", "policy", "supersede", "deliver", "data",
           "while_parked")
"""What a kept command keeps of its ``NewEntry`` (a command has no opening message)."""


class _Busy(Exception):
    """The write lock is held by another writer: the entry is kept as a signal."""


def _refuse(_c: Any) -> Any:
    raise _Busy


class _Dialect(Protocol):
    @property
    def signals(self) -> Signals | None: ...

    async def write(self, job: Callable[[Any], T], *,
                    waiting: Callable[[Any], T] | None = None) -> T: ...

    def notify(self, c: Any, key: SessionKey, seq: int | None,
               live: Any = ()) -> None: ...

    def atomic(self, c: Any, job: Callable[[Any], T]) -> T: ...


class _Reads(Protocol):
    async def entries(self, key: SessionKey, *, turn_id: str | None = None,
                      unfinished: bool = False) -> list[ChainEntry]: ...


class _Store(Protocol):
    """What the accepts need of their :class:`~durable_turns.stores.sql.SqlStore`."""

    @property
    def dialect(self) -> _Dialect: ...

    @property
    def statements(self) -> Statements: ...

    @property
    def feed(self) -> Feed: ...

    @property
    def reads(self) -> _Reads: ...

    async def transact(self, job: Callable[[Any], T]) -> T: ...


def _encode(entry: NewEntry) -> str:
    return json.dumps({f: getattr(entry, f) for f in _FIELDS})


def _decode(body: str) -> NewEntry:
    return NewEntry(**json.loads(body))


class Accepts:
    """The at-once accepts of one :class:`~durable_turns.stores.sql.SqlStore` (see the module
    docstring).

    Args:
        store: the store.
    """

    def __init__(self, store: _Store) -> None:
        self._store = store
        self._folds: dict[SessionKey, asyncio.Task[None]] = {}
        self._closing = False

    @property
    def _signals(self) -> Signals | None:
        return self._store.dialect.signals

    async def enqueue(self, key: SessionKey, entry: NewEntry) -> tuple[ChainEntry, bool] | None:
        """``TurnStore.enqueue`` of an at-once command: written now, or kept as a signal where
        the write would wait; ``None`` for any other entry (the store accepts it as usual)."""
        signals = self._signals
        if signals is None or not entry.at_once or entry.kind == "turn":
            return None
        store, st = self._store, self._store.statements

        def accept(c: Any) -> tuple[ChainEntry, bool]:
            out = st.enqueue(c, key, entry)
            if out[1]:
                store.dialect.notify(c, key, None)
            return out

        if not signals.blocked():
            try:
                atomic = store.dialect.atomic
                out: tuple[ChainEntry, bool] = await store.dialect.write(
                    lambda c: atomic(c, accept), waiting=_refuse)
            except _Busy:
                pass  # another process's step holds the lock: a signal instead of the wait
            else:
                if out[1]:
                    store.feed.changed(key)
                return out
        found = await store.reads.entries(key, turn_id=entry.turn_id)
        if found:
            return found[0], False
        new = await signals.put_entry(key, entry.turn_id, _encode(entry))
        if new:
            self._fold_later(key)
            store.feed.changed(key)
        kept = await self._kept(signals, key, [])
        return next(e for e in kept if e.turn_id == entry.turn_id), new

    async def _kept(self, signals: Signals, key: SessionKey,
                    found: list[ChainEntry]) -> list[ChainEntry]:
        """The session's kept entries as queued chain entries, after every stored one."""
        bodies = await signals.entries_of(key)
        if not bodies:
            return []
        stored = await self._store.reads.entries(key)
        have = {e.turn_id for e in stored} | {e.turn_id for e in found}
        last = max((e.ordinal for e in stored), default=0)
        out = []
        for body in bodies.values():
            e = _decode(body)
            if e.turn_id in have:
                continue  # folded, its signal not dropped yet
            last += 1
            out.append(ChainEntry(e.turn_id, last, TurnStatus.QUEUED, None, e.event, e.policy,
                                  kind=e.kind, args=e.args, data=e.data, deliver=e.deliver))
        return out

    async def merged(self, key: SessionKey, found: list[ChainEntry], read: Callable[
            [], Any], *, turn_id: str | None, unfinished: bool) -> list[ChainEntry]:
        """The chain's entries ``found``, the session's kept ones folded first where this
        process may write now (then read again with ``read``).

        A driver's read (``unfinished``) waits for the fold, as its next commit would, and
        never shows an entry still kept: a driver joins or applies only what the chain has.
        Any other read never waits: what it could not fold shows queued, after the rest."""
        signals = self._signals
        if signals is None or not await signals.entries_of(key):
            return found
        if not signals.blocked():
            with contextlib.suppress(StoreError, _Busy):  # (then kept, folded later)
                await self.fold(key, wait=unfinished)
                found = await read()
        if unfinished:
            return found
        kept = await self._kept(signals, key, found)
        return found + [e for e in kept if turn_id is None or e.turn_id == turn_id]

    async def fold(self, key: SessionKey, *, wait: bool = True) -> None:
        """Append the session's kept entries to its chain, and forget them; ``wait=False``
        refuses (``_Busy``) where the write would wait for another writer."""
        signals = self._signals
        if signals is None:
            return
        store, st = self._store, self._store.statements
        atomic = store.dialect.atomic
        bodies = await signals.entries_of(key)
        for turn_id, body in bodies.items():
            entry = _decode(body)

            def accept(c: Any, entry: NewEntry = entry) -> None:
                if st.enqueue(c, key, entry)[1]:
                    store.dialect.notify(c, key, None)

            if wait:
                await store.transact(accept)
            else:
                def once(c: Any, job: Callable[[Any], None] = accept) -> None:
                    atomic(c, job)

                await store.dialect.write(once, waiting=_refuse)
            await signals.drop_entry(key, turn_id)
        if bodies:
            store.feed.changed(key)

    def _fold_later(self, key: SessionKey) -> None:
        if self._closing or key in self._folds:
            return  # (closing: the signal stays, for the next store that opens)
        task = asyncio.get_running_loop().create_task(self._folded(key))
        self._folds[key] = task
        task.add_done_callback(lambda _t: self._folds.pop(key, None))

    async def _folded(self, key: SessionKey) -> None:
        delay = FOLD_BACKOFF
        while True:
            try:
                await self.fold(key)
                return
            except StoreError as e:
                if self._closing:
                    return  # the signal stays: the next store to open folds it
                log.debug("durable_turns: folding an accept of %s: %s; again in %.2fs",
                          key, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def open(self) -> None:
        """Fold the entries a store left kept (its process died before their fold)."""
        self._closing = False
        await self._adopted()

    def adopt(self) -> None:
        """Another process kept an entry: fold what is pending, should it die before its own
        fold (a fold of a folded entry changes nothing)."""
        if self._signals is None or self._closing:
            return
        task = asyncio.get_running_loop().create_task(self._adopted())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _adopted(self) -> None:
        signals = self._signals
        if signals is None:
            return
        for key in await signals.pending_entries():
            self._fold_later(key)

    async def close(self) -> None:
        """Let the folds under way end; one the store refuses stays kept for the next open."""
        self._closing = True
        while self._folds:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._folds.values(), return_exceptions=True)
