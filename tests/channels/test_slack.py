"""The Slack channel (F16; steer_in_flight, F25) against a local fake of Slack's Web API
(``fakes/slack_api.py``).

The app runs on uvicorn on loopback in the test's loop; ``slack_sdk`` is pointed at the fake
with ``base_url``; inbound requests are signed the way Slack signs them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from slack_sdk.errors import SlackApiError

import slack_app
from confirm_pair import confirm_pair
from durable_turns import (
    Agent,
    Limits,
    Model,
    ModelReply,
    ModelRequest,
    Runtime,
    SqliteStore,
    Stop,
    SurfacePolicy,
    TextDelta,
    ToolCall,
    Trigger,
    scripted,
    subagent,
)
from durable_turns.access import Authorize
from durable_turns.channels import mount_agent, receive
from durable_turns.channels.slack import SlackChannel, slack_channel
from durable_turns.errors import ConfigurationError
from durable_turns.models import ModelEvent
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app
from durable_turns.stores import SessionStore
from fakes.serving import serving
from fakes.slack_api import (
    BOT_USER,
    SECRET,
    TOKEN,
    Msg,
    SlackFake,
    block_actions,
    event_callback,
    signed,
)

WAIT = 30.0


@dataclass
class World:
    fake: SlackFake
    runtime: Runtime
    slack: SlackChannel
    url: str
    http: httpx.AsyncClient

    async def post(self, path: str, body: dict[str, Any] | bytes, **kw: Any) -> httpx.Response:
        raw, headers = signed(body, **kw)
        return await self.http.post(f"{self.url}{path}", content=raw, headers=headers)

    async def mention(self, text: str, **kw: Any) -> tuple[dict[str, Any], httpx.Response]:
        envelope = event_callback(f"<@{BOT_USER}> {text}", **kw)
        return envelope, await self.post("/slack/events", envelope)

    async def click(self, prompt: Msg, *, user: str, approve: bool = True) -> httpx.Response:
        return await self.post("/slack/actions", block_actions(self.fake, prompt, user=user,
                                                                approve=approve))

    async def reply(self, thread: str, n: int = 1, what: str = "the reply") -> list[Msg]:
        """Wait for ``n`` finished (not streaming) bot messages in the thread."""
        def done() -> list[Msg] | None:
            msgs = self.fake.thread("C1", thread)
            return msgs if len(msgs) >= n and not any(m.streaming for m in msgs) else None
        found: list[Msg] = await self.fake.wait(done, what)
        return found


@asynccontextmanager
async def world(tmp_path: Path, *, replace_in_flight: bool = False,
                steer_in_flight: bool = False, stream_idle: float = 20.0,
                agent: Agent | None = None,
                model: Model | None = None, store: SessionStore | None = None,
                authorize: Authorize | None = None) -> AsyncIterator[World]:
    fake = SlackFake()
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        runtime = Runtime([agent or slack_app.build_agent()],
                          store or SqliteStore(tmp_path / "s.db"), model)
        slack = slack_channel(signing_secret=SECRET, bot_token=TOKEN,
                              base_url=f"{fake_url}/api/", replace_in_flight=replace_in_flight,
                              stream_idle=stream_idle, authorize=authorize,
                              steer_in_flight=steer_in_flight)
        app = create_app(runtime, channels=[slack])
        async with runtime, serving(app) as url, httpx.AsyncClient(timeout=WAIT) as http:
            try:
                yield World(fake, runtime, slack, url, http)
            finally:
                await asyncio.wait_for(slack.idle(), WAIT)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    slack_app.paid.clear()
    slack_app.attempts.clear()
    slack_app.held.clear()


async def test_url_verification_answers_the_challenge(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        r = await w.post("/slack/events", {"token": "t", "challenge": "abc123",
                                           "type": "url_verification"})
        assert r.status_code == 200 and r.json() == {"challenge": "abc123"}


async def test_after_a_restart_the_lifespan_opens_the_runtime_and_a_follow_up_is_replied_to(
        tmp_path: Path) -> None:
    """After a restart the server's lifespan opens the runtime (its one owner) and starts
    the channel: the first event, a follow-up in a thread the bot is in, is stored and
    replied to."""
    db = tmp_path / "s.db"
    async with Runtime([slack_app.build_agent()], SqliteStore(db)) as before:
        await before.session(slack_app.AGENT, "slack:T0001:C1:150.000001").turn(
            "hello", turn_id="slack:C1:150.000001")
    fake = SlackFake()
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        runtime = Runtime([slack_app.build_agent()], SqliteStore(db))
        slack = slack_channel(signing_secret=SECRET, bot_token=TOKEN,
                              base_url=f"{fake_url}/api/")
        app = create_app(runtime, channels=[slack])
        follow = event_callback("and again", kind="message", thread_ts="150.000001",
                                ts="150.000002")
        raw, headers = signed(follow)
        async with serving(app, lifespan="on") as url, httpx.AsyncClient(timeout=WAIT) as http:
            async with asyncio.timeout(WAIT):
                r = await http.post(f"{url}/slack/events", content=raw, headers=headers)
            assert r.status_code == 200, r.text
            replies = await fake.wait(lambda: [m for m in fake.thread("C1", "150.000001")
                                               if not m.streaming], "the reply")
            assert replies[0].markdown == "You said: and again"


async def test_forged_and_stale_signatures_are_refused_and_nothing_runs(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        envelope = event_callback("<@UBOT> hello", ts="100.000001")
        forged = await w.post("/slack/events", envelope, secret="not-the-secret")
        stale = await w.post("/slack/events", envelope, ts=int(time.time()) - 301)
        raw, headers = signed(envelope)
        tampered = await w.http.post(f"{w.url}/slack/events", content=raw + b" ",
                                     headers=headers)
        unsigned = await w.http.post(f"{w.url}/slack/events", content=raw)
        click = await w.post("/slack/actions", b"payload=%7B%7D", secret="nope")
        assert [r.status_code for r in (forged, stale, tampered, unsigned, click)] == [401] * 5
        assert "signature" in forged.json()["error"]["message"]
        assert await w.runtime.store.list_sessions(slack_app.AGENT) == []
        assert w.fake.calls == []
        ok = await w.post("/slack/events", envelope, ts=int(time.time()) - 299)
        assert ok.status_code == 200  # within five minutes: accepted


async def test_a_mention_streams_a_reply_with_a_tool_timeline(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        _envelope, r = await w.mention("status 42", ts="200.000001")
        assert r.status_code == 200 and r.content == b""
        (reply,) = await w.reply("200.000001")
        methods = [m for m, _ in w.fake.calls]
        assert methods[0] == "chat.startStream" and methods[-1] == "chat.stopStream"
        assert "chat.appendStream" in methods and "chat.postMessage" not in methods
        start = w.fake.called("chat.startStream")[0]
        assert start["thread_ts"] == "200.000001" and start["channel"] == "C1"
        assert start["recipient_user_id"] == "U1" and start["recipient_team_id"] == "T0001"
        assert reply.tasks() == {"call-lookup": "complete", "call-crm": "error"}
        crm = [c for c in reply.chunks if c.get("id") == "call-crm" and c["status"] == "error"]
        assert "crm unreachable" in crm[0]["output"]
        assert reply.markdown == "Order 42 ships tomorrow."
        # Each task is shown running before it is shown done.
        order = [(c["id"], c["status"]) for c in reply.chunks if c["type"] == "task_update"]
        assert order.index(("call-lookup", "in_progress")) < order.index(
            ("call-lookup", "complete"))
        s = mount_agent(w.runtime.agents[slack_app.AGENT], w.runtime).session(
            "slack:T0001:C1:200.000001")
        await asyncio.wait_for(w.slack.idle(), WAIT)
        (t,) = await w.runtime.store.entries(s.key)
        assert t.event is not None and t.event["user"] == {"id": "U1", "attested": True}
        assert t.event["source"] == "slack" and (t.data or {})["slack"]["done"] is True
        transcript = await s.transcript()
        assert transcript[0].role == "user" and transcript[0].text == "status 42"
        assert transcript[0].by == "U1"


async def test_a_retry_or_the_message_twin_never_starts_a_second_turn(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        envelope, first = await w.mention("hello there", ts="300.000001")
        again = await w.post("/slack/events", envelope, retry=1)
        twin = dict(envelope, event_id="EvOther",
                    event=dict(envelope["event"], type="message", channel_type="channel"))
        also = await w.post("/slack/events", twin)
        assert [r.status_code for r in (first, again, also)] == [200, 200, 200]
        (reply,) = await w.reply("300.000001")
        assert reply.markdown == "You said: hello there"
        key = w.slack.ctx.session("slack:T0001:C1:300.000001").key
        assert [t.turn_id for t in await w.runtime.store.entries(key)] == ["slack:C1:300.000001"]
        assert len(w.fake.called("chat.startStream")) == 1


async def test_own_messages_edits_and_strangers_threads_are_ignored(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        own = event_callback("hi", kind="message", user=BOT_USER, thread_ts="1.0", ts="1.1")
        bot = event_callback("hi", kind="message", bot_id="B0001", thread_ts="1.0", ts="1.2")
        edit = event_callback("hi", kind="message", subtype="message_changed", ts="1.3")
        stranger = event_callback("hi", kind="message", thread_ts="9.0", ts="9.1")
        for body in (own, bot, edit, stranger):
            assert (await w.post("/slack/events", body)).status_code == 200
        assert await w.runtime.store.list_sessions(slack_app.AGENT) == []
        # A message in a thread the bot is in is a turn of that thread.
        await w.mention("hello", ts="400.000001")
        await w.reply("400.000001")
        follow = event_callback("and again", kind="message", thread_ts="400.000001",
                                ts="400.000002")
        await w.post("/slack/events", follow)
        second = await w.reply("400.000001", 2, "the follow-up's reply")
        assert second[1].markdown == "You said: and again"


async def test_a_parked_refund_refuses_another_user_and_resumes_for_the_speaker(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.mention("refund 7", ts="500.000001", user="U1")
        msgs = await w.reply("500.000001", 2, "the streamed text and the prompt")
        stream, prompt = msgs
        assert stream.markdown == "Let me ask for approval. "
        assert stream.tasks() == {"call-refund": "in_progress"}
        assert prompt.text == "Refund order 7?"
        buttons = [e for b in prompt.blocks if b["type"] == "actions" for e in b["elements"]]
        assert [b["text"]["text"] for b in buttons] == ["Approve", "Deny"]
        assert all("U1" not in b["value"] for b in buttons)  # routing only, no authority
        s = w.slack.ctx.session("slack:T0001:C1:500.000001")
        # Someone else clicks: an ephemeral refusal, nothing stored.
        assert (await w.click(prompt, user="U2")).status_code == 200
        await w.fake.wait(lambda: w.fake.ephemerals("U2"), "the refusal")
        assert "someone else" in w.fake.ephemerals("U2")[0].text
        assert (await s.pending()) is not None and slack_app.paid == []
        assert prompt.blocks[-1]["type"] == "actions"  # the buttons stay
        # The speaker approves, and clicks twice: one answer.
        await w.click(prompt, user="U1")
        await w.click(prompt, user="U1")
        msgs = await w.reply("500.000001", 3, "the reply after the answer")
        await w.fake.wait(lambda: "Approved by <@U1>" in prompt.text, "the verdict")
        assert all(b["type"] != "actions" for b in prompt.blocks)  # buttons removed
        assert msgs[2].markdown == "Refunded order 7."
        await asyncio.wait_for(w.slack.idle(), WAIT)
        assert slack_app.paid == ["7"]
        answers = [m for m in await s.transcript() if m.role == "tool"]
        assert answers[0].result == {"refunded": True}
        steps = await w.runtime.store.read_steps(s.key)
        answer = json.loads(steps["input:slack:C1:500.000001:approve"].data)
        assert answer == {"value": True, "by": "slack:U1"} or answer.get("by") == "slack:U1"


async def test_the_apps_authorize_decides_for_slack_users_too(tmp_path: Path) -> None:
    """Slack's users are attested by its signature and ruled by the host's ``authorize``:
    here U3 may not talk to the agent, and U1, the asker, may not answer (an auditor must)."""
    asked: list[tuple[str, str, str]] = []

    def authorize(principal: Any, action: str, session: Any) -> bool:
        asked.append((principal["id"], principal["source"], action))
        return principal["id"] != "U3" and not (action == "resume" and principal["id"] == "U1")

    async with world(tmp_path, authorize=authorize) as w:
        await w.mention("hello", ts="530.000001", user="U3")
        await w.fake.wait(lambda: w.fake.ephemerals("U3"), "the refusal")
        assert "can't talk" in w.fake.ephemerals("U3")[0].text
        assert await w.runtime.store.list_sessions(slack_app.AGENT) == []  # nothing stored
        await w.mention("refund 8", ts="531.000001", user="U1")
        _stream, prompt = await w.reply("531.000001", 2, "the prompt")
        await w.click(prompt, user="U1")
        await w.fake.wait(lambda: w.fake.ephemerals("U1"), "the refusal")
        assert "can't answer" in w.fake.ephemerals("U1")[0].text
        s = w.slack.ctx.session("slack:T0001:C1:531.000001")
        assert (await s.pending()) is not None and slack_app.paid == []
    assert ("U3", "slack", "turn") in asked and ("U1", "slack", "resume") in asked


async def test_a_thread_with_a_refund_on_every_store(
        tmp_path: Path, store_factory: Callable[[], SessionStore]) -> None:
    async with world(tmp_path, store=store_factory()) as w:
        await w.mention("refund 11", ts="520.000001")
        _stream, prompt = await w.reply("520.000001", 2, "the prompt")
        await w.click(prompt, user="U1")
        msgs = await w.reply("520.000001", 3, "the reply")
        assert msgs[2].markdown == "Refunded order 11." and slack_app.paid == ["11"]
        await asyncio.wait_for(w.slack.idle(), WAIT)
        key = w.slack.ctx.session("slack:T0001:C1:520.000001").key
        (t,) = await w.runtime.store.entries(key, turn_id="slack:C1:520.000001")
        state = (t.data or {})["slack"]
        assert state["done"] is True and state["prompts"]["approve"] == prompt.ts


async def test_a_deny_resumes_with_false(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.mention("refund 8", ts="510.000001")
        _stream, prompt = await w.reply("510.000001", 2)
        await w.click(prompt, user="U1", approve=False)
        msgs = await w.reply("510.000001", 3)
        await w.fake.wait(lambda: "Denied by <@U1>" in prompt.text, "the verdict")
        assert msgs[2].markdown == "Order 8 was not refunded." and slack_app.paid == []


async def test_a_follow_up_queues_behind_the_running_turn(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.mention("hold", ts="600.000001")
        await w.fake.wait(lambda: w.fake.called("chat.startStream"), "the first stream")
        follow = event_callback("next one", kind="message", thread_ts="600.000001",
                                ts="600.000002")
        await w.post("/slack/events", follow)
        slack_app.held["hold"].set()
        msgs = await w.reply("600.000001", 2)
        assert msgs[0].tasks() == {"call-hold": "complete"}
        assert msgs[1].markdown == "You said: next one"


async def test_replace_in_flight_supersedes_the_running_turn(tmp_path: Path) -> None:
    async with world(tmp_path, replace_in_flight=True) as w:
        await w.mention("hold", ts="700.000001")
        await w.fake.wait(lambda: w.fake.called("chat.startStream"), "the first stream")
        follow = event_callback("never mind", kind="message", thread_ts="700.000001",
                                ts="700.000002")
        await w.post("/slack/events", follow)
        key = w.slack.ctx.session("slack:T0001:C1:700.000001").key
        first = (await w.runtime.store.entries(key, turn_id="slack:C1:700.000001"))[0]
        assert first.cancel is not None and first.cancel.startswith("superseded")
        slack_app.held["hold"].set()  # the tool ends; the turn stops at that checkpoint
        msgs = await w.reply("700.000001", 2)
        assert msgs[0].markdown.endswith("_superseded by a newer message_")
        assert msgs[1].markdown == "You said: never mind"


async def test_steer_in_flight_joins_the_running_turn_and_one_reply_answers(
        tmp_path: Path) -> None:
    """F25: a message in a busy thread joins the running turn at its next model call."""
    async with world(tmp_path, steer_in_flight=True) as w:
        await w.mention("hold", ts="720.000001")
        await w.fake.wait(lambda: w.fake.called("chat.startStream"), "the first stream")
        follow = event_callback("also this", kind="message", thread_ts="720.000001",
                                ts="720.000002")
        assert (await w.post("/slack/events", follow)).status_code == 200
        s = w.slack.ctx.session("slack:T0001:C1:720.000001")
        steer = await s.entry("slack:C1:720.000002")
        assert steer is not None and steer.kind == "steer"  # durable before the tool ended
        slack_app.held["hold"].set()
        msgs = await w.reply("720.000001", 1)
        assert msgs[0].tasks() == {"call-hold": "complete"}
        assert msgs[0].markdown == "You said: also this"  # the model read the steer
        await asyncio.wait_for(w.slack.idle(), WAIT)
        assert len(w.fake.thread("C1", "720.000001")) == 1
        users = [(m.text, m.by) for m in await s.transcript() if m.role == "user"]
        assert users == [("hold", "U1"), ("also this", "U1")]


class Late:
    """``late``: streams a first part, waits for the test, then ends; else ``You said: …``."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        opening = next(m for m in reversed(request.messages) if m.is_opening)
        if opening.text == "late":
            yield TextDelta("Part one. ")
            await slack_app.held.setdefault("late", asyncio.Event()).wait()
            yield TextDelta("Part two.")
        else:
            yield TextDelta(f"You said: {opening.text}")
        yield Stop("end_turn")


async def test_a_steer_too_late_for_its_turn_is_replied_to_as_a_turn_of_its_own(
        tmp_path: Path) -> None:
    """F25: a message that comes while the turn's last reply streams opens a turn of its own
    when that one ends; it is delivered in the thread like any message's, and owed by the
    channel until it is (what a restart's recovery finds)."""
    async with world(tmp_path, steer_in_flight=True,
                     agent=Agent(slack_app.AGENT, "", model=Late())) as w:
        await w.mention("late", ts="740.000001")
        await w.fake.wait(lambda: w.fake.calls, "the first part posted")
        follow = event_callback("and this", kind="message", thread_ts="740.000001",
                                ts="740.000002")
        assert (await w.post("/slack/events", follow)).status_code == 200
        s = w.slack.ctx.session("slack:T0001:C1:740.000001")
        steer = await s.entry("slack:C1:740.000002")
        assert steer is not None and steer.kind == "steer"
        assert (steer.args or {}).get("deliver") == "slack"  # what its own turn is owed by
        slack_app.held["late"].set()
        msgs = await w.reply("740.000001", 2, "both replies")
        assert [m.markdown for m in msgs] == ["Part one. Part two.", "You said: and this"]
        await asyncio.wait_for(w.slack.idle(), WAIT)
        own = await s.entry("slack:C1:740.000002:turn")
        assert own is not None and (own.data or {})["slack"]["done"] is True
        assert await w.runtime.queries.owed_deliveries("slack", slack_app.AGENT) == []


async def test_a_thread_channel_neither_replaces_and_steers() -> None:
    with pytest.raises(ValueError, match="not both"):
        slack_channel(signing_secret=SECRET, bot_token=TOKEN, replace_in_flight=True,
                      steer_in_flight=True)


class Endless:
    """Always asks for one more ``lookup``: only a limit ends its turn."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        n = sum(1 for m in request.messages if m.role == "assistant")
        yield ToolCall(f"c{n}", "lookup", {"order_id": str(n)})
        yield Stop("tool_use")


async def test_a_limit_asks_in_the_thread_with_buttons(tmp_path: Path) -> None:
    """F25: a turn at its limit parks on a yes/no prompt; Approve grants as much again,
    Deny ends the turn failed, naming the limit."""
    agent = Agent("helper", "", [slack_app.lookup], model=Endless(),
                  limits=Limits(model_calls=1, on_exceed="ask"))
    async with world(tmp_path, agent=agent) as w:
        await w.mention("go on", ts="730.000001")
        _stream, prompt = await w.reply("730.000001", 2)
        assert "model_calls limit (1)" in prompt.text
        await w.click(prompt, user="U1")
        s = w.slack.ctx.session("slack:T0001:C1:730.000001")
        second = await w.fake.wait(lambda: next(
            (m for m in w.fake.thread("C1", "730.000001") if "limit (2)" in m.text), None),
            "the second prompt")
        request = await s.pending()
        assert request is not None and request.id == "limit:2"
        await w.click(second, user="U1", approve=False)
        r = await asyncio.wait_for(s.result("slack:C1:730.000001"), WAIT)
        assert r.status == "failed" and r.error is not None
        assert "model_calls limit (2)" in r.error


async def test_replace_never_supersedes_a_parked_approval(tmp_path: Path) -> None:
    async with world(tmp_path, replace_in_flight=True) as w:
        await w.mention("refund 9", ts="710.000001")
        _stream, prompt = await w.reply("710.000001", 2)
        follow = event_callback("cancel that", kind="message", thread_ts="710.000001",
                                ts="710.000002")
        await w.post("/slack/events", follow)
        await w.fake.wait(lambda: w.fake.called("chat.postEphemeral"), "the busy notice")
        s = w.slack.ctx.session("slack:T0001:C1:710.000001")
        assert (await s.pending()) is not None
        await w.click(prompt, user="U1")
        msgs = await w.reply("710.000001", 3)
        assert msgs[2].markdown == "Refunded order 9."


async def test_slack_turns_run_under_the_slack_policy(tmp_path: Path) -> None:
    seen: list[tuple[list[str], str]] = []

    def brain(request: ModelRequest) -> ModelReply:
        seen.append((sorted(t.name for t in request.tools), request.system))
        return ModelReply("ok")

    agent = Agent("helper", "Help.", tools=[slack_app.refund, slack_app.lookup],
                  surfaces={"slack": SurfacePolicy(mode="append", deny_tools=("refund",),
                                                   instructions="Be brief in Slack.")})
    async with world(tmp_path, agent=agent, model=scripted(brain)) as w:
        await w.mention("hi", ts="750.000001")
        await w.reply("750.000001")
        ((tools, system),) = seen
        assert tools == ["lookup"]  # refund is denied to Slack turns
        assert system.startswith("Help.") and system.endswith("Be brief in Slack.")


async def test_rate_limited_calls_are_retried_after_retry_after(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        w.fake.rate_limit("chat.startStream", retry_after=0)
        await w.mention("hello", ts="800.000001")
        (reply,) = await w.reply("800.000001")
        assert reply.markdown == "You said: hello"
        assert len(w.fake.called("chat.startStream")) == 2  # the 429, then the retry


async def test_a_long_tool_stops_the_stream_and_the_reply_goes_on(tmp_path: Path) -> None:
    async with world(tmp_path, stream_idle=0.3) as w:
        await w.mention("hold", ts="900.000001")
        await w.fake.wait(lambda: w.fake.called("chat.stopStream"), "the paused stream")
        first = w.fake.thread("C1", "900.000001")[0]
        assert not first.streaming and first.tasks() == {"call-hold": "in_progress"}
        slack_app.held["hold"].set()
        msgs = await w.reply("900.000001", 2)
        assert msgs[1].tasks() == {"call-hold": "complete"}
        assert msgs[1].markdown == "You said: hold"


async def test_an_expired_stream_is_finished_with_chat_update(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.mention("hold", ts="950.000001")
        await w.fake.wait(lambda: w.fake.called("chat.startStream"), "the stream")
        assert w.fake.expire_streams() == 1  # Slack ended it while the tool ran
        slack_app.held["hold"].set()
        await w.fake.wait(lambda: w.fake.called("chat.update"), "the chat.update")
        (reply,) = await w.reply("950.000001")
        assert reply.edited and reply.text == "✓ hold\n\nYou said: hold"
        assert "message_not_in_streaming_state" not in str(
            [b for m, b in w.fake.calls if m == "chat.update"])


async def test_text_of_a_failed_model_attempt_is_replaced(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.mention("flaky", ts="960.000001")
        (reply,) = await w.reply("960.000001")
        await w.fake.wait(lambda: reply.edited, "the rewrite")
        assert reply.text == "Whole answer." and len(slack_app.attempts) == 2
        assert reply.markdown == "Half an ans"  # what had streamed, rewritten by chat.update


async def test_receive_posts_a_proactive_turn(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        ctx = mount_agent(w.runtime.agents[slack_app.AGENT], w.runtime)
        result = await receive(w.slack, ctx, seed="daily digest",
                               target={"channel_id": "C9"},
                               trigger=Trigger(kind="proactive", by="cron:daily"),
                               session="digest", turn_id="digest-1")
        assert result.status == "completed"
        (post,) = w.fake.called("chat.postMessage")
        assert post["channel"] == "C9" and post["text"] == "You said: daily digest"
        opening = (await ctx.session("digest").transcript())[0]
        assert (opening.role, opening.by, opening.text) == ("trigger", "cron:daily",
                                                            "daily digest")
        # The same turn id again is the same turn, delivered once.
        again = await receive(w.slack, ctx, seed="daily digest", target={"channel_id": "C9"},
                              trigger=Trigger(by="cron:daily"), session="digest",
                              turn_id="digest-1")
        assert again.text == result.text and len(w.fake.called("chat.postMessage")) == 1


async def test_a_proactive_turn_that_asks_posts_buttons_and_delivers_after_the_click(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        ctx = mount_agent(w.runtime.agents[slack_app.AGENT], w.runtime)
        result = await receive(w.slack, ctx, seed="digest", target={"channel_id": "C9"},
                               trigger=Trigger(by="cron:daily"), session="digest")
        assert result.status == "suspended"
        (post,) = w.fake.called("chat.postMessage")
        prompt = w.fake.messages[("C9", next(m.ts for m in w.fake.messages.values()
                                             if m.channel == "C9"))]
        assert post["text"] == "Send today's digest?" and prompt.blocks[-1]["type"] == "actions"
        await w.click(prompt, user="U2")  # not the named answerer
        await w.fake.wait(lambda: w.fake.ephemerals("U2"), "the refusal")
        await w.click(prompt, user="U1")
        await w.fake.wait(lambda: len(w.fake.called("chat.postMessage")) == 2, "the outcome")
        assert w.fake.called("chat.postMessage")[1]["text"] == "Digest sent."
        assert "Approved by <@U1>" in prompt.text


async def test_receive_raises_without_deliver_and_keeps_a_failed_delivery_owed(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        ctx = mount_agent(w.runtime.agents[slack_app.AGENT], w.runtime)

        class NoDeliver:
            name = "nothing"

        with pytest.raises(ConfigurationError, match="deliver"):
            await receive(NoDeliver(), ctx, seed="x", target={})  # type: ignore[arg-type]
        with pytest.raises(SlackApiError):
            await receive(w.slack, ctx, seed="hi", target={"channel_id": "nope"},
                          session="bad", turn_id="bad-1")
        (t,) = await w.runtime.store.entries(ctx.session("bad").key)
        assert t.status == "completed" and "delivered" not in (t.data or {})


async def test_a_subagents_work_stays_out_of_the_thread_reply(tmp_path: Path) -> None:
    """A tool that runs another agent (F13) forwards the child's events into the turn; the
    reply shows the parent's text and ends on the parent's end, not the child's."""

    def relay(request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("Asking the helper.",
                              [ToolCall("c1", "helper", {"task": "six times seven?"})])
        return ModelReply(f"The helper says {request.messages[-1].result['answer']}.")

    lead = Agent("lead", "You delegate.", [subagent("helper", description="Does sums.")],
                 model=scripted(relay))
    helper = Agent("helper", "You do sums.", [], model=scripted([ModelReply("forty-two")]))
    fake = SlackFake()
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        runtime = Runtime([lead, helper], SqliteStore(tmp_path / "s.db"))
        slack = slack_channel(signing_secret=SECRET, bot_token=TOKEN, agent="lead",
                              base_url=f"{fake_url}/api/")
        app = create_app(runtime, channels=[slack])
        async with runtime, serving(app) as url, httpx.AsyncClient(timeout=WAIT) as http:
            w = World(fake, runtime, slack, url, http)
            try:
                _envelope, r = await w.mention("ask the helper", ts="300.000001")
                assert r.status_code == 200
                (reply,) = await w.reply("300.000001")
                assert reply.markdown == "Asking the helper.The helper says forty-two."
                assert not any(c.get("text") == "forty-two" for c in reply.chunks)
                assert reply.tasks() == {"c1": "complete"}
            finally:
                await asyncio.wait_for(slack.idle(), WAIT)


async def test_two_calls_parked_at_once_get_a_prompt_each(tmp_path: Path) -> None:
    """A parallel batch (F15) whose two calls both ask: two prompts, answered one by one."""
    agent = confirm_pair(slack_app.AGENT)
    async with world(tmp_path, agent=agent) as w:
        await w.mention("confirm a and b", ts="900.000001", user="U1")
        msgs = await w.reply("900.000001", 3, "the streamed text and two prompts")
        prompts = {m.text: m for m in msgs[1:]}
        assert set(prompts) == {"Confirm a?", "Confirm b?"}
        await w.click(prompts["Confirm b?"], user="U1", approve=False)
        await w.fake.wait(lambda: "Denied by <@U1>" in prompts["Confirm b?"].text, "b's verdict")
        await w.click(prompts["Confirm a?"], user="U1")
        await w.fake.wait(lambda: "Approved by <@U1>" in prompts["Confirm a?"].text,
                          "a's verdict")
        final = await w.fake.wait(
            lambda: [m for m in w.fake.thread("C1", "900.000001")
                     if not m.streaming and "Both answered" in m.markdown], "the reply")
        assert final[0].markdown.endswith("Both answered: a: yes, b: no.")
        s = w.slack.ctx.session("slack:T0001:C1:900.000001")
        assert await s.pending() is None
