"""F18: ``Idempotency-Key`` on ``POST …/turn`` and ``…/chat`` (the IETF draft's semantics): a
request repeated with the same key and body is the same turn; another body is 422."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, scripted
from durable_turns.models import ModelRequest
from durable_turns.server import create_app

WAIT = 30.0
S1 = "/agents/ops/sessions/s1"


def _reply(request: ModelRequest) -> ModelReply:
    return ModelReply(f"Answered: {request.messages[-1].text}")


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    rt = Runtime([Agent("ops", "You help.")], MemoryStore(), scripted(_reply))
    transport = httpx.ASGITransport(app=create_app(rt))
    async with rt, httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                     timeout=WAIT) as c:
        yield c, rt


async def _turns(rt: Runtime, session: str = "s1") -> list[Any]:
    return [t for t in await rt.session("ops", session).chain() if t.kind == "turn"]


async def test_the_same_key_and_body_is_the_same_turn(
        client: tuple[httpx.AsyncClient, Runtime]) -> None:
    c, rt = client
    key = {"Idempotency-Key": "7d0e5c1a-order-42"}
    first = await c.post(f"{S1}/chat", json={"text": "ship order 42"}, headers=key)
    again = await c.post(f"{S1}/chat", json={"text": "ship order 42"}, headers=key)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert first.json()["text"] == "Answered: ship order 42"
    assert [t.turn_id for t in await _turns(rt)] == [first.json()["turn_id"]]
    # A new key is a new turn.
    other = await c.post(f"{S1}/chat", json={"text": "ship order 42"},
                         headers={"Idempotency-Key": "another"})
    assert other.json()["turn_id"] != first.json()["turn_id"]
    assert len(await _turns(rt)) == 2


async def test_the_same_key_with_another_body_is_422_and_starts_nothing(
        client: tuple[httpx.AsyncClient, Runtime]) -> None:
    c, rt = client
    key = {"Idempotency-Key": "k1"}
    assert (await c.post(f"{S1}/chat", json={"text": "refund 42"}, headers=key)).is_success
    for body in ({"text": "refund 43"}, {"text": "refund 42", "replace": True}):
        r = await c.post(f"{S1}/chat", json=body, headers=key)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["type"] == "IdempotencyKeyReused"
    assert len(await _turns(rt)) == 1


async def test_a_stream_asked_again_with_its_key_replays_the_same_turn(
        client: tuple[httpx.AsyncClient, Runtime]) -> None:
    c, rt = client
    key = {"Idempotency-Key": "stream-1"}
    first = await c.post(f"{S1}/turn", json={"text": "hi"}, headers=key)
    again = await c.post(f"{S1}/turn", json={"text": "hi"}, headers=key)
    assert first.headers["x-turn-id"] == again.headers["x-turn-id"]
    ids = [[line for line in r.text.splitlines() if line.startswith("id: ")]
           for r in (first, again)]
    assert ids[0] == ids[1] == ["id: 1", "id: 2", "id: 3"]
    assert len(await _turns(rt)) == 1


async def test_keys_are_the_caller_s_and_a_body_s_turn_id_is_kept(
        client: tuple[httpx.AsyncClient, Runtime]) -> None:
    c, rt = client
    key = {"Idempotency-Key": "shared"}
    ann = await c.post(f"{S1}/chat", json={"text": "hi", "by": "ann"}, headers=key)
    bob = await c.post(f"{S1}/chat", json={"text": "hi", "by": "bob"}, headers=key)
    assert ann.json()["turn_id"] != bob.json()["turn_id"]
    named = await c.post(f"{S1}/chat", json={"text": "hi", "turn_id": "mine"},
                         headers={"Idempotency-Key": "k2"})
    assert named.json()["turn_id"] == "mine"
    assert len(await _turns(rt)) == 3


async def test_requests_that_arrive_together_with_one_key_start_one_turn(
        client: tuple[httpx.AsyncClient, Runtime]) -> None:
    c, rt = client
    key = {"Idempotency-Key": "burst"}
    got = await asyncio.gather(*(c.post("/agents/ops/sessions/s2/chat", json={"text": "go"},
                                        headers=key) for _ in range(5)))
    assert {r.json()["turn_id"] for r in got} == {got[0].json()["turn_id"]}
    assert len(await _turns(rt, "s2")) == 1


@pytest.mark.parametrize("bad", ["", "x" * 256, "naïve"])
async def test_a_malformed_key_is_400(client: tuple[httpx.AsyncClient, Runtime],
                                      bad: str) -> None:
    c, rt = client
    r = await c.post(f"{S1}/chat", json={"text": "hi"},
                     headers=[(b"Idempotency-Key", bad.encode())])  # raw: not ASCII too
    assert r.status_code == 400 and r.json()["error"]["type"] == "MalformedIdempotencyKey"
    assert await _turns(rt) == []
