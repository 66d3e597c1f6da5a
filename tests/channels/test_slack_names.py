"""Issue 38 through the Slack channel (F16, F18), against the fake Slack Web API: a thread's
session is the channel's. The API cannot make or take a ``slack:`` name; a session made under
one elsewhere (before the API refused them) gets nothing said in the thread; a button answers
only a turn the channel heard or delivered."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import Request

import slack_app
from durable_turns import Runtime, SessionKey, SqliteStore
from durable_turns.channels.slack import slack_channel
from durable_turns.server import create_app
from fakes.serving import serving
from fakes.slack_api import SECRET, TEAM, TOKEN, SlackFake, event_callback
from test_slack import WAIT, World

TOKENS: dict[str, dict[str, Any]] = {"t-bob": {"id": "bob"},
                                     "t-root": {"id": "root", "admin": True}}


def authenticate(request: Request) -> dict[str, Any] | None:
    return TOKENS.get(request.headers.get("authorization", "").removeprefix("Bearer "))


@asynccontextmanager
async def authenticated_world(tmp_path: Path) -> AsyncIterator[World]:
    """The Slack channel beside an API whose callers are bearer principals."""
    fake = SlackFake()
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        runtime = Runtime([slack_app.build_agent()], SqliteStore(tmp_path / "s.db"))
        slack = slack_channel(signing_secret=SECRET, bot_token=TOKEN,
                              base_url=f"{fake_url}/api/")
        app = create_app(runtime, authenticate, channels=[slack])
        async with runtime, serving(app) as url, httpx.AsyncClient(timeout=WAIT) as http:
            try:
                yield World(fake, runtime, slack, url, http)
            finally:
                await asyncio.wait_for(slack.idle(), WAIT)


async def test_an_http_principal_cannot_make_or_take_a_threads_session(tmp_path: Path) -> None:
    """Finding 1: team, channel and thread ts are in a message link; bob's session of that
    name would be where the thread's messages go."""
    name = f"slack:{TEAM}:C1:600.000001"
    async with authenticated_world(tmp_path) as w:
        base = f"{w.url}/agents/{slack_app.AGENT}/sessions"
        bob = {"Authorization": "Bearer t-bob"}
        for route, body in (("chat", {"text": "mine"}), ("turn", {"text": "mine"}),
                            ("reset", {})):
            r = await w.http.post(f"{base}/{name}/{route}", json=body, headers=bob)
            assert r.status_code == 403, (route, r.text)
            assert r.json()["error"]["type"] == "ReservedSessionName"
            assert "slack channel" in r.json()["error"]["message"]
        # Not by a fork or a replay of bob's own session either.
        r = await w.http.post(f"{base}/bobs/chat", json={"text": "hello"}, headers=bob)
        assert r.status_code == 200, r.text
        r = await w.http.post(f"{base}/bobs/fork", json={"to": name}, headers=bob)
        assert r.status_code == 403 and r.json()["error"]["type"] == "ReservedSessionName"
        r = await w.http.post(f"{base}/bobs/replay", json={"to": name}, headers=bob)
        assert r.status_code == 403 and r.json()["error"]["type"] == "ReservedSessionName"
        assert not (await w.slack.ctx.session(name).summary()).exists
        # Nor by an administrator: a channel's session is made by the channel.
        r = await w.http.post(f"{base}/{name}/chat", json={"text": "x"},
                              headers={"Authorization": "Bearer t-root"})
        assert r.status_code == 403


async def test_a_squatted_threads_session_gets_nothing_said_in_the_thread(
        tmp_path: Path) -> None:
    """A session bob made under the thread's name before the API refused it (its owner, as
    migration 9 names it, http:bob): the thread's plain messages and mentions are not
    stored in it, and bob reads nothing of the thread."""
    name = f"slack:{TEAM}:C1:700.000001"
    async with authenticated_world(tmp_path) as w:
        key = SessionKey(slack_app.AGENT, name)
        assert await w.runtime.queries.own(key, "http:bob") == "http:bob"
        squat = w.slack.ctx.session(name)
        await squat.turn("bob's opening")
        before = [m.text for m in await squat.transcript()]
        plain = event_callback("confidential plan for Q3", kind="message", user="U777",
                               thread_ts="700.000001", ts="700.000002")
        assert (await w.post("/slack/events", plain)).status_code == 200
        await w.mention("and a mention", ts="700.000003", thread_ts="700.000001", user="U777")
        await w.fake.wait(lambda: w.fake.ephemerals("U777"), "the refusal of the mention")
        await asyncio.wait_for(w.slack.idle(), WAIT)
        assert [m.text for m in await squat.transcript()] == before
        r = await w.http.get(f"{w.url}/agents/{slack_app.AGENT}/sessions/{name}",
                             headers={"Authorization": "Bearer t-bob"})
        assert r.status_code == 200
        assert "confidential" not in r.text and "mention" not in r.text
        # A thread the channel made is its own: owned by its first speaker, as Slack's.
        await w.mention("hello", ts="710.000001", user="U1")
        await w.reply("710.000001")
        mine = w.slack.ctx.session(f"slack:{TEAM}:C1:710.000001")
        assert (await mine.summary()).owner == "slack:U1"
        follow = event_callback("and again", kind="message", user="U2",
                                thread_ts="710.000001", ts="710.000002")
        await w.post("/slack/events", follow)
        await w.reply("710.000001", 2, "the follow-up's reply")


async def test_a_button_answers_only_a_turn_the_channel_heard(tmp_path: Path) -> None:
    """A click whose routing names a turn that did not come from Slack (one the app started
    itself, whose request anyone may answer) answers nothing."""
    async with authenticated_world(tmp_path) as w:
        job = w.slack.ctx.session("job-1")
        started = await job.start("refund 9")  # no inbound event: no answerer rule
        assert (await job.result(started.turn_id, timeout=WAIT)).status == "suspended"
        await w.mention("refund 7", ts="800.000001", user="U1")
        _stream, prompt = await w.reply("800.000001", 2, "the prompt")
        route = json.dumps({"s": "job-1", "t": started.turn_id, "i": "approve"})
        forged = dataclasses.replace(prompt, blocks=[
            {**b, "elements": [{**e, "value": route} for e in b["elements"]]}
            if b["type"] == "actions" else b for b in prompt.blocks])
        assert (await w.click(forged, user="U1")).status_code == 200
        await w.fake.wait(lambda: w.fake.ephemerals("U1"), "the refusal")
        assert "can't answer" in w.fake.ephemerals("U1")[0].text
        await asyncio.wait_for(w.slack.idle(), WAIT)
        assert await job.pending() is not None and slack_app.paid == []
