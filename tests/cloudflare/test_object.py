"""F27: the agent's Durable Object (``durable_turns.cloudflare.AgentObject``) in CPython, on the
fake of ``ctx.storage`` (``durable_turns.cloudflare.testing``), reached as a Worker reaches
it (``forward`` to the session's object of an ``ObjectNamespace``): a turn streamed as SSE, a
chat's JSON, a local tool's row committed with its step, a park that survives an eviction and
resumes (409 for a wrong answer's id, 403 for another principal), a cancel, a reset, a replay
by cursor, the alarm as the backstop of a turn an eviction cut off, and the HTTP host's
checks (origin, authenticate, authorize, bodies)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from durable_turns.cloudflare import ObjectRequest, Reply, forward
from durable_turns.cloudflare.testing import JS_NULL, ObjectNamespace
from object_app import DeskObject

WAIT = 30.0
BASE = "http://localhost/agents/desk/sessions"
NAME = "desk/s1"


def _namespace(tmp_path: Path, **env: Any) -> ObjectNamespace:
    return ObjectNamespace(DeskObject, SimpleNamespace(**env), folder=tmp_path)


async def _call(ns: ObjectNamespace, method: str, path: str, body: Any = None, *,
                url: str = BASE, **headers: str) -> Reply:
    text = "" if body is None else json.dumps(body)
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
    request = ObjectRequest(method, f"{url}/{path}", text, headers)
    async with asyncio.timeout(WAIT):
        reply = await forward(request, ns)
    assert isinstance(reply, Reply)
    return reply


async def _events(reply: Reply) -> list[dict[str, Any]]:
    """The SSE frames of a reply, to the stream's end."""
    async with asyncio.timeout(WAIT):
        raw = (await reply.read()).decode()
    out = []
    for block in raw.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            out.append({"id": fields.get("id"), "type": fields["event"],
                        **json.loads(fields["data"])})
    return out


def _notes(ns: ObjectNamespace) -> list[str]:
    sql = ns.storage(NAME).sql
    return [r[0] for r in sql.exec("SELECT v FROM notes").raw().toArray()]


async def _idle(ns: ObjectNamespace) -> None:
    async with asyncio.timeout(WAIT):
        await ns.get(NAME).scheduler.wait_idle()


async def test_a_turn_streams_over_the_object_s_sse_and_its_tool_runs_once(
        tmp_path: Path) -> None:
    ran: list[str] = []
    ns = _namespace(tmp_path, ran=ran.append)
    reply = await _call(ns, "POST", "s1/turn", {"text": "note apples"})
    assert reply.status == 200 and reply.headers["Content-Type"] == "text/event-stream"
    events = await _events(reply)
    types = [e["type"] for e in events]
    assert types[0] == "turn.started" and types[-1] == "turn.completed"
    assert "action.completed" in types
    assert events[-1]["turn_id"] == reply.headers["X-Turn-Id"]
    assert events[-1]["text"] == "note apples: {'noted': 'apples'}"
    durable = [int(e["id"]) for e in events if e["id"] is not None]
    assert durable == sorted(durable) and len(durable) >= 4
    await _idle(ns)
    assert _notes(ns) == ["apples"] and ran == ["apples"]
    assert await ns.storage(NAME).getAlarm() is JS_NULL  # nothing left: no alarm


async def test_chat_answers_json_or_sse_by_accept(tmp_path: Path) -> None:
    ns = _namespace(tmp_path)
    reply = await _call(ns, "POST", "s1/chat", {"text": "hello"})
    assert reply.status == 200
    result = await reply.json()
    assert result["status"] == "completed" and result["text"] == "hello: done"
    streamed = await _call(ns, "POST", "s1/chat", {"text": "again"},
                           Accept="text/event-stream")
    assert [e["type"] for e in await _events(streamed)][-1] == "turn.completed"
    shown = await (await _call(ns, "GET", "s1")).json()
    assert [m["text"] for m in shown["transcript"]] == ["hello", "hello: done", "again",
                                                        "again: done"]


async def test_a_park_survives_an_eviction_and_resumes(tmp_path: Path) -> None:
    ns = _namespace(tmp_path)
    parked = await (await _call(ns, "POST", "s1/chat", {"text": "ask"})).json()
    assert parked["status"] == "suspended" and parked["request"]["id"] == "ok"
    first = ns.get(NAME)
    await _idle(ns)
    await first.runtime.close()
    ns.evict(NAME)  # a new instance, on the same storage, answers the rest
    assert ns.get(NAME) is not first
    wrong = await _call(ns, "POST", "s1/resume", {"turn_id": parked["turn_id"],
                                                  "input_id": "nope", "value": True})
    assert wrong.status == 409, await wrong.read()
    done = await _call(ns, "POST", "s1/resume", {"turn_id": parked["turn_id"],
                                                 "input_id": "ok", "value": True})
    assert done.status == 200, await done.read()
    assert (await done.json())["text"] == "ask: True"


async def test_a_cancel_ends_a_parked_turn_and_a_reset_starts_afresh(tmp_path: Path) -> None:
    ns = _namespace(tmp_path)
    parked = await (await _call(ns, "POST", "s1/chat", {"text": "ask"})).json()
    cancelled = await _call(ns, "POST", "s1/cancel", {"turn_id": parked["turn_id"]})
    assert cancelled.status == 200, await cancelled.read()
    await _idle(ns)
    shown = await (await _call(ns, "GET", "s1")).json()
    assert shown["status"] != "suspended"
    asked = await _events(await _call(ns, "GET", "s1/events?until=turn&after=0"))
    assert asked[-1]["type"] == "input.requested"  # a park ends what until=turn follows
    after = await _events(await _call(ns, "GET", "s1/events?until=turn",
                                      **{"Last-Event-ID": asked[-1]["id"]}))
    assert [e["type"] for e in after][-1] == "turn.cancelled"
    assert all(int(e["id"]) > int(asked[-1]["id"]) for e in after)
    reset = await _call(ns, "POST", "s1/reset", {})
    assert reset.status == 200 and (await reset.json())["generation"] == 1
    assert (await (await _call(ns, "GET", "s1")).json())["transcript"] == []


async def test_events_replay_from_a_cursor(tmp_path: Path) -> None:
    ns = _namespace(tmp_path)
    everything = await _events(await _call(ns, "POST", "s1/turn", {"text": "note pears"}))
    durable = [e for e in everything if e["id"] is not None]
    cursor = durable[1]["id"]
    again = await _events(await _call(ns, "GET", "s1/events?until=turn",
                                      **{"Last-Event-ID": cursor}))
    assert [e["id"] for e in again] == [e["id"] for e in durable[2:]]
    assert again == durable[2:]
    bad = await _call(ns, "GET", "s1/events?after=x")
    assert bad.status == 400


async def test_mode_steer_joins_the_running_turn_and_streams_it(tmp_path: Path) -> None:
    """``POST …/turn?mode=steer`` while a turn runs answers with that turn's events, the
    steered text among them (``message.steered``) before its next model call, which sees it;
    a bad mode is a 400, ``steer`` with ``replace`` a 422, and neither stores a turn."""
    gate = asyncio.Event()
    ns = _namespace(tmp_path, gate=gate)
    first = await _call(ns, "POST", "s1/turn", {"text": "hold"})
    turn_id = first.headers["X-Turn-Id"]
    for query, body, status in [("mode=sideways", {"text": "x"}, 400),
                                ("mode=steer&replace=1", {"text": "x"}, 422),
                                ("mode=steer", {"text": "x", "replace": True}, 422)]:
        got = await _call(ns, "POST", f"s1/turn?{query}", body)
        assert got.status == status, query
        assert (await got.json())["error"]["type"] == "InvalidMode"
    steer = await _call(ns, "POST", "s1/turn?mode=steer", {"text": "also this"})
    assert steer.status == 200, await steer.read()
    assert steer.headers["X-Turn-Id"] == turn_id  # the turn it joins
    gate.set()
    joined = await _events(steer)
    ran = await _events(first)
    assert [e["type"] for e in joined] == [e["type"] for e in ran]  # that turn's stream
    steered = [e for e in joined if e["type"] == "message.steered"]
    assert len(steered) == 1 and steered[0]["turn_id"] == turn_id
    assert joined[-1]["type"] == "turn.completed" and joined[-1]["turn_id"] == turn_id
    assert joined[-1]["text"] == "hold|also this"
    await _idle(ns)
    shown = await (await _call(ns, "GET", "s1")).json()
    users = [m["text"] for m in shown["transcript"] if m["role"] == "user"]
    assert users == ["hold", "also this"]  # the refused ones stored nothing


async def test_the_alarm_finishes_a_turn_an_eviction_cut_off(tmp_path: Path) -> None:
    now = [1_000.0]
    gate = asyncio.Event()
    ns = ObjectNamespace(lambda ctx, env: DeskObject(ctx, env, clock=lambda: now[0]),
                         SimpleNamespace(gate=gate), folder=tmp_path)
    reply = await _call(ns, "POST", "s1/turn", {"text": "hang"})
    first = ns.get(NAME)
    storage = ns.storage(NAME)
    assert await storage.getAlarm() == (1_000.0 + first.scheduler.backstop) * 1000
    await first.runtime.close()  # evicted mid-turn: its tasks gone, its storage kept
    await reply.close()
    ns.evict(NAME)
    gate.set()
    now[0] += first.scheduler.backstop
    assert storage.due(now[0] * 1000)
    second = ns.get(NAME)
    async with asyncio.timeout(WAIT):
        await second.alarm()
    turn = reply.headers["X-Turn-Id"]
    result = await second.runtime.session("desk", "s1").result(turn, timeout=WAIT)
    assert result.status == "completed" and result.text == "hang: done"
    await _idle(ns)
    assert await storage.getAlarm() is JS_NULL


def _bearer(request: Any) -> Any:
    token = request.header("authorization") or ""
    return {"id": token.removeprefix("Bearer ")} if token.startswith("Bearer ") else None


async def test_the_http_host_s_checks_guard_the_object(tmp_path: Path) -> None:
    ns = _namespace(tmp_path, authenticate=_bearer)
    url = "https://agents.example/agents/desk/sessions"
    anon = await _call(ns, "POST", "s1/chat", {"text": "ask"}, url=url)
    assert anon.status == 401
    parked = await (await _call(ns, "POST", "s1/chat", {"text": "ask"}, url=url,
                                Authorization="Bearer ann")).json()
    assert parked["status"] == "suspended"
    theirs = await _call(ns, "GET", "s1/events?until=turn", url=url,
                         Authorization="Bearer bob")
    assert theirs.status == 403
    answer = {"turn_id": parked["turn_id"], "input_id": "ok", "value": True}
    refused = await _call(ns, "POST", "s1/resume", answer, url=url, Authorization="Bearer bob")
    assert refused.status == 403
    foreign = await _call(ns, "POST", "s1/resume", answer, url=url, Authorization="Bearer ann",
                          Origin="https://evil.example")
    assert foreign.status == 403
    done = await _call(ns, "POST", "s1/resume", answer, url=url, Authorization="Bearer ann",
                       Origin="https://agents.example")
    assert (await done.json())["status"] == "completed"


async def test_bad_requests_get_clear_errors(tmp_path: Path) -> None:
    ns = _namespace(tmp_path)
    remote = await _call(ns, "POST", "s1/chat", {"text": "hi"},
                         url="https://agents.example/agents/desk/sessions")
    assert remote.status == 403  # development mode serves this machine only
    for path, body, status in [("s1/chat", {"text": " "}, 400), ("s1/chat", {"txt": "a"}, 400),
                               ("s1/nothing", {}, 404), ("s1/turn/more", {}, 404)]:
        got = await _call(ns, "POST", path, body)
        assert got.status == status, (path, await got.read())
        assert "error" in await got.json()
    wrong_type = await _call(ns, "POST", "s1/chat", None, **{"Content-Type": "text/plain"})
    assert wrong_type.status == 415
    unknown = await _call(ns, "POST", "s1/chat", {"text": "hi"},
                          url="http://localhost/agents/nobody/sessions")
    assert unknown.status == 404
    outside = await forward(ObjectRequest("GET", "http://localhost/elsewhere"), ns)
    assert isinstance(outside, Reply) and outside.status == 404


@pytest.mark.parametrize("path", ["/agents/a/sessions/s", "/agents/a/sessions/s/turn"])
def test_a_session_s_paths_name_its_object(path: str) -> None:
    from durable_turns.cloudflare import object_name

    assert object_name(path) == "a/s"
    assert object_name("/agents/a/sessions/") is None
