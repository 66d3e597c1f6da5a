"""The HTTP/SSE host (F12): uvicorn on loopback in the test's loop, httpx streaming SSE."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import crashkit
from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    SqliteStore,
    SurfacePolicy,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.channels import mount_agent
from durable_turns.errors import StoreError
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.scheduling import NoDriveScheduler, Scheduler
from durable_turns.server import MAX_BODY, create_app, is_loopback
from durable_turns.stores import SessionStore
from fakes.serving import serving

WAIT = 30.0
"""The bound on every wait of these tests."""

gate: dict[str, asyncio.Event] = {}


@tool
async def hold(ctx: ToolContext) -> str:
    """Wait until the test opens the gate."""
    await gate["hold"].wait()
    return "released"


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once a person approves it."""
    answerers = {"u": {"user": "alice"}, "p": {"policy": "refunds", "scope": "eu"}}
    ok = await ctx.request_input("approve", f"Refund {order_id}?", schema={"type": "boolean"},
                                 answerers=answerers.get(order_id))
    return {"refunded": ok}


def _opening(request: ModelRequest) -> str:
    return next(m.text for m in reversed(request.messages) if m.is_opening)


def reply(request: ModelRequest) -> ModelReply:
    """``hold …`` calls ``hold``, ``refund X`` calls ``refund``, anything else is answered."""
    text, i = _opening(request), calls_this_turn(request)
    if i == 0 and text.startswith("hold"):
        return ModelReply("Holding.", [ToolCall("c1", "hold", {})])
    if i == 0 and text.startswith("refund"):
        return ModelReply("", [ToolCall("c1", "refund", {"order_id": text.split()[1]})])
    return ModelReply(f"You said: {text}" if i == 0 else "done")


async def authorize(ask: Mapping[str, Any]) -> bool:
    if ask["by"] == "boom":
        raise RuntimeError("the policy service is down")
    return bool(ask["by"] == "boss")


def agent() -> Agent:
    return Agent("desk", "You help.", [hold, refund], authorize_answer=authorize)


@dataclass
class Host:
    rt: Runtime
    client: httpx.AsyncClient

    @property
    def base(self) -> str:
        return "/agents/desk/sessions"


@asynccontextmanager
async def hosting(store: SessionStore, authenticate: Any = None,
                  agents: list[Agent] | None = None, *, scheduler: Scheduler | None = None,
                  ping: float = 15.0) -> AsyncIterator[Host]:
    rt = Runtime(agents or [agent()], store, scripted(reply, chunks=3), scheduler=scheduler)
    gate["hold"] = asyncio.Event()
    async with rt:
        app = create_app(rt, authenticate, ping=ping)
        async with serving(app) as url, httpx.AsyncClient(base_url=url,
                                                          timeout=WAIT) as client:
            yield Host(rt, client)
        gate["hold"].set()
        await asyncio.wait_for(rt.idle(), WAIT)


@pytest.fixture
async def host() -> AsyncIterator[Host]:
    async with hosting(MemoryStore()) as h:
        yield h


async def sse(response: httpx.Response) -> AsyncIterator[dict[str, str]]:
    """The frames of an SSE response: its fields; a comment-only frame as ``{":": …}``."""
    frame: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if frame:
                yield frame
            frame = {}
        elif line.startswith(":"):
            frame[":"] = line[1:].strip()
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            frame[name] = f"{frame[name]}\n{value}" if name in frame else value


async def collect(response: httpx.Response,
                  stop: Callable[[dict[str, str]], bool] | None = None) -> list[dict[str, str]]:
    out = []
    async with asyncio.timeout(WAIT):
        async for f in sse(response):
            if ":" in f and "event" not in f:
                continue
            out.append(f)
            if stop is not None and stop(f):
                break
    return out


def durable(frames: list[dict[str, str]]) -> list[tuple[int, str]]:
    return [(int(f["id"]), f["event"]) for f in frames if "id" in f]


# -- streaming ---------------------------------------------------------------------------------



async def test_serving_warns_of_a_policy_for_a_source_no_channel_emits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from durable_turns.channels.slack import slack_channel

    ops = Agent("ops", surfaces={"slack": SurfacePolicy(), "http": SurfacePolicy()})
    async with Runtime([ops], MemoryStore(), scripted([])) as rt:
        with caplog.at_level(logging.WARNING, logger="durable_turns"):
            create_app(rt)
        assert [r.getMessage() for r in caplog.records] == [
            "agent 'ops' has a policy for source 'slack', but no mounted channel emits it "
            "(mounted: ['http'])"]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="durable_turns"):
            create_app(rt, channels=[slack_channel(signing_secret="s", bot_token="t")])
        assert caplog.records == []


async def test_a_turn_streams_its_events_with_durable_ids(host: Host) -> None:
    async with host.client.stream("POST", f"{host.base}/s1/turn",
                                  json={"text": "hi", "turn_id": "t1"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-turn-id"] == "t1"
        frames = await collect(r)
    types = [f["event"] for f in frames]
    assert types[0] == "turn.started" and types[-1] == "turn.completed"
    assert set(types[1:-2]) == {"message.delta"}
    deltas = [f for f in frames if f["event"] == "message.delta"]
    assert deltas and all("id" not in f for f in deltas)
    assert "".join(json.loads(f["data"])["text"] for f in deltas) == "You said: hi"
    logged = await host.rt.session("desk", "s1").events()
    assert durable(frames) == [(e.seq, e.type) for e in logged]
    for f in frames:
        data = json.loads(f["data"])
        assert data["type"] == f["event"] and data["turn_id"] == "t1"
        assert data["session"] == "s1" and data["agent"] == "desk"


async def test_chat_answers_json_or_sse(host: Host) -> None:
    r = await host.client.post(f"{host.base}/s1/chat", json={"text": "hello"})
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "completed" and body["text"] == "You said: hello"
    assert body["request"] is None and body["error"] is None and body["turn_id"]
    async with host.client.stream("POST", f"{host.base}/s1/chat", json={"text": "again"},
                                  headers={"Accept": "text/event-stream"}) as r:
        frames = await collect(r)
    assert frames[-1]["event"] == "turn.completed"


async def test_a_turn_runs_on_after_its_client_leaves_and_a_reconnect_gets_what_it_missed(
        host: Host) -> None:
    async with host.client.stream("POST", f"{host.base}/s1/turn",
                                  json={"text": "hold on", "turn_id": "t1"}) as r:
        seen = await collect(r, lambda f: f["event"] == "action.requested")
    last = durable(seen)[-1][0]
    gate["hold"].set()  # the client is gone; the turn goes on
    done = await host.rt.session("desk", "s1").result("t1", timeout=WAIT)
    assert done.status == "completed" and done.text == "done"
    missed = [(e.seq, e.type) for e in await host.rt.session("desk", "s1").events(last)]
    assert missed[-1][1] == "turn.completed" and missed[0][0] == last + 1
    for how in ({"headers": {"Last-Event-ID": str(last)}}, {"params": {"after": str(last)}}):
        params = {"until": "turn", **how.get("params", {})}
        async with host.client.stream("GET", f"{host.base}/s1/events", params=params,
                                      headers=how.get("headers")) as r:
            assert r.status_code == 200
            frames = await collect(r)
        assert durable(frames) == missed


async def test_events_replay_then_go_live_with_keepalives() -> None:
    async with hosting(MemoryStore(), ping=0.05) as host:
        r0 = await host.client.post(f"{host.base}/s1/chat", json={"text": "first"})
        assert r0.status_code == 200
        async with host.client.stream("GET", f"{host.base}/s1/events",
                                      params={"after": "0"}) as r:
            frames: list[dict[str, str]] = []
            pings = 0
            async with asyncio.timeout(WAIT):
                async for f in sse(r):
                    if ":" in f and "event" not in f:
                        pings += 1
                        if pings == 1:  # replay is over and the stream idles: go live
                            started = await host.client.post(
                                f"{host.base}/s1/chat", json={"text": "second"})
                            assert started.status_code == 200
                        continue
                    frames.append(f)
                    if [x["event"] for x in frames].count("turn.completed") == 2:
                        break
        logged = await host.rt.session("desk", "s1").events()
        assert durable(frames) == [(e.seq, e.type) for e in logged]
        assert pings >= 1


async def test_a_turn_driven_by_another_process_streams_live(tmp_path: Path) -> None:
    db = tmp_path / "shop.sqlite"
    ops = Agent(crashkit.AGENT)  # this host only watches: another process drives the turn
    async with hosting(SqliteStore(db), agents=[ops], scheduler=NoDriveScheduler()) as host:
        url = f"/agents/{crashkit.AGENT}/sessions/{crashkit.SESSION}/events"
        child = crashkit.spawn(db, "remote", "--gate")
        try:
            async with host.client.stream("GET", url, params={"after": "0",
                                                              "until": "turn"}) as r:
                frames: list[dict[str, str]] = []
                async with asyncio.timeout(WAIT):
                    async for f in sse(r):
                        if "event" not in f:
                            continue
                        frames.append(f)
                        data = json.loads(f["data"])
                        if f["event"] == "action.requested" and data["call"]["name"] == "notify":
                            # The turn cannot end before this file exists: what follows is live.
                            assert not any(x["event"] == "turn.completed" for x in frames)
                            (tmp_path / "go").touch()
            _out, err = await asyncio.to_thread(child.communicate, timeout=WAIT)
            assert child.returncode == 0, err
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(WAIT)
        logged = await host.rt.session(crashkit.AGENT, crashkit.SESSION).events()
        assert durable(frames) == [(e.seq, e.type) for e in logged]
        assert frames[-1]["event"] == "turn.completed"
        assert json.loads(frames[-1]["data"])["text"] == crashkit.FINAL_TEXT


# -- human in the loop -------------------------------------------------------------------------


async def park(host: Host, session: str, order: str) -> dict[str, Any]:
    async with host.client.stream("POST", f"{host.base}/{session}/turn",
                                  json={"text": f"refund {order}", "turn_id": "t1"}) as r:
        frames = await collect(r)
    assert frames[-1]["event"] == "input.requested"
    request: dict[str, Any] = json.loads(frames[-1]["data"])["request"]
    return request


async def test_resume_statuses_and_the_double_click(host: Host) -> None:
    req = await park(host, "s1", "x")
    assert (req["id"], req["turn_id"]) == ("approve", "t1")
    url = f"{host.base}/s1/resume"
    ok = {"turn_id": "t1", "input_id": "approve", "value": True, "by": "bob"}
    for bad, status in [({**ok, "input_id": "nope"}, 409), ({**ok, "turn_id": "t9"}, 409),
                        ({**ok, "value": "yes"}, 422)]:
        r = await host.client.post(url, json=bad)
        assert r.status_code == status, r.text
        assert set(r.json()["error"]) == {"type", "message"}
    busy = await host.client.post(f"{host.base}/s1/turn", json={"text": "other"})
    assert busy.status_code == 409 and busy.json()["error"]["type"] == "SessionBusyError"
    inbox = (await host.client.get("/agents/desk/pending")).json()["pending"]
    assert [(p["session"], p["request"]["id"]) for p in inbox] == [("s1", "approve")]
    first = await host.client.post(url, json=ok)
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "completed"
    again = await host.client.post(url, json=ok)  # the double click: one answer
    assert again.status_code == 200 and again.json() == first.json()
    other = await host.client.post(url, json={**ok, "value": False})
    assert other.status_code == 409
    assert (await host.client.get("/agents/desk/pending")).json()["pending"] == []
    steps = [m for m in await host.rt.session("desk", "s1").transcript() if m.role == "tool"]
    assert [m.result for m in steps] == [{"refunded": True}]


async def test_resume_streams_what_follows(host: Host) -> None:
    await park(host, "s1", "x")
    async with host.client.stream(
            "POST", f"{host.base}/s1/resume", headers={"Accept": "text/event-stream"},
            json={"turn_id": "t1", "input_id": "approve", "value": True}) as r:
        frames = await collect(r)
    assert [f["event"] for f in frames if "id" in f][-1] == "turn.completed"
    assert frames[0]["event"] == "action.completed"


async def test_resume_answerers(host: Host) -> None:
    await park(host, "su", "u")
    url = f"{host.base}/su/resume"
    answer = {"turn_id": "t1", "input_id": "approve", "value": True}
    r = await host.client.post(url, json={**answer, "by": "mallory"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "ResumeAuthorizationError"
    assert (await host.client.post(url, json={**answer, "by": "alice"})).status_code == 200

    await park(host, "sp", "p")
    url = f"{host.base}/sp/resume"
    r = await host.client.post(url, json={**answer, "by": "mallory"})
    assert r.status_code == 403
    r = await host.client.post(url, json={**answer, "by": "boom"})
    assert r.status_code == 503 and "Traceback" not in r.text
    assert r.json()["error"]["type"] == "AuthorizeAnswerError"
    assert "retry later" in r.json()["error"]["message"]
    assert await host.rt.session("desk", "sp").pending() is not None  # nothing was applied
    r = await host.client.post(url, json={**answer, "by": "boss"})
    assert r.status_code == 200 and r.json()["status"] == "completed"


async def test_authenticate_names_the_speaker_and_the_resumer() -> None:
    async def authenticate(request: Any) -> dict[str, str] | None:
        token = request.headers.get("authorization", "")
        return {"id": token.removeprefix("Bearer ")} if token.startswith("Bearer ") else None

    async with hosting(MemoryStore(), authenticate) as host:
        refused = await host.client.get(f"{host.base}/s1")
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "Unauthorized"
        alice = {"Authorization": "Bearer alice"}
        r = await host.client.post(f"{host.base}/s1/chat", json={"text": "refund x"},
                                   headers=alice)
        assert r.json()["status"] == "suspended"
        answer = {"turn_id": r.json()["turn_id"], "input_id": "approve", "value": True}
        r2 = await host.client.post(f"{host.base}/s1/resume", json={**answer, "by": "alice"},
                                    headers={"Authorization": "Bearer bob"})
        assert r2.status_code == 404  # the body's by is not who calls: bob, who may not read s1
        r3 = await host.client.post(f"{host.base}/s1/resume", json=answer, headers=alice)
        assert r3.status_code == 200 and r3.json()["status"] == "completed"
        (opening,) = [m for m in await host.rt.session("desk", "s1").transcript()
                      if m.role == "user"]
        assert opening.by == "http:alice"  # an identity of where it was verified


# -- the session, its list, cancel and reset ---------------------------------------------------


async def test_session_state_list_cancel_and_reset(host: Host) -> None:
    for name in ("older", "newer"):
        assert (await host.client.post(f"{host.base}/{name}/chat",
                                       json={"text": name})).status_code == 200
    listed = (await host.client.get(host.base)).json()["sessions"]
    assert [(s["session"], s["status"]) for s in listed] == [("newer", "idle"), ("older", "idle")]
    state = (await host.client.get(f"{host.base}/older")).json()
    assert state["status"] == "idle" and state["generation"] == 0 and state["pending"] is None
    assert [m["role"] for m in state["transcript"]] == ["user", "assistant"]
    assert [t["status"] for t in state["turns"]] == ["completed"]

    async with host.client.stream("POST", f"{host.base}/older/turn",
                                  json={"text": "hold it", "turn_id": "h1"}) as r:
        await collect(r, lambda f: f["event"] == "action.requested")
    cancelled = await host.client.post(f"{host.base}/older/cancel",
                                       json={"turn_id": "h1", "reason": "enough"})
    assert cancelled.status_code == 200 and cancelled.json() == {"cancelled": ["h1"]}
    gate["hold"].set()
    done = await host.rt.session("desk", "older").result("h1", timeout=WAIT)
    assert (done.status, done.reason) == ("cancelled", "enough")

    reset = await host.client.post(f"{host.base}/older/reset")
    assert reset.json() == {"previous_session": "older#g0", "generation": 1}
    state = (await host.client.get(f"{host.base}/older")).json()
    assert (state["status"], state["generation"], state["transcript"]) == ("new", 1, [])


# -- bad input: a JSON error with its status, never a 500 --------------------------------------


async def test_bad_input_is_refused_with_json_errors(host: Host) -> None:
    await host.client.post(f"{host.base}/s1/chat", json={"text": "hi", "turn_id": "t1"})
    b = host.base
    as_json = {"Content-Type": "application/json"}
    cases: list[tuple[str, str, dict[str, Any], int]] = [
        ("POST", f"{b}/s1/turn", {"content": b"{not json", "headers": as_json}, 400),
        ("POST", f"{b}/s1/turn", {"content": b"\xff\xfe", "headers": as_json}, 400),
        ("POST", f"{b}/s1/turn", {"content": b'{"text": "x"}'}, 415),  # no Content-Type
        ("POST", f"{b}/s1/turn", {"json": []}, 400),
        ("POST", f"{b}/s1/turn", {"json": {}}, 400),
        ("POST", f"{b}/s1/turn", {"json": {"text": ""}}, 400),
        ("POST", f"{b}/s1/turn", {"json": {"text": 5}}, 400),
        ("POST", f"{b}/s1/turn", {"json": {"text": "x", "surprise": 1}}, 400),
        ("POST", f"{b}/s1/turn", {"json": {"text": "other", "turn_id": "t1"}}, 409),
        # a turn id goes back in the X-Turn-Id header: printable ASCII only
        ("POST", f"{b}/s1/turn", {"json": {"text": "x", "turn_id": "\r"}}, 400),
        ("POST", f"{b}/s1/turn", {"json": {"text": "x", "turn_id": "t 2"}}, 400),
        ("POST", f"{b}/s1/turn", {"json": {"text": "x", "turn_id": "t\u20ac"}}, 400),
        ("POST", f"{b}/s1/chat", {"json": {"text": "x", "turn_id": "t" * 201}}, 400),
        ("POST", f"{b}/s1/chat", {"content": b"x" * (MAX_BODY + 1), "headers": as_json}, 413),
        ("POST", f"{b}/s1/resume", {"json": {"turn_id": "t1"}}, 400),
        ("POST", f"{b}/s1/resume", {"json": {"turn_id": "t1", "input_id": "a"}}, 409),
        ("POST", f"{b}/s1/cancel", {"json": {"turn_id": "nope"}}, 404),
        ("POST", f"{b}/s1/cancel", {"json": {"reason": 3}}, 400),
        ("POST", f"{b}/s1/reset", {"json": {"x": 1}}, 400),
        ("GET", f"{b}/nobody", {}, 404),
        ("POST", f"{b}/nobody/cancel", {"json": {}}, 404),
        ("GET", "/agents/ghost/sessions/s1", {}, 404),
        ("POST", "/agents/ghost/sessions/s1/turn", {"json": {"text": "x"}}, 404),
        ("GET", "/agents/ghost/sessions", {}, 404),
        ("GET", "/agents/ghost/pending", {}, 404),
        ("GET", f"{b}/s1/events", {"headers": {"Last-Event-ID": "abc"}}, 400),
        ("GET", f"{b}/s1/events", {"params": {"after": "-1"}}, 400),
        ("GET", f"{b}/s1/events", {"params": {"until": "forever"}}, 400),
        ("GET", f"{b}/s1/turn", {}, 405),
        ("GET", "/nowhere", {}, 404),
    ]
    for method, url, kw, status in cases:
        r = await host.client.request(method, url, **kw)
        assert r.status_code == status, (method, url, kw, r.status_code, r.text[:200])
        assert set(r.json()["error"]) == {"type", "message"}, r.text
        assert "Traceback" not in r.text


async def test_openapi_describes_every_route(host: Host) -> None:
    doc = (await host.client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    base = "/agents/{agent}/sessions/{session}"
    assert set(doc["paths"]) == {
        "/", "/agents", "/agents/{agent}/sessions", "/agents/{agent}/pending", base,
        "/agents/{agent}/schedules", "/agents/{agent}/schedules/{name}",
        *(f"{base}/{r}" for r in ("turn", "chat", "resume", "cancel", "reset", "retry", "events",
                                  "timeline", "history", "fork", "replay"))}
    assert "text" in doc["components"]["schemas"]["TurnBody"]["properties"]


def test_loopback_is_told_from_the_rest() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "::1", "[::1]", "localhost", "127.8.0.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "10.0.0.1", "example.com", "::"]))


# -- the channel seam --------------------------------------------------------------------------


async def test_mount_agent_streams_runs_and_resumes() -> None:
    a = agent()
    rt = Runtime([a], MemoryStore(), scripted(reply))
    async with rt:
        ch = mount_agent(a, rt)
        types = [e.type async for e in ch.run_stream("hi", session="c1") if e.seq]
        assert types[0] == "turn.started" and types[-1] == "turn.completed"
        parked = [e async for e in ch.run_stream("refund x", session="c1", turn_id="r1")]
        assert parked[-1].type == "input.requested"
        again = [e.type async for e in ch.run_stream("refund x", session="c1", turn_id="r1")]
        assert again[-1] == "input.requested" and again[0] == "turn.started"
        after = [e async for e in ch.resume_stream("r1", "approve", True, session="c1")]
        assert after[-1].type == "turn.completed"
        # Redelivered after the end: the logged turn, past its earlier park, to its end.
        replay = [e.type async for e in ch.run_stream("refund x", session="c1", turn_id="r1")]
        assert replay.count("input.requested") == 1 and replay[-1] == "turn.completed"
        repeat = [e.type async for e in ch.resume_stream("r1", "approve", True, session="c1")]
        assert repeat == ["turn.completed"]
        done = await ch.reset_session(session="c1")
        assert done.generation == 1
        await rt.idle()


async def test_a_sync_authenticate_that_raises_refuses_and_channel_routes_are_served() -> None:
    def authenticate(request: Request) -> dict[str, str]:
        if request.headers.get("x-key") != "k":
            raise PermissionError("bad key")
        return {"id": "kim"}

    async def hook(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hooked")

    rt = Runtime([agent()], MemoryStore(), scripted(reply))
    async with rt:
        app = create_app(rt, authenticate, routes=[Route("/hooks/slack", hook, methods=["POST"])])
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            refused = await c.get("/agents/desk/sessions")
            assert refused.status_code == 401  # what authenticate raised is not echoed
            assert refused.json()["error"] == {"type": "Unauthorized",
                                               "message": "authentication refused"}
            ok = await c.get("/agents/desk/sessions", headers={"x-key": "k"})
            assert ok.status_code == 200 and ok.json() == {"sessions": []}
            assert (await c.post("/hooks/slack")).text == "hooked"


async def test_a_store_that_cannot_be_opened_fails_the_lifespan_before_serving(
        tmp_path: Path) -> None:
    db = tmp_path / "not-a-database.sqlite"
    db.write_bytes(b"this is not SQLite" * 100)
    rt = Runtime([agent()], SqliteStore(db), scripted(reply))
    app = create_app(rt)
    with pytest.raises(StoreError, match="not a SQLite database"):
        async with app.router.lifespan_context(app):
            pass
    assert isinstance(app.state.lifespan_error, StoreError)
    assert not rt.is_open


async def test_an_app_driven_without_a_lifespan_says_its_runtime_is_not_open() -> None:
    rt = Runtime([agent()], MemoryStore(), scripted(reply))
    transport = httpx.ASGITransport(app=create_app(rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.get("/agents/desk/sessions")
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "RuntimeNotOpenError"
        assert "async with Runtime(" in r.json()["error"]["message"]
        async with rt:
            assert (await c.get("/agents/desk/sessions")).json() == {"sessions": []}
