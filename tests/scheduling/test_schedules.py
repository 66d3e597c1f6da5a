"""F24 schedules: ``runtime.schedule`` stores them, the runtime's clock loop fires them (a
ManualClock moves time), each fire's turn id is the schedule's and its time's, ``overlap``
and ``missed`` decide what a fire does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from durable_turns import Agent, MemoryStore, Runtime, SqliteStore, tool
from durable_turns.clock import ManualClock
from durable_turns.errors import UnknownAgentError
from durable_turns.records import SessionKey
from durable_turns.schedule_fires import fire_until
from durable_turns.schedules import Schedule, ScheduleError, UnknownScheduleError, fire_turn_id
from durable_turns.stores import SessionStore
from durable_turns.testing import TestModel

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)  # a Monday
KEY = SessionKey("ops", "schedule:report")


class Gate:
    """What the agent's one tool waits on: a turn that calls it stays running until opened."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.entered = asyncio.Event()
        self.calls = 0


def ops_agent(gate: Gate | None = None) -> Agent:
    tools = []
    if gate is not None:
        @tool
        async def hold() -> str:
            """Wait for the gate."""
            gate.calls += 1
            gate.entered.set()
            await gate.opened.wait()
            return "done"
        tools.append(hold)
    return Agent(name="ops", instructions="Report.", tools=tools, model=TestModel())


@pytest.fixture
async def clock() -> ManualClock:
    return ManualClock(T0)


def runtime(store: SessionStore, clock: ManualClock, gate: Gate | None = None) -> Runtime:
    return Runtime([ops_agent(gate)], store, clock=clock)


@pytest.fixture
async def rt(clock: ManualClock) -> AsyncIterator[Runtime]:
    async with runtime(MemoryStore(), clock) as r:
        yield r


async def turns_of(r: Runtime, key: SessionKey = KEY) -> list[tuple[str, str]]:
    return [(e.turn_id, e.status.value) for e in await r.store.entries(key)]


async def caught_up(r: Runtime, clock: ManualClock) -> None:
    """Wait (real time, bounded) until the clock loop fired every schedule due at the clock's
    time: each one's next fire is later (it moves on once its fire's turn is stored), one
    look at a time (a look after the last change comes)."""
    looks = r.clock_loop.looks
    async with asyncio.timeout(10):
        while any(s.next_fire is not None and s.next_fire <= clock.now()
                  for s in await r.schedules()):
            looks = await r.clock_loop.looked(looks)


async def advance(r: Runtime, clock: ManualClock, seconds: float) -> None:
    """Move the clock and wait until the loop fired what became due."""
    clock.advance(seconds)
    await caught_up(r, clock)


async def test_bad_input_is_a_clear_error_and_stores_nothing(rt: Runtime) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"every": 60, "cron": "* * * * *"}, "exactly one of cron=, every= or at="),
        ({}, "exactly one of cron=, every= or at=, not none"),
        ({"cron": "61 * * * *"}, "does not parse"),
        ({"cron": "0 9 * * *", "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"every": 60, "overlap": "maybe"}, "overlap must be one of skip, queue, replace"),
        ({"every": 60, "missed": "all"}, "missed must be one of skip, run_once"),
        ({"every": 0}, "every must be a number of seconds from 1 to"),
        ({"at": "tomorrow"}, "no ISO 8601 time"),
        ({"every": 60, "target": {"channel_id": "C1"}}, "needs the channel"),
        ({"every": 60, "colour": "red"}, "a schedule has no colour"),
    ]
    for spec, message in bad:
        with pytest.raises(ScheduleError, match=message):
            await rt.schedule("report", agent="ops", seed="Post it", **spec)
    with pytest.raises(ScheduleError, match="schedule name"):
        await rt.schedule("no spaces", agent="ops", seed="Post it", every=60)
    with pytest.raises(ScheduleError, match="needs a seed"):
        await rt.schedule("report", agent="ops", seed=" ", every=60)
    with pytest.raises(UnknownAgentError):
        await rt.schedule("report", agent="nobody", seed="Post it", every=60)
    assert await rt.schedules() == []
    with pytest.raises(UnknownScheduleError, match="no schedule named 'report'"):
        await rt.unschedule("report")


async def test_cron_is_read_in_its_time_zone() -> None:
    s = Schedule.define("standup", agent="ops", seed="Standup", cron="0 9 * * 1-5",
                        tz="Europe/Paris", start=T0)
    assert s.next_fire == datetime(2026, 1, 5, 8, 0, tzinfo=UTC) + timedelta(days=1)  # 09:00 CET
    assert s.after(datetime(2026, 1, 9, 9, 0, tzinfo=UTC)) == datetime(2026, 1, 12, 8, 0,
                                                                       tzinfo=UTC)  # Monday
    summer = Schedule.define("standup", agent="ops", seed="Standup", cron="0 9 * * *",
                             tz="Europe/Paris", start=datetime(2026, 7, 1, tzinfo=UTC))
    assert summer.next_fire == datetime(2026, 7, 1, 7, 0, tzinfo=UTC)  # 09:00 CEST


async def test_each_fire_starts_one_turn_named_by_its_time(rt: Runtime,
                                                          clock: ManualClock) -> None:
    s = await rt.schedule("report", agent="ops", seed="Post the report", every=60)
    assert s.next_fire == T0 + timedelta(seconds=60)
    assert [x.name for x in await rt.schedules()] == ["report"]
    await advance(rt, clock, 59)
    assert await turns_of(rt) == []
    for n in (1, 2):
        await advance(rt, clock, 60 if n == 2 else 1)
        turn_id = fire_turn_id("report", T0 + timedelta(seconds=60 * n))
        result = await rt.wait(KEY, turn_id, timeout=10)
        assert result.status.value == "completed"
    assert [t for t, _ in await turns_of(rt)] == [
        "schedule:report:20260105T080100Z", "schedule:report:20260105T080200Z"]
    opening = (await rt.store.read_messages(KEY))[0]
    assert (opening.role, opening.text, opening.by) == ("trigger", "Post the report",
                                                       "schedule:report")
    (stored,) = await rt.schedules()
    assert stored.last_turn == "schedule:report:20260105T080200Z"
    assert stored.next_fire == T0 + timedelta(seconds=180)
    assert await rt.fires.turns(stored) == [t for t, _ in await turns_of(rt)]
    await rt.unschedule("report")
    await advance(rt, clock, 600)
    assert len(await turns_of(rt)) == 2


async def test_an_at_schedule_fires_once(rt: Runtime, clock: ManualClock) -> None:
    await rt.schedule("once", agent="ops", seed="Once", at=T0 + timedelta(minutes=5))
    await advance(rt, clock, 300)
    await rt.wait(SessionKey("ops", "schedule:once"), fire_turn_id("once", T0 + timedelta(
        minutes=5)), timeout=10)
    (s,) = await rt.schedules()
    assert s.next_fire is None and s.last_fire == T0 + timedelta(minutes=5)
    await advance(rt, clock, 3600)
    assert len(await turns_of(rt, SessionKey("ops", "schedule:once"))) == 1


async def test_an_at_already_past_when_defined_fires_at_once(rt: Runtime,
                                                           clock: ManualClock) -> None:
    past = T0 - timedelta(days=3)
    await rt.schedule("late", agent="ops", seed="Late", at=past)  # missed="skip" (default)
    await caught_up(rt, clock)  # the new schedule had the loop look again
    result = await rt.wait(SessionKey("ops", "schedule:late"), fire_turn_id("late", past),
                           timeout=10)
    assert result.status.value == "completed"


@pytest.mark.parametrize("overlap", ["skip", "queue", "replace"])
async def test_overlap_with_a_turn_still_running(overlap: str, clock: ManualClock) -> None:
    gate = Gate()
    async with runtime(MemoryStore(), clock, gate) as r:
        await r.schedule("report", agent="ops", seed="Report", every=60, overlap=overlap)
        await advance(r, clock, 60)
        async with asyncio.timeout(10):
            await gate.entered.wait()  # the first fire's turn runs, inside its tool
        first, second = (fire_turn_id("report", T0 + timedelta(seconds=60 * n)) for n in (1, 2))
        await advance(r, clock, 60)
        if overlap == "skip":
            assert await turns_of(r) == [(first, "running")]
            (s,) = await r.schedules()
            assert (s.last_fire, s.last_turn) == (T0 + timedelta(seconds=120), first)
        else:
            assert await turns_of(r) == [(first, "running"), (second, "queued")]
        gate.opened.set()  # the tool returns: a cancel takes effect at that boundary
        assert (await r.wait(KEY, first, timeout=10)).status.value == (
            "cancelled" if overlap == "replace" else "completed")
        if overlap != "skip":
            assert (await r.wait(KEY, second, timeout=10)).status.value == "completed"
        await advance(r, clock, 60)  # the next fire finds nothing running: it starts
        third = fire_turn_id("report", T0 + timedelta(seconds=180))
        assert (await r.wait(KEY, third, timeout=10)).status.value == "completed"
        assert [t for t, _ in await turns_of(r)] == (
            [first, third] if overlap == "skip" else [first, second, third])


@pytest.mark.parametrize("missed", ["run_once", "skip"])
async def test_missed_after_a_downtime_covering_three_fire_times(
        missed: str, clock: ManualClock, tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    async with runtime(SqliteStore(db), clock) as r:
        await r.schedule("report", agent="ops", seed="Report", every=60, missed=missed)
    clock.advance(200)  # no process runs at 08:01, 08:02, 08:03
    async with runtime(SqliteStore(db), clock) as r:
        await caught_up(r, clock)
        (s,) = await r.schedules()
        assert s.next_fire == T0 + timedelta(seconds=240)
        if missed == "run_once":
            latest = fire_turn_id("report", T0 + timedelta(seconds=180))
            assert (await r.wait(KEY, latest, timeout=10)).status.value == "completed"
            assert [t for t, _ in await turns_of(r)] == [latest]
        else:
            assert await turns_of(r) == []
        await advance(r, clock, 40)  # 08:04 is on time again
        on_time = fire_turn_id("report", T0 + timedelta(seconds=240))
        assert (await r.wait(KEY, on_time, timeout=10)).status.value == "completed"
        assert len(await turns_of(r)) == (2 if missed == "run_once" else 1)


async def test_a_schedule_defined_again_keeps_its_times(clock: ManualClock,
                                                        tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    async with runtime(SqliteStore(db), clock) as r:
        first = await r.schedule("report", agent="ops", seed="Report", every=60,
                                 missed="run_once")
    clock.advance(130)
    async with runtime(SqliteStore(db), clock) as r:
        r.clock_loop.clock = clock
        # An app folder puts its schedules at each start: the same one keeps its times...
        assert (await r.fires.define("report", agent="ops", seed="Report", every=60,
                                     missed="run_once")).next_fire == first.next_fire
        # ...another definition replaces it.
        other = await r.schedule("report", agent="ops", seed="Report", every=3600)
        assert other.next_fire == clock.now() + timedelta(seconds=3600)


async def test_two_runtimes_firing_one_store_start_each_turn_once(tmp_path: Path) -> None:
    """Two processes' worth of fires (explicit times, interleaved) on one SQLite file: every
    time fires one turn, whichever claims it."""
    db = tmp_path / "store.sqlite"
    clock = ManualClock(T0)
    a = Runtime([ops_agent()], SqliteStore(db), clock=clock)
    b = Runtime([ops_agent()], SqliteStore(db), clock=clock)
    async with a, b:
        await a.clock_loop.stop()  # fired by hand here, at explicit times
        await b.clock_loop.stop()
        await a.schedule("report", agent="ops", seed="Report", every=60, overlap="queue")
        end = T0 + timedelta(minutes=20)
        fired_a, fired_b = await asyncio.gather(fire_until(a.fires, end),
                                                fire_until(b.fires, end))
        started = [f.turn_id for f in fired_a + fired_b if f.outcome == "started"]
        assert len(started) == len(set(started)) == 20
        ids = [t for t, _ in await turns_of(a)]
        assert ids == [fire_turn_id("report", T0 + timedelta(minutes=n)) for n in range(1, 21)]
