"""F18: Bad input is a 4xx with a JSON error, never a 500: each case the attack on the HTTP host
found answered 500 (deep JSON, huge or foreign cursors, Slack's malformed headers and
payloads), and the edges of the OpenAPI document (405's ``Allow``, a slash too many)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

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
from durable_turns._input_limits import MAX_DEPTH
from durable_turns.channels.slack import slack_channel
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app
from fakes.serving import serving
from fakes.slack_api import SECRET, event_callback, sign, signed

WAIT = 30.0
"""The bound on every wait of these tests."""


@tool
async def ask(ctx: ToolContext) -> Any:
    """Ask for any JSON value."""
    return await ctx.request_input("value", "A value?")


def reply(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("", [ToolCall("c1", "ask", {})])
    return ModelReply("done")


@dataclass
class Host:
    client: httpx.AsyncClient
    rt: Runtime
    parked: str


@asynccontextmanager
async def hosted() -> AsyncIterator[Host]:
    rt = Runtime([Agent("desk", "You help.", [ask])], MemoryStore(), scripted(reply))
    slack = slack_channel(signing_secret=SECRET, bot_token="xoxb-t",
                          base_url="http://127.0.0.1:9/api/")  # never reached here
    async with rt, serving(create_app(rt, channels=[slack])) as url, \
            httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
        r = await client.post("/agents/desk/sessions/s1/chat", json={"text": "go"})
        assert r.json()["status"] == "suspended"
        yield Host(client, rt, r.json()["turn_id"])


def nested(depth: int, inner: Any = 1) -> str:
    return "[" * depth + json.dumps(inner) + "]" * depth


async def test_deep_json_is_a_400_at_any_depth(caplog: pytest.LogCaptureFixture) -> None:
    async with hosted() as h:
        resume = "/agents/desk/sessions/s1/resume"
        as_json = {"Content-Type": "application/json"}
        with caplog.at_level(logging.ERROR):
            for body in (
                "[" * 200_000,                                    # the report's
                nested(200_000),
                '{"text": ' + nested(5_000) + "}",
                f'{{"turn_id": "{h.parked}", "input_id": "value", "value": {nested(990)}}}',
                f'{{"turn_id": "{h.parked}", "input_id": "value", '
                f'"value": {nested(MAX_DEPTH)}}}',                # one object around it
            ):
                r = await h.client.post(resume, content=body, headers=as_json)
                assert r.status_code == 400, (body[:60], r.text)
                assert r.json()["error"]["type"] == "MalformedBody"
            assert "nested deeper than 64" in r.json()["error"]["message"]
        assert caplog.records == []  # no traceback logged per request
        assert await h.rt.session("desk", "s1").pending() is not None
        # At the limit, it is taken.
        value = json.loads(nested(MAX_DEPTH - 2))
        r = await h.client.post(resume, json={"turn_id": h.parked, "input_id": "value",
                                              "value": value})
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text


async def test_cursors_are_ascii_digits_within_64_bits() -> None:
    async with hosted() as h:
        events = "/agents/desk/sessions/s1/events"
        refused: list[dict[str, Any]] = [
            {"params": {"after": "99999999999999999999999"}},
            {"params": {"after": "9223372036854775808"}},            # 2**63
            {"params": {"after": "\u0661"}},                          # Arabic-Indic one
            {"params": {"after": "\u00b2"}},                          # superscript two
            {"params": {"after": "-1"}}, {"params": {"after": "+1"}},
            {"params": {"after": " 1"}}, {"params": {"after": "1.0"}},
            {"headers": {"Last-Event-ID": "99999999999999999999999"}},
            {"headers": {"Last-Event-ID": "1e3"}},
        ]
        for kw in refused:
            r = await h.client.get(events, **kw)
            assert r.status_code == 400, (kw, r.text)
            assert r.json()["error"]["type"] == "MalformedCursor"
        timeline = "/agents/desk/sessions/s1/timeline"
        for last in ("0", "99999999999999999999999", "\u0661", "-1"):
            r = await h.client.get(timeline, params={"last": last})
            assert r.status_code == 400 and r.json()["error"]["type"] == "MalformedQuery"
        top = {"after": "9223372036854775807", "until": "turn"}
        async with h.client.stream("GET", events, params=top) as r:
            assert r.status_code == 200  # the largest cursor is taken (and waits)
        r = await h.client.get(timeline, params={"last": "9223372036854775807"})
        assert r.status_code == 200


async def test_a_405_says_what_is_allowed_and_a_slash_too_many_is_not_redirected() -> None:
    async with hosted() as h:
        r = await h.client.get("/agents/desk/sessions/s1/turn")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"]["type"] == "MethodNotAllowed"
        r = await h.client.get("/agents/desk/sessions/", headers={"Host": "127.0.0.1"})
        assert r.status_code == 404 and "location" not in r.headers


# -- Slack: what is not signed properly is a 401 Slack should not resend ------------------------


async def test_slack_headers_and_bodies_that_cannot_be_checked_are_401() -> None:
    async with hosted() as h:
        body = json.dumps({"type": "url_verification", "challenge": "c"}).encode()
        good = sign(body, SECRET, None)
        stamp = good["X-Slack-Request-Timestamp"]
        cases: list[tuple[bytes, dict[str, Any]]] = [
            (body, {**good, "X-Slack-Request-Timestamp": "soon"}),
            (body, {**good, "X-Slack-Request-Timestamp": f"{stamp}.5"}),
            (body, {**good, "X-Slack-Request-Timestamp": ("\u0661" * 10).encode()}),
            (body, {**good, "X-Slack-Request-Timestamp": "9" * 40}),
            (b"\xff\xfe" + body, sign(b"\xff\xfe" + body, SECRET, None)),
            (body, {"X-Slack-Request-Timestamp": stamp}),         # no signature
            (body, {**good, "X-Slack-Signature": "v0=" + "0" * 64}),
        ]
        for path in ("/slack/events", "/slack/actions"):
            for raw, headers in cases:
                r = await h.client.post(path, content=raw, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.headers["x-slack-no-retry"] == "1"
                assert r.json()["error"]["type"] == "SlackRequestRefused"


async def test_slack_payloads_signed_but_malformed_are_400_without_resend() -> None:
    async with hosted() as h:
        def mention(**event: Any) -> dict[str, Any]:
            envelope = event_callback("<@UBOT> hi")
            envelope["event"].update(event)
            return envelope

        for envelope in (
            mention(user=["U1", "U2"]), mention(user={"id": "U1"}), mention(channel=5),
            mention(ts=1.5), mention(text=["hi"]), mention(thread_ts={"x": 1}),
            {**event_callback("hi"), "authorizations": "all"},
        ):
            raw, headers = signed(envelope)
            r = await h.client.post("/slack/events", content=raw, headers=headers)
            assert r.status_code == 400, (envelope["event"], r.text)
            assert "resend" not in r.text and r.headers["x-slack-no-retry"] == "1"
        deep, headers = signed(nested(100_000).encode())
        r = await h.client.post("/slack/events", content=deep,
                                headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 400
        click: dict[str, Any] = {"type": "block_actions", "user": {"id": "U1"}, "response_url": "http://x/",
                 "actions": [{"action_id": "durable_turns.approve",
                              "value": json.dumps({"s": "s1", "t": h.parked, "i": "value"})}]}
        for broken in ({**click, "message": "a string"},
                       {**click, "message": {"blocks": "nope"}},
                       {**click, "message": {"blocks": [{"type": "section", "text": "x"}]}},
                       {**click, "user": ["U1"]},
                       {**click, "actions": [{**click["actions"][0], "value": "[" * 5000}]},
                       {**click, "actions": [{**click["actions"][0],
                                              "value": json.dumps({"s": 1, "t": 2, "i": 3})}]}):
            raw, headers = signed(urlencode({"payload": json.dumps(broken)}).encode())
            r = await h.client.post("/slack/actions", content=raw, headers=headers)
            assert r.status_code == 400, (broken, r.text)
            assert "resend" not in r.text and r.headers["x-slack-no-retry"] == "1"
        assert await h.rt.session("desk", "s1").pending() is not None


async def test_a_stale_slack_timestamp_is_401() -> None:
    async with hosted() as h:
        raw, headers = signed({"type": "url_verification", "challenge": "c"},
                              ts=int(time.time()) - 301)
        r = await h.client.post("/slack/events", content=raw, headers=headers)
        assert r.status_code == 401 and r.headers["x-slack-no-retry"] == "1"


async def test_the_openapi_document_says_what_the_server_does() -> None:
    """The four places the report found them apart: ``?last=0``, the bodies turn, chat and
    resume need, the events of a stream, and 405's ``Allow`` (above)."""
    async with hosted() as h:
        doc = (await h.client.get("/openapi.json")).json()
        assert doc["openapi"] == "3.2.0"
        base = "/agents/{agent}/sessions/{session}"
        (last,) = [p for p in doc["paths"][f"{base}/timeline"]["get"]["parameters"]
                   if p["name"] == "last"]
        assert last["schema"]["minimum"] == 1
        r = await h.client.get("/agents/desk/sessions/s1/timeline", params={"last": "0"})
        assert r.status_code == 400
        for route, required in (("turn", True), ("chat", True), ("resume", True),
                                ("cancel", False), ("reset", False)):
            assert doc["paths"][f"{base}/{route}"]["post"]["requestBody"]["required"] is required
            r = await h.client.post(f"/agents/desk/sessions/s2/{route}",
                                    headers={"Content-Type": "application/json"})
            assert (r.status_code == 400) is required, (route, r.status_code, r.text)
        for path, method in ((f"{base}/turn", "post"), (f"{base}/events", "get")):
            stream = doc["paths"][path][method]["responses"]["200"]["content"]
            item = stream["text/event-stream"]["itemSchema"]
            assert item["required"] == ["event", "data"]
            assert "turn.completed" in item["properties"]["event"]["enum"]
