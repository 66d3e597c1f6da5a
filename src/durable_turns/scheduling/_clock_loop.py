"""The clock loop (F24): one task per runtime that waits on the runtime's clock for the next
due time of any :class:`DueSource` and has each fire what is due.

Everything that acts at a time plugs in here as a due source: the store's wake-ups (a
sleeping tool's, an input request's deadline and reminders: ``scheduling._wakeups``), and
anything else a runtime is given (schedules). The loop knows nothing of what a source fires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from ..clock import Clock

__all__ = ["ClockLoop", "DueSource"]

log = logging.getLogger("durable_turns")

LOOK_EVERY = 30.0
"""Seconds (on the clock) between the loop's looks when no source names an earlier time: what
another process armed without this one hearing of it is found within this."""
STOP_WAIT = 5.0
"""Seconds ``stop`` waits for a look under way before it cancels it."""
RETRY_AFTER = 1.0
"""Seconds (on the clock) before a source that failed is asked again."""


@runtime_checkable
class DueSource(Protocol):
    """Something that has work at times: the seam every timed thing plugs into the clock
    loop through (``runtime.clock_loop.add(source)``).

    The loop calls, on the runtime's event loop, one source at a time:

    - :meth:`fire_due` with the clock's time, at every look (when the time it named came,
      when someone called :meth:`ClockLoop.poke`, and every :data:`LOOK_EVERY` seconds);
    - then :meth:`next_due`, for when to look next.

    A source must be safe to run in many processes at once (several workers, each with a
    runtime and its loop, share one store): it claims what it fires in its store, so each
    due thing fires once (a wake-up's fire is a chain entry whose id is its own, so a second
    fire is a redelivery). A source that raises is logged and asked again after
    :data:`RETRY_AFTER` seconds; the other sources go on.
    """

    async def next_due(self) -> datetime | None:
        """The earliest time this source has something due (aware, UTC), or ``None`` for
        nothing known. A time in the past has the loop look again at once (after the other
        sources): return only what :meth:`fire_due` would fire, or it spins."""
        ...

    async def fire_due(self, now: datetime) -> None:
        """Fire everything due at or before ``now`` (what this process claims of it). It
        should return soon: start long work as chain entries, never run it here."""
        ...


class ClockLoop:
    """Waits on ``clock`` for the next due time of its sources and has them fire.

    A :class:`~durable_turns.Runtime` has one (``runtime.clock_loop``), started by
    ``Runtime.open`` when the runtime steps sessions in this process (the default, and
    ``durable-turns worker``), stopped by ``Runtime.close``.

    Args:
        clock: the time source (a :class:`~durable_turns.clock.ManualClock` in tests).
        look_every: seconds between looks when nothing earlier is known.
    """

    def __init__(self, clock: Clock, *, look_every: float = LOOK_EVERY) -> None:
        if look_every <= 0:
            raise ValueError("look_every must be positive")
        self.clock = clock
        self.look_every = look_every
        self._sources: list[DueSource] = []
        self._poked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._looks = 0
        self._looked = asyncio.Event()
        self._stopping = False
        self._later: asyncio.TimerHandle | None = None

    def add(self, source: DueSource) -> Callable[[], None]:
        """Register ``source`` (also while running: it is asked at once).

        Returns:
            The function that removes it again.
        """
        self._sources.append(source)
        self.poke()

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._sources.remove(source)
        return remove

    @property
    def sources(self) -> tuple[DueSource, ...]:
        """The registered sources, in registration order."""
        return tuple(self._sources)

    def poke(self, *, after: float = 0.0) -> None:
        """Look again: something may have become due earlier than the loop waits for (a
        wake-up was armed). ``after``: in that many seconds (real time), pokes meanwhile
        coalesced into that one (a change heard from another process, which may be one of
        many). Call it on the event loop's thread."""
        if after <= 0:
            self._poked.set()
            return
        if self._later is None:
            def now() -> None:
                self._later = None
                self._poked.set()
            self._later = asyncio.get_running_loop().call_later(after, now)

    @property
    def running(self) -> bool:
        """Whether the loop's task runs."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the loop's task on the running event loop (nothing if it runs)."""
        if not self.running:
            self._task = asyncio.create_task(self._run(), name="durable-turns clock loop")

    def halt(self) -> None:
        """Tell the loop to stop, without waiting (it looks no more; a look under way ends);
        :meth:`stop` waits for it."""
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if self._task is not None:
            # Told through its interrupt rather than cancelled: a clock's wait ends as the
            # protocol says it does, whatever its implementation makes of a cancel (on
            # Python 3.11, asyncio.wait_for can keep a cancelled waiter waiting).
            self._stopping = True
            self._poked.set()

    async def stop(self) -> None:
        """Stop the loop's task and wait for it (a look under way ends first)."""
        self.halt()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            async with asyncio.timeout(STOP_WAIT):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            self._stopping = False

    async def looked(self, after: int, *, timeout: float = 10.0) -> int:
        """Wait (real time, at most ``timeout`` s) until the loop finished look number
        ``after + 1`` or later; returns the count of looks. For tests that move a
        :class:`~durable_turns.clock.ManualClock` and wait for what it fired.

        Raises:
            TimeoutError: no such look in time.
        """
        async with asyncio.timeout(timeout):
            while self._looks <= after:
                self._looked.clear()
                await self._looked.wait()
        return self._looks

    @property
    def looks(self) -> int:
        """How many looks the loop finished."""
        return self._looks

    async def look(self) -> datetime | None:
        """One look: every source fires what is due now; returns the earliest time any
        names next (``None``: none), a source that failed counting as due soon."""
        now = self.clock.now()
        soonest: datetime | None = None
        for source in list(self._sources):
            try:
                await source.fire_due(now)
                when = await source.next_due()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("clock loop: %r failed; asking it again in %.0fs", source,
                              RETRY_AFTER)
                when = now + timedelta(seconds=RETRY_AFTER)
            if when is not None and (soonest is None or when < soonest):
                soonest = when
        return soonest

    async def _run(self) -> None:
        while not self._stopping:
            self._poked.clear()
            soonest = await self.look()
            self._looks += 1
            self._looked.set()
            latest = self.clock.now() + timedelta(seconds=self.look_every)
            until = latest if soonest is None or soonest > latest else soonest
            if self._stopping:
                return
            if until <= self.clock.now():
                await asyncio.sleep(0)  # due again already: let the fired work start
                continue
            await self.clock.wait(until, self._poked)
