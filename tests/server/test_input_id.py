"""F6, F18: a parked turn's request names its id ``input_id`` wherever a client reads it, the
name ``POST …/resume`` takes (issue 37); ``id`` stays beside it, the same value, for clients
written before. Over HTTP, driven through the ASGI app."""

from __future__ import annotations

from typing import Any

import httpx

from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app


@tool
async def refund(order: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once a person approves."""
    ok = await ctx.request_input("approve-refund", f"Refund {order}?", {"type": "boolean"})
    return {"refunded": ok is True}


def reply(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("", [ToolCall("c1", "refund", {"order": "42"})])
    return ModelReply("done")


async def test_the_request_s_input_id_is_what_resume_takes_wherever_it_is_read() -> None:
    rt = Runtime([Agent("ops", "You help.", [refund])], MemoryStore(), scripted(reply))
    transport = httpx.ASGITransport(app=create_app(rt))
    async with rt, httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        parked = (await c.post("/agents/ops/sessions/s1/chat",
                               json={"text": "refund 42", "turn_id": "t1"})).json()
        session = (await c.get("/agents/ops/sessions/s1")).json()
        inbox = (await c.get("/agents/ops/pending")).json()["pending"]
        seen = [parked["request"], session["pending"], inbox[0]["request"]]
        for request in seen:  # the turn's result, the session, the inbox: one name
            assert request["input_id"] == "approve-refund" == request["id"], request
            assert request["turn_id"] == "t1"
        r = await c.post("/agents/ops/sessions/s1/resume",
                         json={"turn_id": seen[1]["turn_id"], "input_id": seen[1]["input_id"],
                               "value": True})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "completed" and r.json()["text"] == "done"
