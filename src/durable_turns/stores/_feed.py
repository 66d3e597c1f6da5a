"""A store's event feed: per-session topics that fan stored events out to subscribers (part
of the public store kit: a new backend makes one and tells it what it learns).

Every store owns one :class:`Feed`. It learns of new events in two ways:

- ``published(key, events)``: this process committed them. They are handed to subscribers
  at once, without a read, when they follow the last event the topic knows (the common case);
  after a gap (another process committed in between) the topic reads the store instead.
- ``changed(key)`` / ``changed_any()``: something may have changed elsewhere (the store's own
  wake-up: another process's commit seen by SQLite's change counter, a PostgreSQL
  NOTIFY, a cancel). The topic reads what it has not seen yet, once for all its
  subscribers, and watchers are told.

A :class:`Subscription` replays the stored events after its cursor, then goes live, with no gap
and no duplicate: it registers with the topic *before* reading its backlog, buffers what
arrives meanwhile, and drops anything at or below its cursor. Live, non-durable events
(``message.delta``) reach it through :meth:`Feed.live` (published in this process, or
received from another by the store's ``LiveRelay``) and are ordered by the durable ``seq``
they follow: one whose durable event has not come yet is held until it comes (at most
:data:`MAX_HELD` of them), one whose durable successor was handed over already is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..events import TurnEvent
from . import Watcher

if TYPE_CHECKING:
    from ..records import SessionKey

__all__ = ["MAX_HELD", "Feed", "Newest", "ReadAfter", "Subscription"]

log = logging.getLogger("durable_turns")

ReadAfter = Callable[["SessionKey", int], Awaitable[list[TurnEvent]]]
"""Reads a session's stored events after a seq, in order."""
Newest = Callable[["SessionKey"], Awaitable[int]]
"""Reads a session's newest stored seq (0 when none)."""
MAX_HELD = 4096
"""Live events a subscription holds while it waits for the durable event they follow; past
that the oldest go (live text is best effort: ``message.completed`` carries it whole)."""


class _Topic:
    __slots__ = ("again", "error", "key", "last", "reader", "ready", "subs", "watchers")

    def __init__(self, key: SessionKey) -> None:
        self.key = key
        self.subs: list[Subscription] = []
        self.watchers: list[Watcher] = []
        self.last: int | None = None
        """The newest seq handed to subscribers (``None`` until known)."""
        self.ready = asyncio.Event()
        self.reader: asyncio.Task[None] | None = None
        self.again = False
        self.error: BaseException | None = None
        """Why the store cannot be read for this topic now (its subscribers were told)."""

    def failed(self, e: BaseException, what: str) -> None:
        """A read failed: tell the subscribers once per outage (they go on, and resume from
        their cursor when the store answers again)."""
        if self.error is None:
            log.warning("event feed of %s could not %s (it goes on at the next change): %s",
                        self.key, what, e)
            for s in list(self.subs):
                s._outage(e)
        self.error = e

    def recovered(self) -> None:
        if self.error is not None:
            self.error = None
            log.warning("event feed of %s reads again", self.key)
            for s in list(self.subs):
                s._outage(None)

    def deliver(self, events: list[TurnEvent]) -> None:
        for e in events:
            if self.last is None or e.seq > self.last:
                self.last = e.seq
                for s in list(self.subs):
                    s._push(e)


class Feed:
    """Fans a store's events out per session; see the module docstring.

    Args:
        read_after: reads a session's stored events after a seq, in order.
        newest: the session's newest stored seq (0 when none).
        on_active: called when the feed gets its first topic (a store starts its change
            detector then; :attr:`active` tells it when to stop).
    """

    def __init__(self, read_after: ReadAfter, newest: Newest,
                 on_active: Callable[[], None] | None = None) -> None:
        self._read_after = read_after
        self._newest = newest
        self._on_active = on_active
        self._topics: dict[SessionKey, _Topic] = {}
        self._everyone: list[Watcher] = []  # watchers of every session (a worker's)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    @property
    def active(self) -> bool:
        """Whether anyone subscribes to or watches any session."""
        return bool(self._topics or self._everyone)

    # -- what the store tells the feed -----------------------------------------------------

    def published(self, key: SessionKey, events: list[TurnEvent]) -> None:
        """This process committed ``events`` (in seq order) for ``key``."""
        topic = self._topics.get(key)
        if topic is None or not events:
            return
        for w in list(topic.watchers):
            w(events)
        if not topic.subs:
            return
        if topic.last is None or events[0].seq <= topic.last + 1:
            topic.deliver(events)
        else:
            self._reread(topic)

    def changed(self, key: SessionKey, seq: int | None = None) -> None:
        """Something of ``key`` may have changed elsewhere: read it, tell the watchers.

        With ``seq``, the change is known to be events up to ``seq`` only (the chain did not
        change): watchers of every session (workers looking for work) are not told, and the
        session's subscribers read nothing if they have that event already.
        """
        if seq is None:
            for w in list(self._everyone):
                w(None)
        topic = self._topics.get(key)
        if topic is None:
            return
        for w in list(topic.watchers):
            w(None)
        if topic.subs and (seq is None or topic.last is None or seq > topic.last):
            self._reread(topic)

    def live(self, key: SessionKey, event: TurnEvent) -> None:
        """A live event of ``key`` (never stored): offered to its subscribers that take live
        events, after the durable event whose ``seq`` it carries."""
        topic = self._topics.get(key)
        if topic is None:
            return
        for s in list(topic.subs):
            if s.live:
                s.offer(event)

    def takes_live(self, key: SessionKey) -> bool:
        """Whether a subscriber of ``key`` in this process takes live events."""
        topic = self._topics.get(key)
        return topic is not None and any(s.live for s in topic.subs)

    def changed_any(self) -> None:
        """Something may have changed elsewhere, in any session."""
        for w in list(self._everyone):
            w(None)
        for key in list(self._topics):
            topic = self._topics.get(key)
            if topic is None:
                continue
            for w in list(topic.watchers):
                w(None)
            if topic.subs:
                self._reread(topic)

    # -- subscribers and watchers ----------------------------------------------------------

    def subscribe(self, key: SessionKey, after_seq: int | None, *,
                  live: bool = True) -> Subscription:
        """A :class:`Subscription` of ``key``'s events after ``after_seq``, live events
        included unless ``live`` is false (``TurnStore.subscribe``)."""
        return Subscription(self, key, after_seq, live=live)

    def watch(self, key: SessionKey | None, watcher: Watcher) -> Callable[[], None]:
        """Watch ``key`` (``None``: every session); returns the function that stops it
        (``TurnStore.watch``)."""
        if key is None:
            first = not self.active
            self._everyone.append(watcher)
            if first and self._on_active is not None:
                self._on_active()

            def unwatch_all() -> None:
                if watcher in self._everyone:
                    self._everyone.remove(watcher)

            return unwatch_all
        topic = self._topic(key)
        topic.watchers.append(watcher)

        def unwatch() -> None:
            if watcher in topic.watchers:
                topic.watchers.remove(watcher)
                self._drop_if_idle(topic)

        return unwatch

    def close(self) -> None:
        """Stop every subscription (they end) and every read in flight."""
        self._closed = True
        for topic in list(self._topics.values()):
            for s in list(topic.subs):
                s.close()
            topic.watchers.clear()
        for t in list(self._tasks):
            t.cancel()
        self._topics.clear()
        self._everyone.clear()

    def _topic(self, key: SessionKey) -> _Topic:
        topic = self._topics.get(key)
        if topic is None:
            first = not self.active
            topic = self._topics[key] = _Topic(key)
            if first and self._on_active is not None:
                self._on_active()
        return topic

    def _attach(self, key: SessionKey, sub: Subscription) -> _Topic:
        topic = self._topic(key)
        topic.subs.append(sub)
        return topic

    def _start(self, topic: _Topic) -> None:
        """Learn the topic's newest seq, once, when a subscriber first needs it."""
        if topic.reader is None and not topic.ready.is_set():
            topic.reader = self._spawn(self._init(topic))

    def _detach(self, topic: _Topic, sub: Subscription) -> None:
        if sub in topic.subs:
            topic.subs.remove(sub)
            if not topic.subs:
                # Nobody reads the topic now, so nothing keeps ``last`` current: the next
                # subscriber starts it afresh.
                if topic.reader is not None:
                    topic.reader.cancel()
                    topic.reader = None
                topic.ready.clear()
                topic.last = None
            self._drop_if_idle(topic)

    def _drop_if_idle(self, topic: _Topic) -> None:
        if not topic.subs and not topic.watchers and self._topics.get(topic.key) is topic:
            del self._topics[topic.key]
            if topic.reader is not None:
                topic.reader.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        if self._closed:
            coro.close()
            return None
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _init(self, topic: _Topic) -> None:
        try:
            newest = await self._newest(topic.key)
            topic.last = max(topic.last or 0, newest)
            for s in topic.subs:
                if s.cursor is None:
                    s.cursor = topic.last
            topic.ready.set()
            topic.reader = None
            topic.recovered()
            for s in topic.subs:
                s._wake.set()
            if topic.again:
                self._reread(topic)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            topic.reader = None
            if not self._closed:
                # A subscriber waiting in ready() is told (it raises); the next one starts
                # the topic again.
                topic.failed(e, "start")
                for s in topic.subs:
                    s._wake.set()

    def _reread(self, topic: _Topic) -> None:
        if topic.reader is not None:
            topic.again = True
            return
        if not topic.ready.is_set():
            topic.reader = self._spawn(self._init(topic))
            topic.again = True
            return
        topic.reader = self._spawn(self._read(topic))

    async def _read(self, topic: _Topic) -> None:
        try:
            while True:
                topic.again = False
                events = await self._read_after(topic.key, topic.last or 0)
                topic.recovered()
                topic.deliver(events)
                if not topic.again:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not self._closed:
                topic.failed(e, "read")
        finally:
            if topic.reader is asyncio.current_task():
                topic.reader = None


class Subscription:
    """A session's events after a cursor, then live ones: ``async for event in sub``.

    Use as ``async with store.subscribe(key, after_seq) as sub`` (or call :meth:`close`).
    Iteration ends when the subscription (or its store) is closed.
    """

    def __init__(self, feed: Feed, key: SessionKey, after_seq: int | None, *,
                 live: bool = True) -> None:
        self.key = key
        self.cursor: int | None = after_seq
        """The seq of the last durable event handed over (or to start after)."""
        self.live = live
        """Whether it takes live events (``message.delta``, retries)."""
        self._feed = feed
        self._queue: deque[TurnEvent] = deque()
        self._held: deque[TurnEvent] = deque()  # deltas whose durable event has not come yet
        self._pending: list[tuple[bool, TurnEvent]] | None = [] if after_seq is not None else None
        self._wake = asyncio.Event()
        self._closed = False
        self._started = False
        self._on_close: list[Callable[[], None]] = []
        self._on_outage: list[Callable[[BaseException | None], None]] = []
        self._callback: Callable[[TurnEvent], None] | None = None
        self._topic = feed._attach(key, self)
        if after_seq is None and self._topic.ready.is_set():
            self.cursor = self._topic.last

    async def ready(self) -> None:
        """Wait until the cursor is fixed (``after_seq=None``: at the newest event then) and
        the backlog is queued. Events committed after ``ready()`` returns are delivered.

        Raises:
            StoreError: the store could not be read (the subscription is closed then).
        """
        if self._started:
            return
        self._started = True
        try:
            await self._fix()
        except BaseException:
            self.close()
            raise

    async def _fix(self) -> None:
        topic = self._topic
        topic.error = None if not topic.ready.is_set() else topic.error
        self._feed._start(topic)
        while not topic.ready.is_set():
            if self._closed:
                return
            if topic.error is not None and topic.reader is None:
                raise topic.error
            self._wake.clear()
            await self._wake.wait()
        if self._pending is not None and not self._closed:
            backlog = await self._feed._read_after(self.key, self.cursor or 0)
            pending, self._pending = self._pending, None
            for e in backlog:
                self._push(e)
            for durable, e in pending:
                if durable:
                    self._push(e)
                else:
                    self.offer(e)

    def offer(self, event: TurnEvent) -> None:
        """Hand over a live event that is not stored (``message.delta``): it is delivered
        right after the durable event whose ``seq`` it carries."""
        if self._closed:
            return
        if self._pending is not None:
            self._pending.append((False, event))
        elif self.cursor is None or event.seq == self.cursor:
            self._hand(event)
        elif event.seq > self.cursor:
            if len(self._held) >= MAX_HELD:
                self._held.popleft()
            self._held.append(event)

    def deliver_to(self, callback: Callable[[TurnEvent], None]) -> None:
        """Hand events to ``callback`` as they come, instead of queueing them for iteration.

        Live events reach it synchronously, as the store publishes them, so a callback has
        seen a turn's events by the time that turn's ``result()`` returns in this process.
        A callback that raises is logged; the subscription goes on. Call :meth:`ready` (in a
        task) so that a backlog, if any, is read.
        """
        self._callback = callback
        queued, self._queue = list(self._queue), deque()
        for e in queued:
            self._hand(e)

    def _hand(self, event: TurnEvent) -> None:
        if self._callback is None:
            self._queue.append(event)
            self._wake.set()
            return
        try:
            self._callback(event)
        except Exception:
            log.exception("subscriber of %s failed on %s", self.key, event.type)

    def _push(self, event: TurnEvent) -> None:
        if self._pending is not None:
            self._pending.append((True, event))
            return
        if self.cursor is not None and event.seq <= self.cursor:
            return
        held = self._held
        while held and held[0].seq < event.seq:
            self._hand(held.popleft())
        self.cursor = event.seq
        self._hand(event)
        while held and held[0].seq == event.seq:
            self._hand(held.popleft())

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> TurnEvent:
        if not self._started:
            await self.ready()
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()
        return self._queue.popleft()

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the subscription closes."""
        self._on_close.append(fn)

    def on_outage(self, fn: Callable[[BaseException | None], None]) -> None:
        """Call ``fn(error)`` when the store cannot be read for this subscription (it stays
        open, and resumes from its cursor, with no gap, once the store answers again), and
        ``fn(None)`` when it answers again."""
        self._on_outage.append(fn)

    def _outage(self, error: BaseException | None) -> None:
        for fn in self._on_outage:
            try:
                fn(error)
            except Exception:
                log.exception("outage callback of %s failed", self.key)

    def close(self) -> None:
        """End the subscription: its iteration ends, its close callbacks run."""
        if not self._closed:
            self._closed = True
            self._wake.set()
            self._feed._detach(self._topic, self)
            for fn in self._on_close:
                fn()

    async def aclose(self) -> None:
        """:meth:`close`, awaitable."""
        self.close()

    async def __aenter__(self) -> Subscription:
        await self.ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
