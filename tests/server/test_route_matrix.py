"""Issue 38 (F18, F19): every route the app's OpenAPI document lists — the API's, the
console's and the mounted protocols' (AI SDK, AG-UI) — for the session's owner, another
principal, an anonymous caller and an administrator; and every route a channel mounts. The
routes are read from ``/openapi.json`` and ``app.state.channel_routes`` when the tests are
collected, so a new route is in this matrix without a line written for it; a body for it is
made from its published schema (the test fails, naming the route, if that body does not pass
the route's checks: the guard's decision is what it is here to see).

Per route, in this order: anonymous → 401; another principal → 404 ``UnknownSession`` on a
route of the owner's session (the same as for a session that does not exist), and on a
route of none, nothing of hers shown; the owner and an administrator → passed the guard (no
401, 403 or 404 of the session) and no 5xx; and the owner's session as it was after the
others' calls.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, scripted
from durable_turns.channels.slack import slack_channel
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app, mount_ag_ui, mount_ai_sdk
from fakes.serving import serving

WAIT = 30.0
"""The bound on every wait of these tests."""
OWNER, OTHER, ADMIN = "alice", "bob", "root"
SESSION = "alice-s"
TOKENS: dict[str, dict[str, Any]] = {
    f"t-{OWNER}": {"id": OWNER}, f"t-{OTHER}": {"id": OTHER},
    f"t-{ADMIN}": {"id": ADMIN, "admin": True}}
SESSION_FIELDS = ("id", "threadId")
"""Where a protocol's body names its session (the AI SDK's chat, AG-UI's thread)."""


def authenticate(request: Request) -> dict[str, Any] | None:
    return TOKENS.get(request.headers.get("authorization", "").removeprefix("Bearer "))


def reply(request: ModelRequest) -> ModelReply:
    text = next(m.text for m in reversed(request.messages) if m.is_opening)
    return ModelReply(f"You said: {text}" if calls_this_turn(request) == 0 else "done")


def build() -> tuple[Runtime, Starlette]:
    rt = Runtime([Agent("desk", "You help.", model=scripted(reply))], MemoryStore())
    slack = slack_channel(signing_secret="s3cret", bot_token="xoxb-test")
    app = create_app(rt, authenticate, channels=[slack])
    mount_ai_sdk(app)
    mount_ag_ui(app)
    return rt, app


async def _document() -> tuple[dict[str, Any], dict[str, list[str]]]:
    _rt, app = build()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost") as c:
        doc = (await c.get("/openapi.json")).json()
    return doc, app.state.channel_routes


DOC, CHANNEL_ROUTES = asyncio.run(_document())
ROUTES = sorted((method.upper(), path) for path, item in DOC["paths"].items()
                for method in item if method in ("get", "post", "put", "patch", "delete"))
CHANNELS = sorted((name, route) for name, routes in CHANNEL_ROUTES.items() for route in routes)


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = DOC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def example(schema: dict[str, Any], depth: int = 0) -> Any:
    """The smallest value the schema takes (its required members only)."""
    schema = _resolve(schema)
    if depth > 12:
        return None
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if _resolve(o).get("type") != "null"]
            chosen = example(options[0], depth + 1)
            if "properties" not in schema:
                return chosen
            # An object's own members, and one of the alternatives it must also take.
            base = example({k: v for k, v in schema.items() if k != key}, depth + 1)
            return {**base, **(chosen or {})}
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(example(part, depth + 1) or {})
        return merged
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next(k for k in kind if k != "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: example(props.get(k, {}), depth + 1) for k in schema.get("required", ())}
    if kind == "array":
        return [example(schema.get("items", {}), depth + 1)] if schema.get("minItems") else []
    if kind == "string":
        pattern = schema.get("pattern")
        for candidate in ("x" * max(1, schema.get("minLength", 1)), "1", "user"):
            if pattern is None or re.search(pattern, candidate):
                return candidate
        raise AssertionError(f"no example for pattern {pattern!r}")
    if kind in ("integer", "number"):
        return max(0, schema.get("minimum", 0))
    if kind == "boolean":
        return False
    return None


def request_of(method: str, path: str, who: str) -> tuple[str, dict[str, Any], bool]:
    """``(url, httpx keywords, names a session)`` of a call of the route on the owner's
    session; ``who`` makes a new session's name (a fork's) its own."""
    op = DOC["paths"][path][method.lower()]
    names_session = "{session}" in path or path.endswith("/schedules/{name}")
    url, params = path, {}
    for p in op.get("parameters", []):
        value = SESSION if p["name"] == "session" else "desk" if p["name"] == "agent" \
            else example(p.get("schema", {}))
        if p["in"] == "path":
            url = url.replace(f"{{{p['name']}}}", str(value))
        elif p["in"] == "query" and p.get("required"):
            params[p["name"]] = value
    if path.endswith("/events"):
        params.update(after="0", until="turn")  # (a stream that ends)
    kw: dict[str, Any] = {"params": params}
    body = op.get("requestBody")
    if body is not None:
        schema = _resolve(body["content"]["application/json"]["schema"])
        data = example(schema)
        if "session" in schema.get("properties", {}):  # a schedule's: the owner's session
            data["session"] = SESSION
        for name in (*SESSION_FIELDS, "session"):
            if name in data:
                data[name], names_session = SESSION, True
        if "cron" in data:
            data["cron"] = "0 9 * * *"
        if "text" in data:
            data["text"] = "hi"
        if "to" in data:
            data["to"] = f"{who}-copy"
        kw["json"] = data
    return url, kw, names_session


@asynccontextmanager
async def hosted() -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    rt, app = build()
    async with rt, serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
        r = await c.post(f"/agents/desk/sessions/{SESSION}/chat", json={"text": "hello"},
                         headers={"Authorization": f"Bearer t-{OWNER}"})
        assert r.json()["status"] == "completed", r.text
        r = await c.post("/agents/desk/schedules", headers={"Authorization": f"Bearer t-{OWNER}"},
                         json={"name": "x", "seed": "hi", "every": 3600, "session": SESSION})
        assert r.status_code == 201, r.text  # the schedule a /schedules/{name} call names
        yield rt, c
        await asyncio.wait_for(rt.idle(), WAIT)


async def call(c: httpx.AsyncClient, who: str | None, method: str, path: str) -> httpx.Response:
    url, kw, _ = request_of(method, path, who or "nobody")
    headers = {} if who is None else {"Authorization": f"Bearer t-{who}"}
    return await c.request(method, url, headers=headers, **kw)


def test_the_matrix_covers_every_route_the_document_lists() -> None:
    """The document is where the routes come from: it lists the protocols' too."""
    paths = {p for _, p in ROUTES}
    assert {"/agents/{agent}/sessions/{session}/turn", "/agents/{agent}/ai-sdk/chat",
            "/agents/{agent}/ag-ui"} <= paths
    assert ("slack", "POST /slack/events") in CHANNELS


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
async def test_every_route_for_owner_other_anonymous_and_admin(method: str, path: str) -> None:
    _url, _kw, names_session = request_of(method, path, OTHER)
    public = path == "/openapi.json"  # the document itself: what anyone may read
    async with hosted() as (rt, c):
        s = rt.session("desk", SESSION)
        before = (await s.summary(), [m.text for m in await s.transcript()])
        r = await call(c, None, method, path)
        if public:
            assert r.status_code == 200
        else:
            assert r.status_code == 401, (method, path, r.text[:300])
            assert r.json()["error"]["type"] == "Unauthorized"
        r = await call(c, OTHER, method, path)
        if names_session:
            assert r.status_code == 404, (method, path, r.text[:300])
            assert r.json()["error"]["type"] in ("UnknownSession", "UnknownScheduleError")
        else:
            assert r.status_code < 400, (method, path, r.text[:300])
            assert SESSION not in r.text  # a listing shows nothing of hers
        assert (await s.summary(), [m.text for m in await s.transcript()]) == before
        for who in (OWNER, ADMIN):
            r = await call(c, who, method, path)
            # Past the guard: what the route then says (a 404 of no such turn, a 409) is
            # the route's own.
            refused = r.status_code in (401, 403) or (r.status_code == 404 and r.json()[
                "error"]["type"] in ("UnknownSession", "NotFound"))
            assert not refused and r.status_code < 500, (who, method, path, r.text[:300])


@pytest.mark.parametrize(("channel", "route"), CHANNELS, ids=[f"{n} {r}" for n, r in CHANNELS])
async def test_a_channels_routes_take_its_signature_not_a_bearer(channel: str,
                                                                route: str) -> None:
    method, path = route.split(" ", 1)
    async with hosted() as (_rt, c):
        for who in (None, OWNER, ADMIN):
            headers = {} if who is None else {"Authorization": f"Bearer t-{who}"}
            r = await c.request(method, path, headers=headers,
                                content=json.dumps({"type": "event_callback"}))
            assert r.status_code == 401, (channel, route, who, r.text)
