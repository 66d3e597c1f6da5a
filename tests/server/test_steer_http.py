"""F25 steering over HTTP (F19 for the AI SDK route): ``POST …/turn?mode=steer`` while a
turn runs answers with that turn's events, the steered message among them
(``message.steered``) before its next model call; the AI SDK chat route steers a message sent
while a turn streams; a bad ``mode`` is a 400 and stores nothing.

The app runs on uvicorn on loopback in the test's loop; the turn's tool waits on an
``asyncio.Event`` the test sets, so "while the turn runs" is a fact.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from durable_turns import Agent, MemoryStore, Runtime, Stop, TextDelta, ToolCall, tool
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.server import create_app, mount_ai_sdk
from fakes.serving import serving

WAIT = 30.0


class Gate:
    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.running = asyncio.Event()


gate: Gate


@pytest.fixture(autouse=True)
async def _fresh_gate() -> None:
    global gate
    gate = Gate()  # made in the test's loop


@tool
async def hold() -> str:
    """Wait for the test (a remote tool)."""
    gate.running.set()
    await asyncio.wait_for(gate.open.wait(), WAIT)
    return "held"


class Model:
    """First call: ``hold``; then the user texts it was shown, joined by ``|``."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        users = [m.text for m in request.messages if m.role == "user"]
        if request.messages[-1].role == "user" and len(users) == 1:
            yield ToolCall("c1", "hold", {})
            yield Stop("tool_use")
            return
        yield TextDelta("|".join(users))
        yield Stop("end_turn")


async def until(found: Callable[[], Awaitable[object]]) -> None:
    """Poll until ``found()`` is not ``None`` (the caller bounds it)."""
    while await found() is None:
        await asyncio.sleep(0.01)


def sse(text: str) -> list[dict[str, object]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def test_post_turn_mode_steer_streams_the_turn_it_joins() -> None:
    async with Runtime([Agent("ops", "", [hold])], MemoryStore(), Model()) as rt:
        base = "/agents/ops/sessions/s1"
        async with serving(create_app(rt)) as url, \
                httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            bad = await c.post(f"{base}/turn?mode=sideways", json={"text": "x"})
            assert bad.status_code == 400 and bad.json()["error"]["type"] == "InvalidMode"
            first = asyncio.create_task(c.post(f"{base}/turn", json={"text": "go",
                                                                     "turn_id": "t1"}))
            await asyncio.wait_for(gate.running.wait(), WAIT)
            steering = asyncio.create_task(c.post(f"{base}/turn?mode=steer",
                                                  json={"text": "also", "turn_id": "st"}))
            s = rt.session("ops", "s1")
            await asyncio.wait_for(until(lambda: s.entry("st")), WAIT)
            gate.open.set()
            steered, started = await asyncio.wait_for(asyncio.gather(steering, first), WAIT)
            assert steered.status_code == 200 and steered.headers["x-turn-id"] == "t1"
            events = sse(steered.text)
            kinds = [e["type"] for e in events]
            assert kinds.index("message.steered") < kinds.index("turn.completed")
            assert events[-1]["text"] == "go|also"
            assert next(e for e in events if e["type"] == "message.steered")["entry_id"] == "st"
            assert sse(started.text)[-1]["text"] == "go|also"
        assert [m.text for m in await s.transcript() if m.role == "user"] == ["go", "also"]
        assert [e.turn_id for e in await s.chain()] == ["t1", "st"]


async def test_an_ai_sdk_message_sent_while_a_turn_streams_steers_it() -> None:
    async with Runtime([Agent("desk", "", [hold])], MemoryStore(), Model()) as rt:
        app = create_app(rt)
        mount_ai_sdk(app)

        def said(mid: str, text: str) -> dict[str, object]:
            return {"id": "chat1", "messages": [
                {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}]}

        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            first = asyncio.create_task(c.post("/agents/desk/ai-sdk/chat",
                                               json=said("m1", "go")))
            await asyncio.wait_for(gate.running.wait(), WAIT)
            second = asyncio.create_task(c.post("/agents/desk/ai-sdk/chat",
                                                json=said("m2", "also")))
            s = rt.session("desk", "chat1")

            async def second_stored() -> object:
                return True if len(await s.chain()) == 2 else None

            await asyncio.wait_for(until(second_stored), WAIT)
            gate.open.set()
            one, two = await asyncio.wait_for(asyncio.gather(first, second), WAIT)
            chunks = [sse(r.text) for r in (one, two)]
            # Both answers are the one turn's message, which read the steered text.
            assert chunks[0][0]["messageId"] == chunks[1][0]["messageId"]
            for got in chunks:
                text = "".join(str(k["delta"]) for k in got if k["type"] == "text-delta")
                assert text == "go|also" and got[-1] == {"type": "finish",
                                                         "finishReason": "stop"}
        assert [e.kind for e in await s.chain()] == ["turn", "steer"]
