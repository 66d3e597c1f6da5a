"""Cancellation, replace and reset (F7, F8), on every store.

Timing is made deterministic by a gated model and gated tools: the test waits on the events
they set (each wait bounded by :data:`WAIT`), never on sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from durable_turns import Agent, Runtime, Stop, TextDelta, ToolCall, ToolContext, tool
from durable_turns.errors import ResumeConflictError, UnknownTurnError
from durable_turns.events import TurnEvent
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.scheduling import ClaimingScheduler, NoDriveScheduler, Scheduler
from durable_turns.stores import ChainEntry, SessionStore

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""


class GatedModel:
    """Replies from a script; a reply marked ``gate`` streams one delta, then waits."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.streaming = asyncio.Event()
        self.gate = asyncio.Event()
        self.closed = 0
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        reply = self.script[min(calls_this_turn(request), len(self.script) - 1)]
        try:
            if reply == "gate":
                yield TextDelta("thinking about it")
                self.streaming.set()
                await self.gate.wait()
                yield Stop("end_turn")
                return
            text, calls = reply
            if text:
                yield TextDelta(text)
            for c in calls:
                yield c
            yield Stop("tool_use" if calls else "end_turn")
        finally:
            self.closed += 1


runs: list[str] = []


def make_runtime(store: SessionStore, model: GatedModel, *tools: Any,
                 scheduler: Scheduler | None = None) -> Runtime:
    return Runtime([Agent("ops", "", list(tools))], store, model, scheduler=scheduler)


@tool
async def note(text: str) -> str:
    """Note something."""
    runs.append(text)
    return text


@pytest.fixture(autouse=True)
def _clear() -> None:
    runs.clear()


def call(cid: str, name: str = "note", **args: Any) -> ToolCall:
    return ToolCall(cid, name, args or {"text": cid})


async def test_cancel_while_the_model_streams_closes_the_stream(store: SessionStore) -> None:
    model = GatedModel(["gate"])
    rt = make_runtime(store, model, note)
    await rt.open()
    s = rt.session("ops", "s1")
    seen: list[TurnEvent] = []
    s.observe(seen.append)
    t = await s.start("go")
    await asyncio.wait_for(model.streaming.wait(), WAIT)
    assert await s.cancel(t.turn_id, reason="user pressed stop") == [t.turn_id]
    r = await s.result(t.turn_id)
    assert (r.status, r.reason) == ("cancelled", "user pressed stop")
    assert model.closed == 1 and not model.gate.is_set()  # closed, not read to the end
    assert [m.role for m in await s.transcript()] == ["user"]  # the partial reply never committed
    assert seen[-1].to_dict()["reason"] == "user pressed stop"
    assert await s.status() == "idle"
    await rt.close()


async def test_a_queued_turn_cancelled_before_its_opening_commits(store: SessionStore) -> None:
    model = GatedModel(["gate"])
    rt = make_runtime(store, model, note)
    await rt.open()
    s = rt.session("ops", "s1")
    first = await s.start("first")
    second = await s.start("second")
    await asyncio.wait_for(model.streaming.wait(), WAIT)
    await s.cancel(second.turn_id)
    model.gate.set()
    assert (await s.result(first.turn_id)).status == "completed"
    assert (await s.result(second.turn_id)).status == "cancelled"
    assert [m.text for m in await s.transcript() if m.role == "user"] == ["first"]
    await rt.close()


async def test_a_tool_cancelling_its_own_turn_stops_at_the_next_boundary(
    store: SessionStore,
) -> None:
    holder: dict[str, Any] = {}

    @tool
    async def stop_me(ctx: ToolContext) -> str:
        """Cancel the turn this tool runs in."""
        await holder["session"].cancel(ctx.turn_id, reason="tool said stop")
        return "stopping"

    model = GatedModel([("", [call("c1"), call("c2", "stop_me"), call("c3"), call("c4")]),
                        ("never asked", [])])
    rt = make_runtime(store, model, note, stop_me)
    await rt.open()
    s = holder["session"] = rt.session("ops", "s1")
    r = await s.turn("go")
    assert (r.status, r.reason) == ("cancelled", "tool said stop")
    tools = [(m.call_id, m.result) for m in await s.transcript() if m.role == "tool"]
    assert tools == [("c1", "c1"), ("c2", "stopping"),
                     ("c3", {"cancelled": True}), ("c4", {"cancelled": True})]
    assert runs == ["c1"]  # the unrun calls never ran
    assert model.calls == 1  # no model call after the cancel
    # the transcript stays a valid conversation: the next turn runs on it
    model.script = [("next", [])]
    assert (await s.turn("again")).text == "next"
    await rt.close()


async def test_replace_cancels_running_and_queued_turns(store: SessionStore) -> None:
    model = GatedModel(["gate"])
    rt = make_runtime(store, model, note)
    await rt.open()
    s = rt.session("ops", "s1")
    a = await s.start("a")
    b = await s.start("b")
    c = await s.start("c")
    await asyncio.wait_for(model.streaming.wait(), WAIT)
    model.script = [("fresh answer", [])]
    d = await s.start("d", turn_id="d", replace=True)
    results = [await s.result(t.turn_id) for t in (a, b, c, d)]
    assert [r.status for r in results] == ["cancelled", "cancelled", "cancelled", "completed"]
    assert all(r.reason == "superseded by turn d" for r in results[:3])
    assert results[3].text == "fresh answer"
    assert [m.text for m in await s.transcript() if m.role == "user"] == ["a", "d"]
    await rt.close()


async def test_cancel_bad_input(store: SessionStore) -> None:
    rt = make_runtime(store, GatedModel([("done", [])]), note)
    await rt.open()
    s = rt.session("ops", "s1")
    with pytest.raises(UnknownTurnError):
        await s.cancel("no-such-turn")
    t = await s.turn("hi")
    assert await s.cancel(t.turn_id) == []  # already finished: a no-op that says so
    assert await s.cancel() == []
    await rt.close()


async def test_reset_archives_the_log_and_the_next_turn_starts_empty(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    reset_accepted = asyncio.Event()
    enqueue = store.enqueue

    async def spy(*args: Any, **kwargs: Any) -> tuple[ChainEntry, bool]:
        accepted = await enqueue(*args, **kwargs)
        if accepted[0].kind == "reset":
            reset_accepted.set()
        return accepted

    monkeypatch.setattr(store, "enqueue", spy)
    model = GatedModel([("", [call("c1")]), ("first answer", [])])
    rt = make_runtime(store, model, note)
    await rt.open()
    s = rt.session("ops", "s1")
    await s.turn("before")
    before = await s.transcript()
    steps_before = await s.archive(0)
    model.script = ["gate"]
    running = await s.start("running")
    queued = await s.start("queued")
    await asyncio.wait_for(model.streaming.wait(), WAIT)
    reset = asyncio.create_task(s.reset())
    # The handshake: "after" is started once the reset's entry is durable, so it queues behind it.
    await asyncio.wait_for(reset_accepted.wait(), WAIT)
    model.script = [("after reset", [])]
    await s.start("after", turn_id="after")
    res = await asyncio.wait_for(reset, WAIT)
    assert (res.previous_session, res.generation) == ("s1#g0", 1)
    assert (await s.result(running.turn_id)).reason == "reset"
    assert (await s.result(queued.turn_id)).status == "cancelled"
    assert (await s.result("after")).text == "after reset"
    live = await s.transcript()
    assert [m.text for m in live if m.role != "tool"] == ["after", "after reset"]
    archived = await s.archive(0)
    assert archived.messages[: len(before)] == before
    assert archived.steps.items() >= steps_before.steps.items()
    assert (await s.reset()).previous_session == "s1#g1"
    assert await s.status() == "new" and await s.transcript() == []
    await rt.close()


async def test_reset_of_a_session_that_never_existed(store: SessionStore) -> None:
    rt = make_runtime(store, GatedModel([("x", [])]))
    await rt.open()
    res = await rt.session("ops", "ghost").reset()
    assert (res.previous_session, res.generation) == ("ghost#g0", 1)
    await rt.close()


CHILD = """
import asyncio, sys, pathlib
from durable_turns import Agent, ModelReply, Runtime, SqliteStore, ToolCall, scripted, tool

db, marks = sys.argv[1], pathlib.Path(sys.argv[2])

@tool
async def slow(n: int) -> int:
    '''Writes a mark, then waits for ever.'''
    with marks.open("a") as f:
        f.write(f"{n}\\n")
    await asyncio.Event().wait()
    return n

calls = [ToolCall("c1", "slow", {"n": 1}), ToolCall("c2", "slow", {"n": 2})]
model = scripted([ModelReply("", calls), ModelReply("done")])

async def main():
    rt = Runtime([Agent("ops", "", [slow])], SqliteStore(db), model)
    await rt.open()
    await rt.session("ops", "s1").start("go", turn_id="t1")
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_cancel_survives_a_crash(tmp_path: Any) -> None:
    import signal
    import subprocess
    import sys
    import time

    from durable_turns import ModelReply, SqliteStore, scripted

    db, marks = tmp_path / "db.sqlite", tmp_path / "marks"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(db), str(marks)])
    try:
        # A bounded wait on the file the child's tool writes (polled: it is another process).
        deadline = time.monotonic() + WAIT
        while not (marks.exists() and marks.read_text()):
            assert child.poll() is None, "the child ended before its tool ran"
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for the child's tool to run")
            await asyncio.sleep(0.02)
        rt = Runtime([Agent("ops", "", [note])], SqliteStore(db),
                     scripted([ModelReply("never")]))
        await rt.open()
        s = rt.session("ops", "s1")
        assert await s.cancel("t1", reason="operator") == ["t1"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=WAIT)
    await rt.recover()
    r = await s.result("t1")
    assert (r.status, r.reason) == ("cancelled", "operator")
    assert marks.read_text() == "1\n"  # the interrupted call was not run again
    tools = [(m.call_id, m.result) for m in await s.transcript() if m.role == "tool"]
    assert tools == [("c1", {"cancelled": True}), ("c2", {"cancelled": True})]
    await rt.close()


async def test_a_cancel_from_another_runtime_stops_a_streaming_model(tmp_path: Any) -> None:
    from durable_turns import SqliteStore

    db = tmp_path / "db.sqlite"
    model = GatedModel(["gate"])
    driver = make_runtime(SqliteStore(db), model, note)
    await driver.open()
    other = make_runtime(SqliteStore(db), GatedModel([("", [])]), note)
    await other.open()
    t = await driver.session("ops", "s1").start("go")
    await asyncio.wait_for(model.streaming.wait(), WAIT)
    # `other` shares only the file: it cannot reach the driver's memory, only the store
    assert await other.session("ops", "s1").cancel(t.turn_id, reason="from elsewhere")
    r = await driver.session("ops", "s1").result(t.turn_id)
    assert (r.status, r.reason) == ("cancelled", "from elsewhere")
    assert model.closed == 1 and not model.gate.is_set()
    await other.close()
    await driver.close()


@tool
async def ask_first(order: str, ctx: ToolContext) -> str:
    """Refund an order once a person approves."""
    ok = await ctx.request_input("approve", f"Refund {order}?", schema={"type": "boolean"})
    runs.append(f"refund {order} {ok}")
    return "refunded" if ok else "kept"


PARKS = [("", [call("c1", "ask_first", order="42"), call("c2")]), ("after", [])]


async def test_a_cancel_withdraws_a_parked_request(store: SessionStore) -> None:
    rt = make_runtime(store, GatedModel(PARKS), ask_first, note)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("refund 42")
    parked = await s.result(t.turn_id, timeout=WAIT)
    assert parked.status == "suspended" and await s.pending() is not None
    assert await s.cancel(t.turn_id, reason="customer withdrew") == [t.turn_id]
    r = await s.result(t.turn_id, timeout=WAIT)
    assert (r.status, r.reason, r.request) == ("cancelled", "customer withdrew", None)
    assert await s.pending() is None and await s.status() == "idle"
    # Both calls the turn owed get an answer, so the transcript stays a valid conversation;
    # neither tool ran.
    tools = [(m.call_id, m.result) for m in await s.transcript() if m.role == "tool"]
    assert tools == [("c1", {"cancelled": True}), ("c2", {"cancelled": True})]
    assert runs == []
    assert [e.type for e in await s.events()][-2:] == ["action.completed", "turn.cancelled"]
    with pytest.raises(ResumeConflictError):
        await s.resume(t.turn_id, "approve", True)
    assert await s.cancel(t.turn_id) == []  # ended: a no-op
    # The session takes new turns.
    model = GatedModel([("hello again", [])])
    rt2 = make_runtime(store, model, ask_first, note)
    await rt2.open()
    assert (await rt2.session("ops", "s1").turn("next")).text == "hello again"
    await rt2.close()
    await rt.close()


async def test_a_park_withdrawn_in_one_process_is_ended_by_a_worker(tmp_path: Any) -> None:
    from durable_turns import SqliteStore

    db = tmp_path / "db.sqlite"
    first = make_runtime(SqliteStore(db), GatedModel(PARKS), ask_first, note)
    await first.open()
    t = await first.session("ops", "s1").start("refund 42")
    assert (await first.session("ops", "s1").result(t.turn_id, timeout=WAIT)).status \
        == "suspended"
    await first.close()
    # A host that drives nothing withdraws the request; a worker elsewhere ends the turn.
    host = Runtime([Agent("ops", "", [ask_first, note])], SqliteStore(db),
                   scheduler=NoDriveScheduler())
    await host.open()
    claims = ClaimingScheduler(poll_interval=0.05)
    worker = make_runtime(SqliteStore(db), GatedModel(PARKS), ask_first, note, scheduler=claims)
    await worker.open()
    working = asyncio.create_task(claims.run())
    try:
        s = host.session("ops", "s1")
        assert await s.cancel(t.turn_id, reason="operator") == [t.turn_id]
        r = await s.result(t.turn_id, timeout=WAIT)
        assert (r.status, r.reason) == ("cancelled", "operator")
        assert await s.pending() is None
    finally:
        working.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await working
        await worker.close()
        await host.close()
