"""F24: the clock loop waits on the runtime's clock for its sources' next due time and has
them fire; a source plugs in through ``runtime.clock_loop.add``."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from durable_turns import Agent, MemoryStore, Runtime
from durable_turns.clock import ManualClock
from durable_turns.scheduling import ClockLoop, DueSource, NoDriveScheduler


class Alarms:
    """A due source of fixed times: fires (records) each once it is due."""

    def __init__(self, *times: datetime) -> None:
        self.pending = sorted(times)
        self.fired: list[tuple[datetime, datetime]] = []
        self.changed = asyncio.Event()

    async def next_due(self) -> datetime | None:
        return self.pending[0] if self.pending else None

    async def fire_due(self, now: datetime) -> None:
        while self.pending and self.pending[0] <= now:
            self.fired.append((self.pending.pop(0), now))
            self.changed.set()

    def arm(self, when: datetime) -> None:
        self.pending = sorted([*self.pending, when])


async def _fired(alarms: Alarms, count: int) -> None:
    async with asyncio.timeout(10):
        while len(alarms.fired) < count:
            alarms.changed.clear()
            await alarms.changed.wait()


async def test_loop_fires_each_source_at_its_time_on_a_manual_clock() -> None:
    clock = ManualClock()
    start = clock.now()
    alarms = Alarms(start + timedelta(seconds=60), start + timedelta(hours=2))
    assert isinstance(alarms, DueSource)
    loop = ClockLoop(clock)
    loop.add(alarms)
    loop.start()
    try:
        looks = await loop.looked(0)
        assert alarms.fired == []
        clock.advance(59)
        looks = await loop.looked(looks)
        assert alarms.fired == []  # not due yet
        clock.advance(1)
        await _fired(alarms, 1)
        assert alarms.fired[0][0] == start + timedelta(seconds=60)
        # Something earlier than the loop waits for is armed: a poke has it look again.
        alarms.arm(start + timedelta(seconds=90))
        loop.poke()
        clock.advance(30)
        await _fired(alarms, 2)
        assert [when for when, _ in alarms.fired] == [start + timedelta(seconds=60),
                                                      start + timedelta(seconds=90)]
    finally:
        await loop.stop()
    assert not loop.running


async def test_a_failing_source_does_not_stop_the_others() -> None:
    clock = ManualClock()

    class Broken:
        async def next_due(self) -> datetime | None:
            raise RuntimeError("store away")

        async def fire_due(self, now: datetime) -> None:
            raise RuntimeError("store away")

    alarms = Alarms(clock.now() + timedelta(seconds=5))
    loop = ClockLoop(clock)
    loop.add(Broken())
    loop.add(alarms)
    loop.start()
    try:
        await loop.looked(0)
        clock.advance(5)
        await _fired(alarms, 1)
    finally:
        await loop.stop()


async def test_runtime_open_starts_its_clock_loop_and_close_stops_it() -> None:
    clock = ManualClock()
    alarms = Alarms(clock.now() + timedelta(minutes=5))
    rt = Runtime([Agent("a")], MemoryStore(), clock=clock)
    assert rt.clock is clock
    remove = rt.clock_loop.add(alarms)
    async with rt:
        assert rt.clock_loop.running
        await rt.clock_loop.looked(0)
        clock.advance(300)
        await _fired(alarms, 1)
        remove()
        assert alarms not in rt.clock_loop.sources
    assert not rt.clock_loop.running
    # A front whose workers drive fires nothing itself.
    front = Runtime([Agent("a")], MemoryStore(), clock=clock, scheduler=NoDriveScheduler())
    async with front:
        assert not front.clock_loop.running
