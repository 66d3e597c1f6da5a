"""F25 on Temporal: a message steered from a front runtime (which drives nothing) joins the
turn a Temporal worker runs, before that turn's next model call; a limit parks a worker's
turn and a grant extends it.

A real Temporal dev server (the session's ``temporal_target``); the worker runs in the
test's own process with its own runtime and store (``temporalkit.inline_worker``); its tool
waits on an event the test sets, so "while the turn runs" is a fact.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from durable_turns import (
    Agent,
    Limits,
    SqliteStore,
    Stop,
    TextDelta,
    ToolCall,
    TurnStatus,
    tool,
)
from durable_turns.models import ModelEvent, ModelRequest
from temporalkit import WAIT, front, inline_worker, queue


class Gate:
    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.open = asyncio.Event()


class Seeing:
    """First call: ``hold``; then the user texts it was shown, joined by ``|``."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        users = [m.text for m in request.messages if m.role == "user"]
        if request.messages[-1].role == "user" and len(users) == 1:
            yield ToolCall("c1", "hold", {})
            yield Stop("tool_use")
            return
        yield TextDelta("|".join(users))
        yield Stop("end_turn")


async def test_a_steer_joins_the_turn_a_temporal_worker_runs(
        temporal_target: str, tmp_path: Path) -> None:
    gate = Gate()

    @tool
    async def hold() -> str:
        """Wait for the test."""
        gate.running.set()
        await asyncio.wait_for(gate.open.wait(), WAIT)
        return "held"

    db, q = tmp_path / "db", queue()
    agent = Agent("desk", "", [hold])
    async with front(temporal_target, q, agent, SqliteStore(db)) as rt, \
            inline_worker(temporal_target, q, agent, Seeing(), SqliteStore(db)):
        s = rt.session("desk", "s1")
        await s.start("go", turn_id="t1")
        await asyncio.wait_for(gate.running.wait(), WAIT)
        st = await s.start("also", mode="steer", turn_id="st")
        assert st.steering == "t1"
        gate.open.set()
        done = await s.result("st", timeout=WAIT)
        assert (done.turn_id, done.status, done.text) == ("t1", TurnStatus.COMPLETED,
                                                          "go|also")
        assert [m.text for m in await s.transcript() if m.role == "user"] == ["go", "also"]


class Endless:
    """Always asks for one more ``step``: only a limit ends its turn."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        n = sum(1 for m in request.messages if m.role == "assistant")
        yield ToolCall(f"c{n}", "step", {"n": n})
        yield Stop("tool_use", {"input_tokens": 10, "output_tokens": 5})


@tool
async def step(n: int) -> int:
    """One more step."""
    return n


async def test_a_limit_parks_a_temporal_turn_and_a_grant_extends_it(
        temporal_target: str, tmp_path: Path) -> None:
    """F25 limits on Temporal: the worker's turn parks at its limit, an answer from the
    front runtime grants as much again, and it parks at twice the limit."""
    db, q = tmp_path / "db", queue()
    agent = Agent("work", "", [step], limits=Limits(model_calls=2, on_exceed="ask"))
    async with front(temporal_target, q, agent, SqliteStore(db)) as rt, \
            inline_worker(temporal_target, q, agent, Endless(), SqliteStore(db)):
        s = rt.session("work", "s1")
        await s.start("go", turn_id="t1")
        parked = await s.result("t1", timeout=WAIT)
        assert parked.status == TurnStatus.SUSPENDED and parked.request is not None
        assert parked.request.id == "limit:1"
        await s.resume("t1", "limit:1", True)
        again = await s.result("t1", timeout=WAIT)
        assert again.request is not None and again.request.id == "limit:2"
        replies = [m for m in await s.transcript() if m.role == "assistant"]
        assert len(replies) == 4


class Counting:
    """First answer not the schema's; then one that is."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        tries = sum(1 for m in request.messages
                    if m.role == "assistant" and m.turn_id == request.turn_id)
        yield TextDelta('{"n": 7}' if tries else '{"n": "seven"}')
        yield Stop("end_turn")


async def test_structured_output_on_a_temporal_worker(
        temporal_target: str, tmp_path: Path) -> None:
    """F25 structured output on Temporal: the invalid answer goes back as its own step, the
    valid one is the turn's output, read by the front runtime."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    db, q = tmp_path / "db", queue()
    agent = Agent("out", "")
    async with front(temporal_target, q, agent, SqliteStore(db)) as rt, \
            inline_worker(temporal_target, q, agent, Counting(), SqliteStore(db)):
        s = rt.session("out", "s1")
        await s.start("count", turn_id="t1", output=schema)
        done = await s.result("t1", timeout=WAIT)
        assert done.status == TurnStatus.COMPLETED and done.output == {"n": 7}
        assert [m.role for m in await s.transcript()] == ["user", "assistant", "user",
                                                          "assistant"]
