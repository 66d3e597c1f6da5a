"""F24 over HTTP: ``GET/POST /agents/{agent}/schedules`` and ``DELETE …/schedules/{name}``
behind the same authentication and authorization as every route; bad input is a 4xx with
a message, nothing stored."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from durable_turns import Agent, MemoryStore, Runtime
from durable_turns.clock import ManualClock
from durable_turns.schedules import fire_turn_id
from durable_turns.server import create_app
from durable_turns.testing import TestModel
from fakes.serving import serving

WAIT = 30.0
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
TOKENS: dict[str, dict[str, Any]] = {
    "t-alice": {"id": "alice"}, "t-bob": {"id": "bob"}, "t-root": {"id": "root", "admin": True}}


def authenticate(request: Request) -> dict[str, Any] | None:
    return TOKENS.get(request.headers.get("authorization", "").removeprefix("Bearer "))


@pytest.fixture
async def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
async def client(clock: ManualClock) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    rt = Runtime([Agent("desk", "You help.", model=TestModel())], MemoryStore(), clock=clock)
    async with rt:
        app = create_app(rt, authenticate)
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            yield rt, c


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer t-{who}"}


async def test_add_list_fire_and_remove(client: tuple[Runtime, httpx.AsyncClient],
                                        clock: ManualClock) -> None:
    rt, c = client
    r = await c.post("/agents/desk/schedules", headers=auth("alice"), json={
        "name": "digest", "seed": "Send the digest", "every": 60, "overlap": "queue"})
    assert r.status_code == 201, r.text
    assert r.json()["next_fire"] == (T0 + timedelta(seconds=60)).isoformat()
    looks = rt.clock_loop.looks
    clock.advance(60)
    async with asyncio.timeout(WAIT):  # until the loop fired it (the schedule moved on)
        while (await rt.schedules())[0].next_fire == T0 + timedelta(seconds=60):
            looks = await rt.clock_loop.looked(looks)
    turn = fire_turn_id("digest", T0 + timedelta(seconds=60))
    assert (await rt.wait(rt.key("desk", "schedule:digest"), turn, timeout=WAIT)).status.value \
        == "completed"
    listed = (await c.get("/agents/desk/schedules", headers=auth("alice"))).json()["schedules"]
    assert [(s["name"], s["next_fire"], s["turns"]) for s in listed] == [
        ("digest", (T0 + timedelta(seconds=120)).isoformat(), [turn])]
    # The schedule's session is alice's (her POST took it): bob sees nothing, may not delete.
    assert (await c.get("/agents/desk/schedules", headers=auth("bob"))).json() == {
        "schedules": []}
    assert (await c.delete("/agents/desk/schedules/digest", headers=auth("bob"))
            ).status_code == 404
    r = await c.post("/agents/desk/schedules", headers=auth("bob"), json={
        "name": "digest", "seed": "Mine now", "every": 60})
    assert r.status_code in (403, 404), r.text  # alice's session: refused
    assert (await rt.schedules())[0].seed == "Send the digest"
    # An administrator sees it too; its owner deletes it.
    assert len((await c.get("/agents/desk/schedules", headers=auth("root"))).json()[
        "schedules"]) == 1
    assert (await c.delete("/agents/desk/schedules/digest", headers=auth("alice"))
            ).status_code == 204
    assert await rt.schedules() == []
    assert (await c.delete("/agents/desk/schedules/digest", headers=auth("alice"))
            ).status_code == 404


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"name": "x", "seed": "go", "every": 60, "cron": "* * * * *"}, 422, "exactly one of"),
    ({"name": "x", "seed": "go"}, 422, "exactly one of"),
    ({"name": "x", "seed": "go", "cron": "not a cron"}, 422, "does not parse"),
    ({"name": "x", "seed": "go", "cron": "0 9 * * *", "tz": "Atlantis/Capital"}, 422,
     "unknown time zone"),
    ({"name": "x", "seed": "go", "at": "0001-01-01T00:00:00+14:00"}, 422, "out of range"),
    ({"name": "x", "seed": "go", "every": 2.5e16}, 400, "every"),
    ({"name": "x", "seed": "go", "every": 60, "overlap": "sometimes"}, 400, "overlap"),
    ({"name": "x", "seed": "go", "every": 60, "colour": "red"}, 400, "colour"),
    ({"name": "x y", "seed": "go", "every": 60}, 400, "name"),
])
async def test_bad_input_is_refused_with_its_reason(
        client: tuple[Runtime, httpx.AsyncClient], body: dict[str, Any], status: int,
        message: str) -> None:
    rt, c = client
    r = await c.post("/agents/desk/schedules", headers=auth("alice"), json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]
    assert await rt.schedules() == []


async def test_unauthenticated_and_unknown_agent(
        client: tuple[Runtime, httpx.AsyncClient]) -> None:
    _, c = client
    assert (await c.get("/agents/desk/schedules")).status_code == 401
    assert (await c.post("/agents/desk/schedules", json={
        "name": "x", "seed": "go", "every": 60})).status_code == 401
    assert (await c.delete("/agents/desk/schedules/x")).status_code == 401
    assert (await c.get("/agents/nobody/schedules", headers=auth("alice"))).status_code == 404
    doc = (await c.get("/openapi.json")).json()
    assert set(doc["paths"]["/agents/{agent}/schedules"]) == {"get", "post"}
    assert "delete" in doc["paths"]["/agents/{agent}/schedules/{name}"]
