"""Per-tool timeouts and retries (F17): ``Tool(timeout=…, retries=…, retry_on=…)``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    SqliteStore,
    Tool,
    ToolCall,
    ToolContext,
    ToolSpec,
    TurnEvent,
    scripted,
    tool,
)
from durable_turns.errors import ConfigurationError, FatalToolError
from durable_turns.messages import Message

WAIT = 20.0
"""The bound on every wait in these tests."""


def one_call(name: str, args: dict[str, Any] | None = None) -> list[ModelReply]:
    return [ModelReply("", [ToolCall("c1", name, args or {})]), ModelReply("done")]


def tool_message(messages: list[Message]) -> Message:
    return next(m for m in messages if m.role == "tool")


async def test_a_remote_tool_over_its_timeout_is_cancelled_and_answers_a_timeout_error() -> None:
    cancelled = asyncio.Event()

    @tool(timeout=0.05)
    async def slow(ctx: ToolContext) -> str:
        """Never answers."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    async with Runtime([Agent("ops", tools=[slow])], MemoryStore(), scripted(one_call("slow"))
                       ) as rt:
        session = rt.session("ops", "s1")
        result = await session.turn("go", turn_id="t1")
        msg = tool_message(await session.transcript())
    assert result.status == "completed"
    assert cancelled.is_set()  # the tool's own task was cancelled, not left running
    assert msg.is_error
    assert msg.result == {"error": "TimeoutError: tool 'slow' took longer than 0.05s and "
                                   "was cancelled"}


async def test_a_tool_retried_twice_then_succeeding_keeps_one_idempotency_key() -> None:
    attempts: list[tuple[int, str]] = []

    @tool(retries=2, retry_delay=0.001, retry_on=(ConnectionError,))
    async def charge(amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Charge a card."""
        attempts.append((ctx.attempt, ctx.idempotency_key))
        if len(attempts) < 3:
            raise ConnectionError(f"gateway reset on attempt {ctx.attempt}")
        return {"charged": amount}

    seen: list[TurnEvent] = []
    async with Runtime([Agent("ops", tools=[charge])], MemoryStore(),
                       scripted(one_call("charge", {"amount": 5}))) as rt:
        session = rt.session("ops", "s1")
        session.observe(seen.append, turn_id="t1")
        result = await session.turn("charge it", turn_id="t1")
        msg = tool_message(await session.transcript())
        stored = [e.type for e in await session.events()]
    assert result.status == "completed"
    assert [a for a, _ in attempts] == [1, 2, 3]
    assert len({k for _, k in attempts}) == 1
    assert msg.result == {"charged": 5} and not msg.is_error
    retries = [e.to_dict() for e in seen if e.type == "action.retry"]
    assert [(r["attempt"], r["retries"], r["call"]["id"], r["error"]) for r in retries] == [
        (1, 2, "c1", "ConnectionError: gateway reset on attempt 1"),
        (2, 2, "c1", "ConnectionError: gateway reset on attempt 2"),
    ]
    assert all(r["delay"] >= 0 for r in retries)
    assert "action.retry" not in stored  # live only, like message.retry
    assert stored.count("action.completed") == 1


async def test_retries_run_out_and_the_last_error_is_the_result() -> None:
    attempts = 0

    @tool(timeout=0.05, retries=1, retry_delay=0.001)
    async def flaky(ctx: ToolContext) -> str:
        """Times out every time."""
        nonlocal attempts
        attempts += 1
        await asyncio.Event().wait()
        return "unreachable"

    async with Runtime([Agent("ops", tools=[flaky])], MemoryStore(),
                       scripted(one_call("flaky"))) as rt:
        session = rt.session("ops", "s1")
        await session.turn("go", turn_id="t1")
        msg = tool_message(await session.transcript())
    assert attempts == 2
    assert msg.result["error"].startswith("TimeoutError: tool 'flaky' took longer than 0.05s")


async def test_errors_outside_retry_on_and_fatal_errors_are_not_retried() -> None:
    calls: list[str] = []

    @tool(retries=3, retry_delay=0.001, retry_on=(ConnectionError,))
    async def picky(kind: str, ctx: ToolContext) -> str:
        """Fails in a way that is not retried."""
        calls.append(kind)
        if kind == "fatal":
            raise FatalToolError("the ledger is corrupt")
        raise ValueError("bad amount")

    script = [ModelReply("", [ToolCall("c1", "picky", {"kind": "value"})]),
              ModelReply("", [ToolCall("c2", "picky", {"kind": "fatal"})])]
    async with Runtime([Agent("ops", tools=[picky])], MemoryStore(), scripted(script)) as rt:
        session = rt.session("ops", "s1")
        result = await session.result((await session.start("go", turn_id="t1")).turn_id)
        msg = tool_message(await session.transcript())
    assert calls == ["value", "fatal"]
    assert msg.result == {"error": "ValueError: bad amount"}
    assert result.status == "failed" and "the ledger is corrupt" in (result.error or "")


async def test_a_local_tool_that_returns_past_its_timeout_is_rolled_back(tmp_path: Path) -> None:
    @tool(timeout=0.01)
    def record(item: str, ctx: ToolContext) -> str:
        """Writes a row, then works past its timeout."""
        ctx.store.unwrap().execute("INSERT INTO orders VALUES (?)", (item,))
        deadline = time.monotonic() + 0.05
        while time.monotonic() < deadline:  # CPU work nothing can interrupt
            pass
        return "written"

    store = SqliteStore(tmp_path / "db.sqlite")
    async with Runtime([Agent("ops", tools=[record])], store,
                       scripted(one_call("record", {"item": "apple"}))) as rt:
        rt.store.unwrap().execute("CREATE TABLE orders (item TEXT)")
        session = rt.session("ops", "s1")
        assert (await session.turn("go", turn_id="t1")).status == "completed"
        msg = tool_message(await session.transcript())
        rows = rt.store.unwrap().execute("SELECT count(*) FROM orders").fetchone()[0]
    assert rows == 0
    assert msg.is_error and msg.result["error"].startswith("TimeoutError: tool 'record' took ")


def test_limits_are_checked_when_declared() -> None:
    spec = ToolSpec("t", "d")

    async def remote(i: dict[str, Any], c: ToolContext) -> None:
        return None

    def local(i: dict[str, Any], c: ToolContext) -> None:
        return None

    with pytest.raises(ConfigurationError, match="timeout must be > 0"):
        Tool(spec, remote, timeout=0)
    with pytest.raises(ConfigurationError, match="retries must be an int >= 0"):
        Tool(spec, remote, retries=-1)
    with pytest.raises(ConfigurationError, match="retry_on must be a tuple"):
        Tool(spec, remote, retries=1, retry_on=ValueError)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="retries apply to remote tools"):
        Tool(spec, local, retries=1)
    t = Tool(spec, remote, timeout=2.5, retries=2)
    assert (t.timeout, t.retries, t.retry_on) == (2.5, 2, (Exception,))
    assert Tool(spec, remote).timeout is None and Tool(spec, remote).retries == 0


async def test_a_timeout_bounds_each_attempt_and_a_later_attempt_can_succeed() -> None:
    attempts = 0

    @tool(timeout=0.05, retries=1, retry_delay=0.001)
    async def wakes_up(ctx: ToolContext) -> str:
        """Hangs the first time."""
        nonlocal attempts
        attempts += 1
        if ctx.attempt == 1:
            await asyncio.wait_for(asyncio.Event().wait(), WAIT)
        return "ok"

    async with Runtime([Agent("ops", tools=[wakes_up])], MemoryStore(),
                       scripted(one_call("wakes_up"))) as rt:
        session = rt.session("ops", "s1")
        await session.turn("go", turn_id="t1")
        msg = tool_message(await session.transcript())
    assert attempts == 2 and msg.result == "ok"


async def test_action_retry_is_live_only_on_the_wire() -> None:
    import httpx

    from durable_turns.server import create_app

    failed = False

    @tool(retries=1, retry_delay=0.001)
    async def charge(ctx: ToolContext) -> str:
        """Fails once."""
        nonlocal failed
        if not failed:
            failed = True
            raise ConnectionError("reset")
        return "charged"

    async with Runtime([Agent("ops", tools=[charge])], MemoryStore(),
                       scripted(one_call("charge"))) as rt:
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                     timeout=WAIT) as client:
            r = await client.post("/agents/ops/sessions/s1/turn", json={"text": "go"})
    frames = [dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
              for block in r.text.split("\r\n\r\n") if "event:" in block]
    retry = [f for f in frames if f["event"] == "action.retry"]
    assert len(retry) == 1 and "id" not in retry[0]  # live only: no durable id
    data = json.loads(retry[0]["data"])
    assert (data["attempt"], data["retries"], data["call"]["name"], data["error"]) == (
        1, 1, "charge", "ConnectionError: reset")
    assert all("id" in f for f in frames if f["event"].startswith(("turn.", "action.c")))
