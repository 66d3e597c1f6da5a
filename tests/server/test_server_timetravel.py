"""F21: A session's past over HTTP (issue 30): ``GET …/history``, ``POST …/fork`` and
``POST …/replay``, who may use them, and what bad requests get."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.requests import Request

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, ToolCall, scripted, tool
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app
from fakes.serving import serving

WAIT = 30.0
TOKENS: dict[str, dict[str, Any]] = {
    "t-alice": {"id": "alice"}, "t-bob": {"id": "bob"}, "t-root": {"id": "root", "admin": True}}


def authenticate(request: Request) -> dict[str, Any] | None:
    return TOKENS.get(request.headers.get("authorization", "").removeprefix("Bearer "))


def echo(request: ModelRequest) -> ModelReply:
    text = next(m.text for m in reversed(request.messages) if m.is_opening)
    return ModelReply(f"You said: {text}")


def shout(request: ModelRequest) -> ModelReply:
    text = next(m.text for m in reversed(request.messages) if m.is_opening)
    return ModelReply(f"YOU SAID: {text.upper()}")


@dataclass
class Api:
    rt: Runtime
    client: httpx.AsyncClient

    async def call(self, who: str | None, method: str, path: str,
                   **kw: Any) -> httpx.Response:
        headers = {} if who is None else {"Authorization": f"Bearer t-{who}"}
        return await self.client.request(method, f"/agents/desk/sessions{path}",
                                         headers=headers, **kw)

    async def transcript(self, who: str | None, session: str) -> list[str]:
        r = await self.call(who, "GET", f"/{session}")
        assert r.status_code == 200, r.text
        return [m["text"] for m in r.json()["transcript"]]


@asynccontextmanager
async def api(*, development: bool = False) -> AsyncIterator[Api]:
    rt = Runtime([Agent("desk", "You help.")], MemoryStore(), scripted(echo))
    async with rt:
        app = create_app(rt, None if development else authenticate,
                         replay_models={"shouty": scripted(shout)})
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            yield Api(rt, c)
        await asyncio.wait_for(rt.idle(), WAIT)


async def _two_turns(a: Api, who: str | None, session: str) -> dict[str, Any]:
    """Two finished turns in ``session``; returns the checkpoint that ended the first."""
    for text in ("one", "two"):
        r = await a.call(who, "POST", f"/{session}/chat", json={"text": text})
        assert r.json()["status"] == "completed", r.text
    r = await a.call(who, "GET", f"/{session}/history")
    assert r.status_code == 200, r.text
    checkpoints = r.json()["checkpoints"]
    ends = [cp for cp in checkpoints
            if any(e["type"] == "turn.completed" for e in cp["events"])]
    assert len(ends) == 2, checkpoints
    return {k: ends[0][k] for k in ("generation", "seq", "sub")}


async def test_history_then_a_fork_at_the_first_turn_owned_by_the_caller() -> None:
    async with api() as a:
        first = await _two_turns(a, "alice", "s")
        r = await a.call("alice", "POST", "/s/fork", json={"to": "s2", "at": first})
        assert r.status_code == 201, r.text
        assert r.json()["owner"] == "http:alice" and r.json()["session"] == "s2"
        assert await a.transcript("alice", "s2") == ["one", "You said: one"]
        assert await a.transcript("alice", "s") == [
            "one", "You said: one", "two", "You said: two"]
        # The fork is alice's: bob may not read it; it goes on on its own.
        assert (await a.call("bob", "GET", "/s2")).status_code == 404
        r = await a.call("alice", "POST", "/s2/chat", json={"text": "three"})
        assert r.json()["text"] == "You said: three", r.text
        assert len(await a.transcript("alice", "s")) == 4


async def test_a_fork_that_starts_a_turn_and_a_fork_of_the_last_checkpoint() -> None:
    async with api() as a:
        await _two_turns(a, "alice", "s")
        r = await a.call("alice", "POST", "/s/fork", json={"to": "whole"})
        assert r.status_code == 201, r.text
        assert len(await a.transcript("alice", "whole")) == 4
        r = await a.call("alice", "POST", "/s/fork", json={"to": "more", "then": "again"})
        assert r.status_code == 201, r.text
        await asyncio.wait_for(a.rt.idle(), WAIT)
        assert (await a.transcript("alice", "more"))[-1] == "You said: again"


async def test_who_may_fork_and_replay() -> None:
    async with api() as a:
        first = await _two_turns(a, "alice", "s")
        await _two_turns(a, "bob", "bobs")
        r = await a.call("bob", "POST", "/s/fork", json={"to": "stolen", "at": first})
        # bob may not read alice's session: every refusal is a 404, as for none.
        assert r.status_code == 404, r.text
        assert (await a.call("bob", "GET", "/s/history")).status_code == 404
        assert (await a.call("bob", "POST", "/s/replay", json={})).status_code == 404
        assert (await a.call("root", "GET", "/stolen")).status_code == 404  # nothing written
        # An administrator may; the fork is the administrator's.
        r = await a.call("root", "POST", "/s/fork", json={"to": "audit", "at": first})
        assert r.status_code == 201 and r.json()["owner"] == "http:root", r.text
        assert (await a.call("alice", "GET", "/audit")).status_code == 404
        # A fork onto a session that exists (another's, or the caller's own) is refused,
        # and that session is left as it was.
        for to in ("bobs", "s"):
            r = await a.call("alice", "POST", "/s/fork", json={"to": to})
            assert r.status_code == 409 and r.json()["error"]["type"] == "SessionExistsError"
        assert await a.transcript("bob", "bobs") == [
            "one", "You said: one", "two", "You said: two"]
        r = await a.call(None, "GET", "/s/history")
        assert r.status_code == 401, r.text


async def test_a_replay_over_http_reports_turn_by_turn() -> None:
    async with api() as a:
        await _two_turns(a, "alice", "s")
        r = await a.call("alice", "POST", "/s/replay", json={"to": "again"})
        assert r.status_code == 201, r.text
        report = r.json()
        assert report["identical"] is True and report["replay"] == "desk/again"
        assert [t["summary"] for t in report["turns"]] == ["identical", "identical"]
        assert (await a.call("bob", "GET", "/again")).status_code == 404
        assert len(await a.transcript("alice", "again")) == 4
        # Without ``to``: a new id, the caller's too.
        r = await a.call("alice", "POST", "/s/replay", json={})
        assert r.status_code == 201, r.text
        made = r.json()["replay"].removeprefix("desk/")
        assert made.startswith("s~replay-")
        assert (await a.call("alice", "GET", f"/{made}")).json()["owner"] == "http:alice"
        # Another model the host offers, by name: each turn's text differs.
        r = await a.call("alice", "POST", "/s/replay", json={"model": "shouty"})
        assert r.status_code == 201, r.text
        assert r.json()["identical"] is False
        assert [t["replayed"]["text"] for t in r.json()["turns"]] == [
            "YOU SAID: ONE", "YOU SAID: TWO"]


async def test_bad_requests_get_clear_errors_and_write_nothing() -> None:
    async with api() as a:
        await _two_turns(a, "alice", "s")
        cases: list[tuple[str, dict[str, Any], int, str]] = [
            ("/s/fork", {"to": "has space"}, 400, "MalformedBody"),
            ("/s/fork", {}, 400, "MalformedBody"),
            ("/s/fork", {"to": "x", "at": {"generation": 0, "seq": 999, "sub": 0}}, 404,
             "UnknownCheckpoint"),
            ("/s/fork", {"to": "x", "at": {"generation": 0, "seq": -1, "sub": 0}}, 400,
             "MalformedBody"),
            ("/s/fork", {"to": "x", "surprise": 1}, 400, "MalformedBody"),
            ("/nobody/fork", {"to": "x"}, 404, "UnknownSession"),
            ("/s/replay", {"model": "anthropic:claude-opus-4"}, 400, "UnknownModel"),
            ("/s/replay", {"tools": "sometimes"}, 400, "MalformedBody"),
            ("/nobody/replay", {}, 404, "UnknownSession"),
        ]
        for path, body, status, kind in cases:
            r = await a.call("alice", "POST", path, json=body)
            assert r.status_code == status, (path, body, r.text)
            assert r.json()["error"]["type"] == kind, (path, body, r.text)
            assert "Traceback" not in r.text
        listed = await a.client.get("/agents/desk/sessions",
                                    headers={"Authorization": "Bearer t-root"})
        names = {s["session"] for s in listed.json()["sessions"]}
        assert names == {"s"}, names


async def test_the_openapi_document_offers_the_replay_models_by_name() -> None:
    async with api() as a:
        doc = (await a.client.get("/openapi.json")).json()
        model = doc["components"]["schemas"]["ReplayBody"]["properties"]["model"]
        assert model["anyOf"][0] == {"enum": ["shouty"]}
        place = doc["components"]["schemas"]["CheckpointPlace"]
        assert place["required"] == ["generation", "seq", "sub"]
        assert "201" in doc["paths"]["/agents/{agent}/sessions/{session}/fork"]["post"][
            "responses"]


async def test_development_mode_forks_too() -> None:
    async with api(development=True) as a:
        first = await _two_turns(a, None, "s")
        r = await a.call(None, "POST", "/s/fork", json={"to": "f", "at": first})
        assert r.status_code == 201 and r.json()["owner"] is None, r.text
        assert await a.transcript(None, "f") == ["one", "You said: one"]


async def test_a_fork_that_starts_a_turn_where_one_is_under_way_is_a_conflict() -> None:
    async with api() as a:
        await _two_turns(a, "alice", "s9")
        r = await a.call("alice", "GET", "/s9/history")
        start = next(cp for cp in r.json()["checkpoints"] if cp["kind"] == "start")
        at = {k: start[k] for k in ("generation", "seq", "sub")}  # the first turn under way
        r = await a.call("alice", "POST", "/s9/fork",
                         json={"to": "s9-b", "at": at, "then": "and now?"})
        assert r.status_code == 409 and r.json()["error"]["type"] == "TurnUnderWay", r.text
        assert "under way" in r.json()["error"]["message"]
        r = await a.call("alice", "GET", "/s9-b")
        assert r.status_code == 404, r.text  # no fork was written


async def test_development_mode_takes_by_for_the_fork_s_then() -> None:
    """Issue 37: ``POST …/fork`` takes ``by`` as ``/turn`` and ``/resume`` do: who speaks
    the turn ``then`` starts (development mode; with ``authenticate``, the principal)."""
    async with api(development=True) as a:
        first = await _two_turns(a, None, "s")
        r = await a.call(None, "POST", "/s/fork",
                         json={"to": "f", "at": first, "then": "three", "by": "ann"})
        assert r.status_code == 201, r.text
        await asyncio.wait_for(a.rt.idle(), WAIT)
        r = await a.call(None, "GET", "/f")
        opening = [m for m in r.json()["transcript"] if m["role"] == "user"][-1]
        assert (opening["text"], opening.get("by")) == ("three", "ann"), opening
    async with api() as a:  # with authenticate, the principal speaks, whatever by says
        first = await _two_turns(a, "alice", "s")
        r = await a.call("alice", "POST", "/s/fork",
                         json={"to": "f", "at": first, "then": "three", "by": "bob"})
        assert r.status_code == 201, r.text
        await asyncio.wait_for(a.rt.idle(), WAIT)
        r = await a.call("alice", "GET", "/f")
        opening = [m for m in r.json()["transcript"] if m["role"] == "user"][-1]
        assert opening.get("by") == "http:alice", opening


ran: list[str] = []


@tool
def note(text: str) -> str:
    """Write a note (a local tool)."""
    ran.append(text)
    return f"noted {text}"


def noter(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("Noting.", [ToolCall("n1", "note", {"text": "hi"})])
    return ModelReply("Noted.")


async def test_a_fork_that_would_run_local_tools_again_is_a_409_until_it_says_how() -> None:
    ran.clear()
    rt = Runtime([Agent("desk", "You help.", [note])], MemoryStore(), scripted(noter))
    async with rt, serving(create_app(rt)) as url, \
            httpx.AsyncClient(base_url=f"{url}/agents/desk/sessions", timeout=WAIT) as c:
        assert (await c.post("/s/chat", json={"text": "note"})).json()["text"] == "Noted."
        checkpoints = (await c.get("/s/history")).json()["checkpoints"]
        asked = next(cp for cp in checkpoints if cp["kind"] == "model")  # the call is owed
        at = {k: asked[k] for k in ("generation", "seq", "sub")}
        r = await c.post("/s/fork", json={"to": "f1", "at": at})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["type"] == "ForkRerunsToolsError"
        assert "note (call n1)" in r.json()["error"]["message"]
        assert (await c.get("/f1")).status_code == 404  # nothing written
        r = await c.post("/s/fork", json={"to": "f2", "at": at, "tools": "recorded"})
        assert r.status_code == 201 and r.json()["status"] == "idle", r.text
        assert ran == ["hi"]  # answered from the recording: not run again
        assert [m.get("result") for m in (await c.get("/f2")).json()["transcript"]
                if m["role"] == "tool"] == ["noted hi"]
        r = await c.post("/s/fork", json={"to": "f3", "at": at, "tools": "live"})
        assert r.status_code == 201, r.text
        await asyncio.wait_for(rt.idle(), WAIT)
        assert ran == ["hi", "hi"]  # run again, for real
