"""F25 structured output over HTTP: ``POST …/turn`` (and ``…/chat``) with ``output_schema``
in the body validates the turn's final answer; the result carries it as ``output`` (the chat
route's JSON answer, the session's turns); an invalid schema is a 422 (the body has the
document's shape) and stores nothing.

The app runs on uvicorn on loopback in the test's loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from durable_turns import Agent, MemoryStore, Runtime, Stop, TextDelta
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.server import create_app
from fakes.serving import serving

WAIT = 30.0
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


class Model:
    """First answer not the schema's; then one that is."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        tries = sum(1 for m in request.messages
                    if m.role == "assistant" and m.turn_id == request.turn_id)
        yield TextDelta('{"n": 7}' if tries else "seven")
        yield Stop("end_turn")


async def test_post_turn_with_an_output_schema_answers_the_validated_output() -> None:
    async with Runtime([Agent("ops", "")], MemoryStore(), Model()) as rt:
        base = "/agents/ops/sessions/s1"
        async with serving(create_app(rt)) as url, \
                httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            bad = await c.post(f"{base}/turn", json={"text": "x",
                                                     "output_schema": {"type": 12}})
            assert bad.status_code == 422
            assert bad.json()["error"]["type"] == "InvalidOutputSchema"
            assert (await c.get(base)).status_code == 404  # nothing was stored
            streamed = await c.post(f"{base}/turn", json={"text": "count",
                                                          "output_schema": SCHEMA})
            assert streamed.status_code == 200 and "turn.completed" in streamed.text
            chat = await c.post(f"{base}/chat", json={"text": "again",
                                                      "output_schema": SCHEMA})
            assert chat.status_code == 200
            assert chat.json()["status"] == "completed" and chat.json()["output"] == {"n": 7}
            turns = (await c.get(base)).json()["turns"]
            assert [t["output"] for t in turns] == [{"n": 7}, {"n": 7}]
