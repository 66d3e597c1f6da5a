"""F24: the clocks that everything acting at a time reads: the system's and a manual one for
tests."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import pytest

from durable_turns.clock import Clock, ManualClock, SystemClock, utc

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_both_clocks_are_clocks_and_tell_utc() -> None:
    assert isinstance(SystemClock(), Clock)
    assert isinstance(ManualClock(), Clock)
    assert SystemClock().now().tzinfo is UTC
    assert ManualClock(START).now() == START


def test_a_naive_time_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        utc(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="no time zone"):
        ManualClock(datetime(2026, 1, 1))


def test_a_manual_clock_moves_forward_only() -> None:
    clock = ManualClock(START)
    clock.advance(30)
    assert clock.now() == START + timedelta(seconds=30)
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="does not go back"):
        clock.set(START)


async def test_a_wait_returns_when_the_manual_clock_reaches_its_time() -> None:
    clock = ManualClock(START)
    never = asyncio.Event()
    waiting = asyncio.ensure_future(clock.wait(START + timedelta(hours=1), never))
    await asyncio.sleep(0)
    clock.advance(59 * 60)
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.advance(60)
    await asyncio.wait_for(waiting, 5)


async def test_a_wait_for_a_past_time_returns_at_once() -> None:
    await asyncio.wait_for(ManualClock(START).wait(START, asyncio.Event()), 5)
    await asyncio.wait_for(SystemClock().wait(START, asyncio.Event()), 5)


async def test_an_interrupt_cuts_a_wait_short_on_either_clock() -> None:
    for clock in (ManualClock(START), SystemClock()):
        interrupt = asyncio.Event()
        far = clock.now() + timedelta(days=1)
        waiting = asyncio.ensure_future(clock.wait(far, interrupt))
        await asyncio.sleep(0)
        interrupt.set()
        await asyncio.wait_for(waiting, 5)
        forever = asyncio.ensure_future(clock.wait(None, interrupt))
        await asyncio.wait_for(forever, 5)


async def test_a_manual_clock_moved_from_another_thread_wakes_the_waiter() -> None:
    clock = ManualClock(START)
    waiting = asyncio.ensure_future(clock.wait(START + timedelta(minutes=5), asyncio.Event()))
    await asyncio.sleep(0)
    mover = threading.Thread(target=clock.advance, args=(300,))
    mover.start()
    await asyncio.wait_for(waiting, 5)
    mover.join(5)
