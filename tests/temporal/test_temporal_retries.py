"""F20: Retries on Temporal: a tool's ``retries`` and the agent's ``model_retries`` are the step
activity's retry policy, each attempt one activity attempt, read back from the workflow's
history on a real dev server (the ``temporal_target`` fixture)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState

import crashkit
from durable_turns import (
    Agent,
    Model,
    ModelReply,
    ModelRequest,
    SqliteStore,
    TextDelta,
    ToolCall,
    ToolContext,
    TurnResult,
    scripted,
    tool,
)
from durable_turns.errors import ModelError, RetryStep
from durable_turns.model import Stop
from durable_turns.models import ModelEvent
from durable_turns.models.scripted import calls_this_turn
from durable_turns.scheduling import NoDriveScheduler
from durable_turns.temporal import Connection, connect, workflow_id
from temporalkit import WAIT, front, inline_worker, logged, queue, spawn, stop


async def steps(target: str, q: str, agent: str, session: str) -> list[dict[str, Any]]:
    """Each activity of the session's workflow, in order: its summary, retry policy, input,
    the attempt that ended it, the failure before that attempt, and how it ended."""
    client = await connect(Connection(target))
    history = await client.get_workflow_handle(workflow_id(q, agent, session)).fetch_history()
    out: dict[int, dict[str, Any]] = {}
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            sched = e.activity_task_scheduled_event_attributes
            policy = sched.retry_policy
            out[e.event_id] = {
                "summary": json.loads(e.user_metadata.summary.data),
                "input": json.loads(sched.input.payloads[0].data),
                "attempts": policy.maximum_attempts,
                "initial": policy.initial_interval.ToTimedelta().total_seconds(),
                "coefficient": policy.backoff_coefficient,
                "max": policy.maximum_interval.ToTimedelta().total_seconds(),
            }
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = e.activity_task_started_event_attributes
            out[started.scheduled_event_id].update(
                attempt=started.attempt, last_failure=started.last_failure.message or None)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            out[e.activity_task_completed_event_attributes.scheduled_event_id]["end"] = \
                "completed"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            out[e.activity_task_failed_event_attributes.scheduled_event_id]["end"] = "failed"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            out[e.activity_task_timed_out_event_attributes.scheduled_event_id]["end"] = \
                "failed"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            out[e.activity_task_canceled_event_attributes.scheduled_event_id]["end"] = \
                "cancelled"
    return list(out.values())


def of(found: list[dict[str, Any]], summary: str) -> list[dict[str, Any]]:
    """The activities whose summary starts with ``summary``."""
    return [s for s in found if s["summary"].startswith(summary)]


async def run_turn(target: str, q: str, tmp_path: Path, agent: Agent, model: Model,
                   text: str = "go") -> tuple[TurnResult, list[dict[str, Any]]]:
    """Run one turn of ``agent`` (session ``s1``, turn ``t1``) through a worker in this
    process; its result and its stored tool results (``action.completed``)."""
    async with front(target, q, agent, SqliteStore(tmp_path / "db")) as rt, \
            inline_worker(target, q, agent, model, SqliteStore(tmp_path / "db")):
        session = rt.session(agent.name, "s1")
        await session.start(text, turn_id="t1")
        res = await session.result("t1", timeout=WAIT)
        events = await rt.store.read_events(rt.key(agent.name, "s1"))
    done = [e.to_dict() for e in events if e.type == "action.completed"]
    return res, done


def flaky_tool(runs: list[tuple[int, str]], fails: int, retries: int) -> Any:
    @tool(retries=retries, retry_delay=0.05, timeout=10)
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge an amount."""
        runs.append((ctx.attempt, ctx.idempotency_key))
        if ctx.attempt <= fails:
            raise ConnectionError(f"payment service reset (attempt {ctx.attempt})")
        return f"charged {amount}"

    return charge


CHARGE = [ModelReply("Charging.", [ToolCall("c1", "charge", {"amount": 5})]),
          ModelReply("Done.")]


# -- a tool's retries -------------------------------------------------------------------------


async def charge_turn(target: str, tmp_path: Path, fails: int, retries: int
                      ) -> tuple[TurnResult, list[tuple[int, str]], list[dict[str, Any]],
                                 dict[str, Any]]:
    """A turn whose ``charge`` fails ``fails`` times (of ``1 + retries`` attempts): its
    result, the tool's runs, its stored results and its step's activity."""
    q, runs = queue(), list[tuple[int, str]]()
    agent = Agent("pay", "You charge.", [flaky_tool(runs, fails=fails, retries=retries)])
    res, done = await run_turn(target, q, tmp_path, agent,
                               scripted(lambda r: CHARGE[calls_this_turn(r)]))
    [charge] = of(await steps(target, q, "pay", "s1"), "tool charge")
    return res, runs, done, charge


async def test_a_tool_s_failed_attempts_are_the_activity_s_attempts(
        temporal_target: str, tmp_path: Path) -> None:
    res, runs, done, charge = await charge_turn(temporal_target, tmp_path, 2, retries=2)
    assert (res.status, res.text) == ("completed", "Done.")
    # Three runs of the tool, one per activity attempt, under one idempotency key; one
    # committed result, the third attempt's.
    assert [a for a, _ in runs] == [1, 2, 3]
    assert len({k for _, k in runs}) == 1
    assert [(d["call"]["id"], d["result"], d["error"]) for d in done] == \
        [("c1", "charged 5", None)]
    assert charge["summary"] == "tool charge (timeout 10s, retries 2)"
    assert (charge["attempts"], charge["initial"], charge["coefficient"], charge["max"]) == \
        (3, 0.05, 2.0, 30.0)
    assert (charge["attempt"], charge["end"]) == (3, "completed")
    assert "tool 'charge' failed on attempt 2 of 3" in charge["last_failure"]
    assert "payment service reset (attempt 2)" in charge["last_failure"]


async def test_the_last_attempt_commits_the_tool_s_error_and_the_turn_goes_on(
        temporal_target: str, tmp_path: Path) -> None:
    res, runs, done, charge = await charge_turn(temporal_target, tmp_path, 9, retries=1)
    assert (res.status, res.text) == ("completed", "Done.")
    assert [a for a, _ in runs] == [1, 2]
    assert [d["error"] for d in done] == ["ConnectionError: payment service reset (attempt 2)"]
    assert (charge["attempts"], charge["attempt"], charge["end"]) == (2, 2, "completed")


async def test_a_batch_runs_again_only_its_failed_calls(
        temporal_target: str, tmp_path: Path) -> None:
    q, runs = queue(), list[tuple[int, str]]()
    steady: list[int] = []

    @tool
    async def receipt(amount: int, ctx: ToolContext) -> str:
        """Send a receipt."""
        steady.append(ctx.attempt)
        return "sent"

    agent = Agent("pay", "You charge.", [flaky_tool(runs, fails=1, retries=3), receipt],
                  parallel_tools=True)
    script = [ModelReply("Both.", [ToolCall("c1", "charge", {"amount": 5}),
                                   ToolCall("c2", "receipt", {"amount": 5})]),
              ModelReply("Done.")]
    res, done = await run_turn(temporal_target, q, tmp_path, agent,
                               scripted(lambda r: script[calls_this_turn(r)]))
    assert (res.status, res.text) == ("completed", "Done.")
    # The receipt committed in the first attempt and was not sent again; the charge ran
    # twice. The step's policy is its strictest call's.
    assert steady == [1]
    assert [a for a, _ in runs] == [1, 2]
    assert sorted((d["call"]["id"], d["result"]) for d in done) == \
        [("c1", "charged 5"), ("c2", "sent")]
    [batch] = of(await steps(temporal_target, q, "pay", "s1"), "tool charge")
    assert batch["summary"] == "tool charge (timeout 10s, retries 3), receipt"
    assert (batch["attempts"], batch["attempt"]) == (4, 2)


async def test_a_worker_lost_on_the_last_attempt_still_ends_the_step_in_a_result(
        temporal_target: str, tmp_path: Path) -> None:
    from temporalkit import flaky_agent

    q, db = queue(), tmp_path / "db"
    agent, _ = flaky_agent(tmp_path)
    async with front(temporal_target, q, agent, SqliteStore(db)) as rt:
        session = rt.session("flaky", "s1")
        await session.start("charge 5", turn_id="t1")
        a = spawn(temporal_target, q, tmp_path, "a", "--db", str(db), "--agent", "flaky")
        await asyncio.to_thread(a.wait, WAIT)  # it killed itself on the second attempt
        assert a.returncode == -signal.SIGKILL, logged(tmp_path, "a")
        b = spawn(temporal_target, q, tmp_path, "b", "--db", str(db), "--agent", "flaky")
        try:
            res = await session.result("t1", timeout=WAIT)
        finally:
            err = stop(b, tmp_path, "b")
        assert (res.status, res.text) == ("completed", "Charged."), err
    effects = crashkit.read_jsonl(tmp_path / "effects.jsonl")
    assert [e["attempt"] for e in effects] == [1, 2, 3]
    assert len({e["key"] for e in effects}) == 1
    # Both attempts of the policy were spent (the second lost with its worker): the step
    # was scheduled again with its attempts counted on, and its third attempt committed.
    found = of(await steps(temporal_target, q, "flaky", "s1"), "tool charge")
    assert [(s["input"]["attempts_before"], s["attempts"], s["attempt"], s["end"])
            for s in found] == [(0, 2, 2, "failed"), (2, 2, 1, "completed")]


# -- model retries ----------------------------------------------------------------------------


class FlakyModel:
    """A scripted pair of replies whose second model call fails ``fails`` times first (the
    connection resets mid-stream, after a delta): a transient failure."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if calls_this_turn(request) == 0:
            yield ToolCall("c1", "charge", {"amount": 5})
            yield Stop("tool_use")
            return
        self.calls += 1
        yield TextDelta("Do")
        if self.calls <= self.fails:
            raise ConnectionError(f"connection reset (call {self.calls})")
        yield TextDelta("ne.")
        yield Stop("end_turn")


async def answer_turn(target: str, tmp_path: Path, fails: int, retries: int
                      ) -> tuple[TurnResult, FlakyModel, dict[str, Any]]:
    """A turn whose answering model call fails ``fails`` times (of ``1 + retries``
    attempts): its result, the model, and that step's activity."""
    q, model = queue(), FlakyModel(fails)
    agent = Agent("pay", "You charge.", [flaky_tool([], fails=0, retries=0)],
                  model_retries=retries, model_retry_delay=0.05)
    res, _ = await run_turn(target, q, tmp_path, agent, model)
    [asking, answer] = of(await steps(target, q, "pay", "s1"), "model")
    assert (asking["summary"], asking["attempt"]) == (f"model (retries {retries})", 1)
    return res, model, answer


async def test_model_retries_are_the_activity_s_attempts(
        temporal_target: str, tmp_path: Path) -> None:
    res, model, answer = await answer_turn(temporal_target, tmp_path, 2, retries=2)
    assert (res.status, res.text) == ("completed", "Done.")
    assert model.calls == 3
    assert answer["summary"] == "model (retries 2)"
    assert (answer["attempts"], answer["initial"], answer["coefficient"], answer["max"]) == \
        (3, 0.05, 2.0, 30.0)
    assert (answer["attempt"], answer["end"]) == (3, "completed")
    assert "model call failed on attempt 2 of 3" in answer["last_failure"]


async def test_the_last_model_attempt_fails_the_turn(
        temporal_target: str, tmp_path: Path) -> None:
    res, model, answer = await answer_turn(temporal_target, tmp_path, 9, retries=1)
    assert res.status == "failed"
    assert res.error is not None and "gave up after 2 attempts" in res.error
    assert model.calls == 2
    assert (answer["attempts"], answer["attempt"], answer["end"]) == (2, 2, "completed")


class RateLimited:
    """A model the provider rate-limits: every call fails with a ``retry-after`` of 60 s."""

    def __init__(self) -> None:
        self.calls = 0
        self.failed = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        self.failed.set()
        raise ModelError("429 rate limited", provider="fake", status=429, retryable=True,
                         retry_after=60)
        yield Stop("end_turn")  # pragma: no cover - makes this an async generator


async def waiting_attempt(target: str, q: str, agent: str, session: str) -> int:
    """The attempt the session's step waits to run once its retry's backoff is over (polled
    until Temporal has scheduled it, within ``WAIT``)."""
    client = await connect(Connection(target))
    handle = client.get_workflow_handle(workflow_id(q, agent, session))
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        for p in (await handle.describe()).raw_description.pending_activities:
            if p.attempt > 1 and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED:
                return int(p.attempt)
        assert asyncio.get_running_loop().time() < deadline, "no retry was scheduled"
        await asyncio.sleep(0.05)


async def test_a_cancel_does_not_wait_out_a_retry_s_backoff(
        temporal_target: str, tmp_path: Path) -> None:
    q, model = queue(), RateLimited()
    agent = Agent("busy", "You answer.", [], model_retries=5)
    async with front(temporal_target, q, agent, SqliteStore(tmp_path / "db")) as rt, \
            inline_worker(temporal_target, q, agent, model, SqliteStore(tmp_path / "db")):
        session = rt.session("busy", "s1")
        await session.start("hello", turn_id="t1")
        # The first attempt failed; Temporal holds the step for the provider's 60 s.
        assert await waiting_attempt(temporal_target, q, "busy", "s1") == 2
        await session.cancel("t1", reason="the user pressed stop")
        res = await session.result("t1", timeout=WAIT)
    assert (res.status, res.reason) == ("cancelled", "the user pressed stop")
    assert model.calls == 1  # the turn ended at the boundary before attempt 2 asked again
    # The wait was cancelled (attempt 2 never started), and the step scheduled again at
    # once, its attempt carried on: it ran as attempt 2 and ended the turn.
    found = await steps(temporal_target, q, "busy", "s1")
    assert [(s["input"]["attempts_before"], s.get("attempt"), s["end"]) for s in found] == \
        [(0, None, "cancelled"), (1, 1, "completed")]


# -- Runtime.step(attempt=), without Temporal -------------------------------------------------


async def test_an_attempt_that_its_policy_retries_writes_nothing(tmp_path: Path) -> None:
    from durable_turns import Runtime

    runs: list[tuple[int, str]] = []
    agent = Agent("pay", "You charge.", [flaky_tool(runs, fails=1, retries=1)])
    model = scripted(lambda r: CHARGE[calls_this_turn(r)])
    async with Runtime([agent], SqliteStore(tmp_path / "db"), model,
                       scheduler=NoDriveScheduler()) as rt:
        key = rt.key("pay", "s1")
        await rt.session("pay", "s1").start("go", turn_id="t1")
        state = await rt.step(key, attempt=1)  # the opening and the model's call
        assert (state.next, state.tools) == ("tool", ("charge",))
        before = await rt.store.read_events(key)
        with pytest.raises(RetryStep) as failed:
            await rt.step(key, attempt=1)
        assert failed.value.attempt == 1
        assert 0.025 <= failed.value.delay <= 0.05  # retry_delay, with "equal jitter"
        assert await rt.store.read_events(key) == before
        state = await rt.step(key, attempt=2)
        assert state.next == "model"
        with pytest.raises(ValueError, match="attempt must be an int >= 1"):
            await rt.step(key, attempt=0)
    assert [a for a, _ in runs] == [1, 2]


def test_a_step_s_options_are_those_of_the_calls_it_runs() -> None:
    from durable_turns.engine._driver import ChainState
    from durable_turns.temporal import WorkerSettings, step_options

    @tool(timeout=3, retries=4, retry_delay=2.0)
    async def slow(ctx: ToolContext) -> str:
        """Slow."""
        return "ok"

    charge, settings = flaky_tool([], fails=0, retries=1), WorkerSettings()
    state = ChainState(True, False, "tool", ("charge", "slow"))
    one = step_options(Agent("a", tools=[charge, slow]), state, settings)
    # One call a step: the step runs charge alone, with charge's limit and policy.
    assert (one.summary, one.timeout, one.attempts, one.retry_initial) == \
        ("tool charge (timeout 10s, retries 1)", 10 + 30, 2, 0.05)
    both = step_options(Agent("a", tools=[charge, slow], parallel_tools=True), state, settings)
    # A batch: both calls, their limits added, the strictest policy of the two.
    assert (both.summary, both.timeout, both.attempts, both.retry_initial, both.retry_max) == \
        ("tool charge (timeout 10s, retries 1), slow (timeout 3s, retries 4)", 10 + 3 + 30,
         5, 2.0, 30.0)
    model = step_options(Agent("a", model_retries=0), ChainState(True, False, "model"),
                         settings)
    assert (model.summary, model.attempts) == ("model (retries 0)", 0)  # unlimited: lost workers
