"""Parallel tool calls (F15), on every store: ``Agent(parallel_tools=True)``.

No test bounds wall-clock time (bench/parallel.py measures it): concurrency is shown by the
calls' overlap, and commit order by the events, each wait bounded by :data:`WAIT`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from durable_turns import (
    Agent,
    FatalToolError,
    ModelReply,
    Runtime,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.events import TurnEvent
from durable_turns.stores import SessionStore
from durable_turns.testing import step_result

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""


class Calls:
    """What the tools saw: starts and ends in order, runs per call, and a gate per call."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.runs: Counter[str] = Counter()
        self.committed: dict[str, asyncio.Event] = {}
        self.gates: dict[str, asyncio.Event] = {}

    def saw(self, e: TurnEvent) -> None:
        if e.type == "action.completed":
            self.committed.setdefault(e.call.id, asyncio.Event()).set()  # type: ignore[attr-defined]

    async def committed_(self, *call_ids: str) -> None:
        for c in call_ids:
            await asyncio.wait_for(self.committed.setdefault(c, asyncio.Event()).wait(), WAIT)


def make(store: SessionStore, calls: Calls, replies: list[ModelReply]) -> Runtime:
    @tool
    async def wait(seconds: float, after: list[str], ctx: ToolContext) -> str:
        """Wait that long, then (once the calls named in ``after`` committed) return."""
        calls.runs[ctx.call_id] += 1
        calls.log.append(f"start {ctx.call_id}")
        await asyncio.sleep(seconds)
        await calls.committed_(*after)
        if ctx.call_id in calls.gates:
            await asyncio.wait_for(calls.gates[ctx.call_id].wait(), WAIT)
        calls.log.append(f"end {ctx.call_id}")
        return f"waited {seconds}"

    @tool
    async def ask(question: str, ctx: ToolContext) -> str:
        """Ask a person."""
        calls.runs[ctx.call_id] += 1
        answer = await ctx.request_input(f"ok-{question}", f"{question}?")
        return f"{question}: {answer}"

    @tool
    def note(text: str, ctx: ToolContext) -> str:
        """A local tool."""
        calls.runs[ctx.call_id] += 1
        calls.log.append(f"local {ctx.call_id}")
        return text.upper()

    @tool
    async def give_up(ctx: ToolContext) -> None:
        """Fail the turn on purpose (once the other calls committed)."""
        await calls.committed_("c1")
        raise FatalToolError("cannot go on")

    agent = Agent("ops", "", [wait, ask, note, give_up], parallel_tools=True)
    return Runtime([agent], store, scripted(replies))


def batch(*calls: ToolCall) -> list[ModelReply]:
    return [ModelReply("Doing it all at once.", list(calls)), ModelReply("All done.")]


def tool_results(messages: list[Any]) -> list[tuple[str, Any]]:
    return [(m.call_id, m.result) for m in messages if m.role == "tool"]


async def test_three_calls_run_at_once_and_are_listed_in_call_order(
        store: SessionStore) -> None:
    calls = Calls()
    rt = make(store, calls, batch(
        ToolCall("c1", "wait", {"seconds": 0.6, "after": ["c2", "c3"]}),
        ToolCall("c2", "wait", {"seconds": 0.1, "after": []}),
        ToolCall("c3", "wait", {"seconds": 0.3, "after": []}),
    ))
    s = rt.session("ops", "s1")
    s.observe(calls.saw)
    r = await s.turn("go", turn_id="t1")
    assert (r.status, r.text) == ("completed", "All done.")
    # They overlapped: every call started before the first one ended.
    assert calls.log[:3] == ["start c1", "start c2", "start c3"]
    # c1 returned only after c2's and c3's steps had committed: each commits as it ends.
    assert calls.log[3:] == ["end c2", "end c3", "end c1"]
    events = await s.events()
    done = [e.call.id for e in events if e.type == "action.completed"]  # type: ignore[attr-defined]
    assert done == ["c2", "c3", "c1"]
    assert len({e.seq for e in events if e.type == "action.completed"}) == 3
    # The transcript lists them in call order, whatever the finishing order.
    assert tool_results(await s.transcript()) == [
        ("c1", "waited 0.6"), ("c2", "waited 0.1"), ("c3", "waited 0.3")]
    for c in ("c1", "c2", "c3"):
        assert await step_result(store, s.key, f"tool:1:{c}") is not None
    await rt.close()


async def test_local_calls_of_a_batch_run_one_at_a_time_in_call_order(
        store: SessionStore) -> None:
    calls = Calls()
    rt = make(store, calls, batch(
        ToolCall("c1", "note", {"text": "a"}),
        ToolCall("c2", "wait", {"seconds": 0, "after": ["c1", "c3"]}),
        ToolCall("c3", "note", {"text": "b"}),
    ))
    s = rt.session("ops", "s1")
    s.observe(calls.saw)
    r = await s.turn("go", turn_id="t1")
    assert r.status == "completed"
    assert [x for x in calls.log if x.startswith("local")] == ["local c1", "local c3"]
    assert tool_results(await s.transcript()) == [("c1", "A"), ("c2", "waited 0.0"),
                                                  ("c3", "B")]
    await rt.close()


async def test_two_calls_park_at_once_and_are_answered_one_by_one(
        store: SessionStore) -> None:
    calls = Calls()
    rt = make(store, calls, batch(
        ToolCall("c1", "ask", {"question": "a"}),
        ToolCall("c2", "ask", {"question": "b"}),
        ToolCall("c3", "wait", {"seconds": 0, "after": []}),
    ))
    s = rt.session("ops", "s1")
    t = await s.start("go", turn_id="t1")
    r = await s.result(t.turn_id, timeout=WAIT)
    assert r.status == "suspended" and r.request is not None
    pending = await s.pending()
    assert pending is not None
    assert [(q.id, q.call_id) for q in pending.all] == [("ok-a", "c1"), ("ok-b", "c2")]
    # c3 committed its step; its tool message waits for c1 and c2 (call order).
    assert await step_result(store, s.key, "tool:1:c3") is not None
    assert tool_results(await s.transcript()) == []
    # The second request first, on its own: the turn parks again on the first only.
    await s.resume("t1", "ok-b", "yes")
    r = await s.result("t1", timeout=WAIT)
    assert r.status == "suspended" and r.request is not None
    assert [q.id for q in r.request.all] == ["ok-a"]
    await s.resume("t1", "ok-a", "no")
    r = await s.result("t1", timeout=WAIT)
    assert (r.status, r.text) == ("completed", "All done.")
    assert tool_results(await s.transcript()) == [("c1", "a: no"), ("c2", "b: yes"),
                                                  ("c3", "waited 0.0")]
    # Committed calls never ran again; parked ones ran from the top until answered.
    assert calls.runs == {"c1": 3, "c2": 2, "c3": 1}
    requested = [e.request.id for e in await s.events()  # type: ignore[attr-defined]
                 if e.type == "input.requested"]
    assert requested == ["ok-a", "ok-a"]  # one event per park; ok-b came in its `more`
    await rt.close()


async def test_a_cancel_mid_batch_keeps_what_committed(store: SessionStore) -> None:
    calls = Calls()
    calls.gates["c1"] = asyncio.Event()
    rt = make(store, calls, batch(
        ToolCall("c1", "wait", {"seconds": 0, "after": []}),
        ToolCall("c2", "wait", {"seconds": 0, "after": []}),
    ))
    s = rt.session("ops", "s1")
    s.observe(calls.saw)
    await s.start("go", turn_id="t1")
    await calls.committed_("c2")
    assert await s.cancel("t1", reason="stop") == ["t1"]
    calls.gates["c1"].set()  # c1 is running: it ends, then the cancel takes effect
    r = await s.result("t1", timeout=WAIT)
    assert (r.status, r.reason) == ("cancelled", "stop")
    assert tool_results(await s.transcript()) == [("c1", "waited 0.0"), ("c2", "waited 0.0")]
    assert [e.type for e in await s.events()][-1] == "turn.cancelled"
    await rt.close()


async def test_bad_calls_of_a_batch_get_error_results_in_call_order(
        store: SessionStore) -> None:
    calls = Calls()
    rt = make(store, calls, batch(
        ToolCall("c1", "nope", {}),
        ToolCall("c2", "wait", {"seconds": 0, "after": []}),
        ToolCall("c3", "wait", {"seconds": "x", "after": []}),
    ))
    s = rt.session("ops", "s1")
    r = await s.turn("go", turn_id="t1")
    assert r.status == "completed"
    results = tool_results(await s.transcript())
    assert [c for c, _ in results] == ["c1", "c2", "c3"]
    assert results[0][1] == {"error": "unknown tool: nope"}
    assert results[1][1] == "waited 0.0"
    assert "invalid input for wait" in results[2][1]["error"]
    await rt.close()


async def test_a_fatal_error_mid_batch_fails_the_turn_and_keeps_what_committed(
        store: SessionStore) -> None:
    calls = Calls()
    calls.gates["c3"] = asyncio.Event()
    rt = make(store, calls, batch(
        ToolCall("c1", "wait", {"seconds": 0, "after": []}),
        ToolCall("c2", "give_up", {}),
        ToolCall("c3", "wait", {"seconds": 0, "after": []}),
    ))
    s = rt.session("ops", "s1")
    s.observe(calls.saw)
    r = await s.turn("go", turn_id="t1")
    assert r.status == "failed" and "cannot go on" in (r.error or "")
    results = tool_results(await s.transcript())
    assert [c for c, _ in results] == ["c1", "c2", "c3"]
    assert results[0][1] == "waited 0.0"  # committed before the failure: kept
    assert all("turn failed" in res["error"] for _, res in results[1:])
    await rt.close()
