"""F24 on Temporal: a sleeping turn's workflow waits on a workflow timer, then fires the
wake-up (an activity), and the turn goes on; no clock loop runs in a Temporal runtime."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durable_turns import (
    Agent,
    ModelReply,
    SqliteStore,
    ToolCall,
    ToolContext,
    TurnStatus,
    scripted,
    tool,
)
from temporalkit import WAIT, inline_worker, queue

pytest.importorskip("temporalio")

ran: list[str] = []


@tool
async def nap(ctx: ToolContext) -> str:
    """Sleep a second, then act."""
    ran.append("body")
    await ctx.sleep(1)
    ran.append("after sleep")
    return "rested"


async def test_a_sleep_is_a_workflow_timer(temporal_target: str, tmp_path: Path) -> None:
    ran.clear()
    model = scripted([ModelReply("", [ToolCall("c1", "nap", {})]), ModelReply("Rested.")])
    agent = Agent("napper", "", [nap])
    async with inline_worker(temporal_target, queue(), agent, model,
                             SqliteStore(tmp_path / "db")) as rt:
        assert not rt.clock_loop.running  # Temporal's timer wakes it, not a clock loop
        session = rt.session("napper", "s1")
        await session.start("nap", turn_id="t1")
        parked = await session.result("t1", timeout=WAIT)
        assert parked.status == TurnStatus.SUSPENDED
        async with asyncio.timeout(WAIT), rt.subscribe(session.key, 0) as events:
            async for e in events:
                if e.type == "turn.completed":
                    break
        done = await session.result("t1", timeout=WAIT)
        assert (done.status, done.text) == (TurnStatus.COMPLETED, "Rested.")
        assert ran == ["body", "body", "after sleep"]
