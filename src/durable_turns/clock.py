"""Time as the engine sees it: one :class:`Clock` says what time it is and waits for a time.

Everything that acts at a time (a sleeping tool's wake-up, an input request's deadline, a
schedule's fire) reads the time from a clock and waits on it, never on :func:`time.time` or
:func:`asyncio.sleep` directly, so a test moves time with a :class:`ManualClock` instead of
waiting for it. Times are aware datetimes in UTC.

>>> clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
>>> clock.advance(90)
>>> clock.now().isoformat()
'2026-01-01T00:01:30+00:00'
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock", "utc"]


def utc(when: datetime) -> datetime:
    """``when`` in UTC; a naive datetime is refused (its zone would be a guess)."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{when.isoformat()} has no time zone: pass an aware datetime")
    return when.astimezone(UTC)


@runtime_checkable
class Clock(Protocol):
    """What time it is, and a wait for a time that something else may cut short."""

    def now(self) -> datetime:
        """The time now, aware, in UTC."""
        ...

    async def wait(self, until: datetime | None, interrupt: asyncio.Event) -> None:
        """Return once :meth:`now` has reached ``until`` or ``interrupt`` is set, whichever
        is first (``until=None`` waits for ``interrupt`` alone). The event is not cleared."""
        ...


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def wait(self, until: datetime | None, interrupt: asyncio.Event) -> None:
        if until is None:
            await interrupt.wait()
            return
        delay = (utc(until) - self.now()).total_seconds()
        if delay <= 0:
            return
        # Not asyncio.wait_for: on Python 3.11 a cancel that comes as its wait ends can be
        # lost, and the cancelled waiter waits on (a task that never stops).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await interrupt.wait()


class ManualClock:
    """A clock that moves only when told to: :meth:`advance` or :meth:`set`.

    Waiters on any event loop or thread are woken when the time they wait for is reached.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = utc(start) if start is not None else datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()
        self._waiters: list[tuple[datetime | None, asyncio.AbstractEventLoop, asyncio.Event]] = []

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0.0) -> None:
        """Move the clock ``seconds`` forward (never back)."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds})")
        with self._lock:
            when = self._now + timedelta(seconds=seconds)
        self.set(when)

    def set(self, when: datetime) -> None:
        """Move the clock to ``when``, which may not be before the time it shows."""
        when = utc(when)
        with self._lock:
            if when < self._now:
                raise ValueError(
                    f"a clock does not go back: {when.isoformat()} is before "
                    f"{self._now.isoformat()}"
                )
            self._now = when
            due = [w for w in self._waiters if w[0] is not None and w[0] <= when]
        for _, loop, woken in due:
            loop.call_soon_threadsafe(woken.set)

    async def wait(self, until: datetime | None, interrupt: asyncio.Event) -> None:
        woken = asyncio.Event()
        entry = (None if until is None else utc(until), asyncio.get_running_loop(), woken)
        with self._lock:
            if entry[0] is not None and entry[0] <= self._now:
                return
            self._waiters.append(entry)
        waits = [asyncio.ensure_future(woken.wait()), asyncio.ensure_future(interrupt.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            with self._lock:
                self._waiters.remove(entry)
