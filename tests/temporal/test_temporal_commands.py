"""Running on Temporal: parks, cancels, replace and reset, subagents (F6 to F8, F13).

A real Temporal dev server (the session's ``temporal_target``); a worker in a child process
where a test kills or pauses it, else in the test's own process with its own runtime and
store (``temporalkit.inline_worker``): the front runtime that accepts turns never drives.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus

import crashkit
from durable_turns import (
    Agent,
    Model,
    ModelReply,
    ModelRequest,
    ResumeAuthorizationError,
    SqliteStore,
    ToolCall,
    TurnStatus,
    scripted,
    subagent,
)
from durable_turns.models.scripted import calls_this_turn
from durable_turns.subagents import find_child
from durable_turns.temporal import Connection, connect, workflow_id
from temporalkit import WAIT, StallModel, ask_agent, front, inline_worker, queue, spawn, stop


async def test_a_park_outlives_every_worker_and_takes_its_answer_from_any_process(
        temporal_target: str, tmp_path: Path) -> None:
    db, q = tmp_path / "db", queue()
    agent, _ = ask_agent(tmp_path)
    async with front(temporal_target, q, agent, SqliteStore(db)) as rt:
        session = rt.session("ask", "s1")
        await session.start("refund 5", turn_id="t1")
        w1 = spawn(temporal_target, q, tmp_path, "w1", "--db", str(db), "--agent", "ask")
        parked = await session.result("t1", timeout=WAIT)
        assert parked.status == TurnStatus.SUSPENDED
        w1.send_signal(signal.SIGKILL)  # every worker is down from here on
        await asyncio.to_thread(w1.wait, WAIT)
        client = await connect(Connection(temporal_target))
        handle = client.get_workflow_handle(workflow_id(q, "ask", "s1"))
        # The workflow waits on a signal for as long as the park lasts.
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        # The answerer rules hold in whichever process answers: bob may not.
        with pytest.raises(ResumeAuthorizationError):
            await session.resume("t1", "approve", True, by="bob")
        assert (await session.pending()) is not None
        # Alice answers while no worker runs: the answer is stored and the workflow signalled
        # (Temporal keeps the signal); resume() returns once a worker applied it.
        answering = asyncio.create_task(session.resume("t1", "approve", True, by="alice"))
        async with asyncio.timeout(WAIT):
            while [t.kind for t in await rt.store.entries(rt.key("ask", "s1"), unfinished=True)] \
                    != ["turn", "resume"]:
                await asyncio.sleep(0.01)  # a poll of the store, bounded by the timeout
        assert not answering.done()
        w2 = spawn(temporal_target, q, tmp_path, "w2", "--db", str(db), "--agent", "ask")
        try:
            await asyncio.wait_for(answering, WAIT)
            done = await session.result("t1", timeout=WAIT)
        finally:
            stop(w2, tmp_path, "w2")
        assert (done.status, done.text) == (TurnStatus.COMPLETED, "Refunded.")
    effects = crashkit.read_jsonl(tmp_path / "effects.jsonl")
    assert [e["call"] for e in effects] == ["c1"]


async def test_a_cancel_reaches_a_turn_running_on_a_worker(
        temporal_target: str, tmp_path: Path) -> None:
    db, q = tmp_path / "db", queue()
    async with front(temporal_target, q, Agent("stall", "You think.", []), SqliteStore(db)) \
            as rt:
        session = rt.session("stall", "s1")
        await session.start("think hard", turn_id="t1")
        w = spawn(temporal_target, q, tmp_path, "w", "--db", str(db), "--agent", "stall")
        try:
            await crashkit.wait_for_file(tmp_path / "streaming-w", "the model's stream", WAIT)
            # The model waits for a file nobody writes: only the cancel ends its stream.
            assert await session.cancel("t1", reason="enough") == ["t1"]
            res = await session.result("t1", timeout=WAIT)
            assert (res.status, res.reason) == (TurnStatus.CANCELLED, "enough")
            # The session's chain goes on: the next turn runs on the same workflow.
            await session.start("quick one", turn_id="t2")
            nxt = await session.result("t2", timeout=WAIT)
        finally:
            stop(w, tmp_path, "w")
        assert (nxt.status, nxt.text) == (TurnStatus.COMPLETED, "quick answer")


async def test_replace_and_reset_keep_their_meaning(temporal_target: str, tmp_path: Path) -> None:
    db, q = tmp_path / "db", queue()
    agent = Agent("stall", "You think.", [])
    model = StallModel(tmp_path, "inline")
    async with front(temporal_target, q, agent, SqliteStore(db)) as rt, \
            inline_worker(temporal_target, q, agent, model, SqliteStore(db)):
        session = rt.session("stall", "s1")
        # F7: a replacing turn cancels the running one, then runs.
        await session.start("think hard", turn_id="a")
        await crashkit.wait_for_file(tmp_path / "streaming-inline", "the stream", WAIT)
        await session.start("quick, instead", turn_id="b", replace=True)
        a, b = await session.result("a", timeout=WAIT), await session.result("b", timeout=WAIT)
        assert (a.status, a.reason) == (TurnStatus.CANCELLED, "superseded by turn b")
        assert (b.status, b.text) == (TurnStatus.COMPLETED, "quick answer")
        # F8: a reset cancels the running turn and archives the generation.
        (tmp_path / "streaming-inline").unlink()
        await session.start("think again", turn_id="c")
        await crashkit.wait_for_file(tmp_path / "streaming-inline", "the stream", WAIT)
        reset = await asyncio.wait_for(session.reset(), WAIT)
        c = await session.result("c", timeout=WAIT)
        assert (c.status, c.reason) == (TurnStatus.CANCELLED, "reset")
        assert reset.generation == 1
        assert await session.transcript() == []
        await session.start("quick, fresh", turn_id="d")
        d = await session.result("d", timeout=WAIT)
        assert d.text == "quick answer"
        assert [m.text for m in await session.transcript() if m.role == "user"] == \
            ["quick, fresh"]


def team() -> tuple[list[Agent], Model]:
    lead = Agent("lead", "You lead.", [subagent("researcher", description="Finds things.")])
    researcher = Agent("researcher", "You research.", [])

    def reply(r: ModelRequest) -> ModelReply:
        if r.system == "You research.":
            return ModelReply("Found: 42.")
        if calls_this_turn(r) == 0:
            return ModelReply("Asking.", [ToolCall("c1", "researcher", {"task": "find it"})])
        return ModelReply("The answer is 42.")

    return [lead, researcher], scripted(reply)


async def test_a_subagent_runs_as_a_child_session_with_its_own_workflow(
        temporal_target: str, tmp_path: Path) -> None:
    db, q = tmp_path / "db", queue()
    agents, model = team()
    client = await connect(Connection(temporal_target))
    async with front(temporal_target, q, agents[0], SqliteStore(db)) as rt, \
            inline_worker(temporal_target, q, agents[0], model, SqliteStore(db),
                          more=agents[1:]):
        session = rt.session("lead", "s1")
        await session.start("what is it?", turn_id="t1")
        res = await session.result("t1", timeout=WAIT)
        assert (res.status, res.text) == (TurnStatus.COMPLETED, "The answer is 42.")
        found = await find_child(session, "t1", "c1")
    assert found is not None
    child_session, _ = found
    history = await client.get_workflow_handle(
        workflow_id(q, "researcher", child_session)).fetch_history()
    scheduled = [e for e in history.events if e.HasField(
        "activity_task_scheduled_event_attributes")]
    assert len(scheduled) >= 1  # the child's model call ran as its own workflow's step


async def test_an_idle_workflow_ends_and_the_next_turn_starts_it_again(
        temporal_target: str, tmp_path: Path) -> None:
    db, q = tmp_path / "db", queue()
    agent = Agent("stall", "You think.", [])
    client = await connect(Connection(temporal_target))
    handle = client.get_workflow_handle(workflow_id(q, "stall", "s1"))
    async with front(temporal_target, q, agent, SqliteStore(db), idle=0.2) as rt, \
            inline_worker(temporal_target, q, agent, StallModel(tmp_path, "w"), SqliteStore(db)):
        session = rt.session("stall", "s1")
        await session.start("quick one", turn_id="t1")
        assert (await session.result("t1", timeout=WAIT)).text == "quick answer"
        async with asyncio.timeout(WAIT):
            while (first := await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                await asyncio.sleep(0.05)  # a poll of the workflow, bounded by the timeout
        assert first.status == WorkflowExecutionStatus.COMPLETED
        assert await handle.result() == "idle"
        await session.start("quick two", turn_id="t2")
        assert (await session.result("t2", timeout=WAIT)).text == "quick answer"
        second = await handle.describe()
        assert second.run_id != first.run_id
