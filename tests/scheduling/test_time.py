"""F24: durable sleeps and deadlines on input requests, driven by a ManualClock, on every
store: the clock loop wakes a sleeping turn at its time, a request past its deadline goes on
with its default (a later answer is refused), reminders are events of the turn."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from durable_turns import Agent, ModelReply, Runtime, ToolCall, ToolContext, scripted, tool
from durable_turns.clock import ManualClock
from durable_turns.errors import ResumeConflictError
from durable_turns.events import TurnEvent, TurnSleeping
from durable_turns.stores import SessionStore
from durable_turns.testing import step_result

log: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    log.clear()


@tool
async def remind_later(minutes: int, ctx: ToolContext) -> str:
    """Wait, then remind."""
    log.append("started")
    await ctx.sleep(timedelta(minutes=minutes))
    log.append("reminded")
    return "reminded"


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund once approved; unanswered for an hour, it is not."""
    approved = await ctx.request_input("approve", f"Refund {order_id}?",
                                       schema={"type": "boolean"}, timeout=3600,
                                       default=False, remind_every=timedelta(minutes=20))
    log.append(f"approved={approved}")
    return {"refunded": approved}


def _runtime(store: SessionStore, clock: ManualClock, call: ToolCall) -> Runtime:
    return Runtime([Agent("ops", "Base.", [remind_later, refund])], store,
                   scripted([ModelReply("", [call]), ModelReply("Done.")]), clock=clock)


async def _settled(rt: Runtime, turn: Any, status: str) -> Any:
    async with asyncio.timeout(10):
        while True:
            r = await rt.session("ops", "s1").result(turn.turn_id)
            if r.status == status:
                return r
            await rt.clock_loop.looked(rt.clock_loop.looks)


async def test_a_sleeping_turn_is_suspended_then_woken_at_its_time(store: SessionStore) -> None:
    clock = ManualClock()
    rt = _runtime(store, clock, ToolCall("c1", "remind_later", {"minutes": 90}))
    async with rt:
        s = rt.session("ops", "s1")
        seen: list[TurnEvent] = []
        s.observe(seen.append)
        t = await s.start("remind me in 90 minutes")
        r = await s.result(t.turn_id)
        assert r.status == "suspended" and await s.status() == "suspended"
        sleeping = [e for e in await s.events() if isinstance(e, TurnSleeping)]
        assert len(sleeping) == 1
        assert sleeping[0].until == (clock.now() + timedelta(minutes=90)).isoformat()
        with pytest.raises(ResumeConflictError, match="only the clock"):
            await s.resume(t.turn_id, "sleep:c1:1", None)
        clock.advance(89 * 60)
        await rt.clock_loop.looked(rt.clock_loop.looks)
        assert (await s.result(t.turn_id)).status == "suspended"
        clock.advance(60)
        done = await _settled(rt, t, "completed")
        assert done.text == "Done."
        assert log == ["started", "started", "reminded"]
        answer = await step_result(store, s.key, f"input:{t.turn_id}:sleep:c1:1")
        assert getattr(answer, "by", None) == "clock"


async def test_a_deadline_answers_with_the_default_and_a_late_answer_is_refused(
        store: SessionStore) -> None:
    clock = ManualClock()
    rt = _runtime(store, clock, ToolCall("c1", "refund", {"order_id": "42"}))
    async with rt:
        s = rt.session("ops", "s1")
        t = await s.start("refund 42")
        r = await s.result(t.turn_id)
        assert r.status == "suspended" and r.request is not None
        assert r.request.expires == (clock.now() + timedelta(hours=1)).isoformat()
        for _ in range(2):  # reminders at 20 and 40 minutes
            clock.advance(20 * 60)
            async with asyncio.timeout(10):
                while sum(e.type == "input.reminder" for e in await s.events()) < _ + 1:
                    await rt.clock_loop.looked(rt.clock_loop.looks)
        assert (await s.result(t.turn_id)).status == "suspended"
        clock.advance(20 * 60)
        done = await _settled(rt, t, "completed")
        assert done.text == "Done."
        assert log == ["approved=False"]
        types = [e.type for e in await s.events()]
        assert types.count("input.reminder") == 2 and types.count("input.expired") == 1
        answer = await step_result(store, s.key, f"input:{t.turn_id}:approve")
        assert (getattr(answer, "value", None), getattr(answer, "by", None)) == (False,
                                                                                 "timeout")
        with pytest.raises(ResumeConflictError) as late:
            await s.resume(t.turn_id, "approve", True, by="U1")
        assert "timeout" in str(late.value)
        assert log == ["approved=False"]


async def test_an_answer_in_time_disarms_the_deadline(store: SessionStore) -> None:
    clock = ManualClock()
    rt = _runtime(store, clock, ToolCall("c1", "refund", {"order_id": "42"}))
    async with rt:
        s = rt.session("ops", "s1")
        t = await s.start("refund 42")
        await s.result(t.turn_id)
        await s.resume(t.turn_id, "approve", True)
        assert (await _settled(rt, t, "completed")).text == "Done."
        clock.advance(7200)
        async with asyncio.timeout(10):  # the timers fire into nothing and are dropped
            while await store.next_timer(["ops"]) is not None:
                await rt.clock_loop.looked(rt.clock_loop.looks)
        types = [e.type for e in await s.events()]
        assert "input.expired" not in types and "input.reminder" not in types
        assert log == ["approved=True"]
