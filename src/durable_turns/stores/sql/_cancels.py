"""A SQL store's cancels (F7): written at once, never behind a running step.

A cancel is one write of the chain (``Statements.request_cancel``: the entries' ``cancel``)
when the database's write lock can be had now. Where a running step holds it — a local
tool's step on a dialect with one writer at a time, in this process or another — the cancel
becomes a signal instead (the dialect's :class:`~durable_turns.stores._signals.Signals`,
durable at once) and is folded into the chain as soon as the lock is free; meanwhile the
lease's cancel check and the chain's reads see the signal as the entry's cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ...errors import StoreError
from ...records import ChainEntry, SessionKey
from .._feed import Feed
from .._signals import Signals
from ._statements import Statements

T = TypeVar("T")

__all__ = ["Cancels"]

log = logging.getLogger("durable_turns")

FOLD_BACKOFF = 0.05
"""Seconds before a fold the store refused is tried again; doubled each time, up to 2 s."""


class _Busy(Exception):
    """The write lock is held by another writer: the cancel becomes a signal."""


def _refuse(_c: Any) -> list[str]:
    raise _Busy


class _Dialect(Protocol):
    """What the cancels need of the store's dialect (``sql.Dialect``'s members)."""

    @property
    def signals(self) -> Signals | None: ...

    async def write(self, job: Callable[[Any], T], *,
                    waiting: Callable[[Any], T] | None = None) -> T: ...

    def notify(self, c: Any, key: SessionKey, seq: int | None,
               live: Sequence[str] = ()) -> None: ...

    def atomic(self, c: Any, job: Callable[[Any], T]) -> T: ...


class _Store(Protocol):
    """What the cancels need of their :class:`~durable_turns.stores.sql.SqlStore`."""

    @property
    def dialect(self) -> _Dialect: ...

    @property
    def statements(self) -> Statements: ...

    @property
    def feed(self) -> Feed: ...

    async def transact(self, job: Callable[[Any], T]) -> T: ...

    async def entries(self, key: SessionKey, *, turn_id: str | None = None,
                      unfinished: bool = False) -> list[ChainEntry]: ...


class Cancels:
    """The cancels of one :class:`~durable_turns.stores.sql.SqlStore` (see the module
    docstring).

    Args:
        store: the store.
    """

    def __init__(self, store: _Store) -> None:
        self._store = store
        self._folds: set[asyncio.Task[None]] = set()
        self._folding: set[tuple[SessionKey, str]] = set()
        self._closing = False

    @property
    def _signals(self) -> Signals | None:
        return self._store.dialect.signals

    async def request(self, key: SessionKey, turn_id: str | None, reason: str) -> list[str]:
        """``TurnStore.request_cancel``: the ids of the entries the cancel reached."""
        store, st, signals = self._store, self._store.statements, self._signals

        def cancel(c: Any) -> list[str]:
            ids = st.request_cancel(c, key, turn_id, reason)
            if ids:
                store.dialect.notify(c, key, None)
            return ids

        if signals is None:
            ids = await store.transact(cancel)
        elif signals.blocked():
            ids = await self._signal(signals, key, turn_id, reason)
        else:
            try:
                # Where it would wait for another writer, a signal instead of the wait.
                atomic = store.dialect.atomic
                ids = await store.dialect.write(lambda c: atomic(c, cancel), waiting=_refuse)
            except _Busy:
                ids = await self._signal(signals, key, turn_id, reason)
        if ids:
            store.feed.changed(key)
        return ids

    async def _signal(self, signals: Signals, key: SessionKey, turn_id: str | None,
                      reason: str) -> list[str]:
        open_ = await self._store.entries(key, turn_id=turn_id, unfinished=True)
        ids = await signals.put(key, [t.turn_id for t in open_ if t.cancel is None], reason)
        if ids:
            self._fold(key, ids, reason)
        return ids

    def _fold(self, key: SessionKey, ids: Sequence[str], reason: str) -> None:
        ids = [t for t in ids if (key, t) not in self._folding]
        if not ids or self._closing:
            return  # (closing: the signal stays, for the next store that opens)
        self._folding.update((key, t) for t in ids)
        task = asyncio.get_running_loop().create_task(self._folded(key, ids, reason))
        self._folds.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._folds.discard(t)
            self._folding.difference_update((key, i) for i in ids)

        task.add_done_callback(done)

    async def _folded(self, key: SessionKey, ids: list[str], reason: str) -> None:
        store, st = self._store, self._store.statements
        signals = self._signals
        assert signals is not None

        def fold(c: Any) -> None:
            for t in ids:
                st.request_cancel(c, key, t, reason)
            store.dialect.notify(c, key, None)

        delay = FOLD_BACKOFF
        while True:
            try:
                await store.transact(fold)
                break
            except StoreError as e:
                if self._closing:
                    return  # the signal stays: the next store to open folds it
                log.debug("durable_turns: folding a cancel of %s: %s; again in %.2fs",
                          key, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        await signals.drop(key, ids)
        store.feed.changed(key)

    async def reason(self, key: SessionKey, turn_id: str, stored: str | None) -> str | None:
        """An entry's cancel: ``stored`` (the chain's), else its signal."""
        signals = self._signals
        if stored is not None or signals is None:
            return stored
        return (await signals.of(key)).get(turn_id)

    async def merged(self, key: SessionKey, found: list[ChainEntry]) -> list[ChainEntry]:
        """``found`` with each unfinished entry's signal as its cancel."""
        signals = self._signals
        if signals is None or not found:
            return found
        kept = await signals.of(key)
        if not kept:
            return found
        return [dataclasses.replace(t, cancel=kept[t.turn_id])
                if t.cancel is None and not t.status.final and t.turn_id in kept else t
                for t in found]

    async def open(self) -> None:
        """Fold the signals a store left behind (its process died before their fold)."""
        self._closing = False
        await self._adopted()

    def adopt(self) -> None:
        """Another process kept a signal: fold what is pending, should it die before its own
        fold (a fold of a folded signal changes nothing)."""
        if self._signals is None or self._closing:
            return
        task = asyncio.get_running_loop().create_task(self._adopted())
        self._folds.add(task)
        task.add_done_callback(self._folds.discard)

    async def _adopted(self) -> None:
        signals = self._signals
        if signals is None:
            return
        by: dict[tuple[SessionKey, str], list[str]] = {}
        for key, turn_id, reason in await signals.pending():
            by.setdefault((key, reason), []).append(turn_id)
        for (key, reason), ids in by.items():
            self._fold(key, ids, reason)

    async def close(self) -> None:
        """Let the folds under way end (each waits for the write lock at most as long as a
        write does); one the store refuses stays a signal for the next open."""
        self._closing = True
        while self._folds:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._folds, return_exceptions=True)
