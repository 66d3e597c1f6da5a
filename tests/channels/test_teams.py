"""The Teams channel (F28) against a local fake of the Bot Connector and of Bot Framework's
OpenID metadata (``fakes/teams_api.py``).

The app runs on uvicorn on loopback in the test's loop; the Teams SDK's ``ApiClient`` is
pointed at the fake by each activity's ``serviceUrl``; inbound activities carry tokens the
fake signs with its own keys, checked against the keys its metadata names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import slack_app
from durable_turns import (
    Agent,
    Model,
    ModelReply,
    ModelRequest,
    Runtime,
    SqliteStore,
    SurfacePolicy,
    ToolCall,
    Trigger,
    scripted,
    tool,
)
from durable_turns.channels import channel_from_env, mount_agent, receive
from durable_turns.channels.teams import TeamsChannel, teams_channel
from durable_turns.channels.thread_channel import BUSY, NOT_YOURS
from durable_turns.context import ToolContext
from durable_turns.errors import ConfigurationError
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app
from fakes.serving import serving
from fakes.teams_api import (
    ALICE,
    APP_ID,
    BOB,
    CHANNEL,
    PERSONAL,
    TENANT,
    TOKEN,
    Activity,
    TeamsFake,
    new_key,
    tls_files,
)

WAIT = 30.0
CARD = "application/vnd.microsoft.card.adaptive"


@dataclass
class World:
    fake: TeamsFake
    runtime: Runtime
    teams: TeamsChannel
    url: str
    http: httpx.AsyncClient

    async def send(self, activity: dict[str, Any], **token: Any) -> httpx.Response:
        return await self.http.post(f"{self.url}/teams/messages", json=activity,
                                    headers=self.fake.headers(**token))

    async def say(self, text: str, **kw: Any) -> dict[str, Any]:
        activity = self.fake.message(text, **kw)
        r = await self.send(activity)
        assert r.status_code == 200, r.text
        return activity

    async def done(self, cid: str, n: int = 1, what: str = "the reply") -> list[Activity]:
        """Wait for ``n`` finished (not streaming) activities everyone in ``cid`` sees."""
        def ready() -> list[Activity] | None:
            shown = self.fake.in_conversation(cid)
            return shown if len(shown) >= n and not any(a.streaming for a in shown) else None
        found: list[Activity] = await self.fake.wait(ready, what)
        return found


@asynccontextmanager
async def world(tmp_path: Path, *, agent: Agent | None = None, model: Model | None = None,
                stream_interval: float = 0.0, token: Any = TOKEN,
                **kw: Any) -> AsyncIterator[World]:
    fake = TeamsFake()
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        runtime = Runtime([agent or slack_app.build_agent()], SqliteStore(tmp_path / "s.db"),
                          model)
        teams = teams_channel(app_id=APP_ID, token=token, service_url=fake_url,
                              openid_metadata_url=fake.metadata_url,
                              stream_interval=stream_interval, **kw)
        app = create_app(runtime, channels=[teams])
        async with runtime, serving(app) as url, httpx.AsyncClient(timeout=WAIT) as http:
            try:
                yield World(fake, runtime, teams, url, http)
            finally:
                await asyncio.wait_for(teams.idle(), WAIT)
                await teams.stop()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    slack_app.paid.clear()
    slack_app.held.clear()


async def test_a_request_whose_token_does_not_verify_is_401_and_starts_nothing(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        now = int(time.time())
        stranger = new_key()
        forged: dict[str, dict[str, Any]] = {
            "expired": {"exp": now - 3600, "nbf": now - 7200, "iat": now - 7200},
            "wrong audience": {"aud": "some-other-bot"},
            "wrong issuer": {"iss": "https://sts.example.test"},
            "wrong key": {"key": stranger},
            "unknown key": {"key": stranger, "kid": "not-a-published-key"},
            "unsigned": {"alg": "none"},
            "another service url": {"serviceurl": "https://smba.example.test/"},
            "no service url": {"serviceurl": None},
            "no expiry": {"exp": None},
        }
        for why, claims in forged.items():
            r = await w.send(w.fake.message(f"refund {why}"), **claims)
            assert r.status_code == 401, why
        no_header = await w.http.post(f"{w.url}/teams/messages", json=w.fake.message("hi"))
        basic = await w.http.post(f"{w.url}/teams/messages", json=w.fake.message("hi"),
                                  headers={"Authorization": "Basic Ym90OnB3"})
        assert no_header.status_code == basic.status_code == 401
        assert "token" in no_header.json()["error"]["message"]
        s = w.teams.ctx.session(f"teams:{PERSONAL}")
        assert not (await s.summary()).exists  # nothing was stored
        assert w.fake.calls == []  # nor posted
        await w.say("hello")  # the fake's own token passes
        (reply,) = await w.done(PERSONAL)
        assert reply.text == "You said: hello"


async def test_a_1_to_1_reply_streams_with_its_tool_timeline(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        said = await w.say("status 7")
        (reply,) = await w.done(PERSONAL)
        assert reply.text == ("✓ lookup\n\n✗ crm: ConnectionError: crm unreachable\n\n"
                              "Order 7 ships tomorrow.")
        kinds = [(b["type"], next(e["streamType"] for e in b["entities"]
                                  if e["type"] == "streaminfo"))
                 for m, _p, b in w.fake.calls if m == "POST"]
        # Informative updates while only tools run, then the text so far, then the final.
        n = kinds.index(("typing", "streaming"))
        assert kinds[:n] == [("typing", "informative")] * n and n >= 1
        assert set(kinds[n:-1]) == {("typing", "streaming")}
        assert kinds[-1] == ("message", "final")
        assert [m for m, _p, _b in w.fake.calls] == ["POST"] * len(kinds)  # no update
        assert reply.statuses[0] == "⏳ lookup"
        assert reply.statuses[-1] == "✗ crm: ConnectionError: crm unreachable"
        assert reply.texts[0].startswith("✓ lookup\n\n✗ crm")  # the text so far, whole
        seqs = [e["streamSequence"] for _m, _p, b in w.fake.calls for e in b["entities"]
                if "streamSequence" in e]
        assert seqs == list(range(1, len(kinds)))
        assert all(b["replyToId"] == said["id"] for _m, _p, b in w.fake.calls)
        s = w.teams.ctx.session(f"teams:{PERSONAL}")
        (turn,) = await s.chain()
        assert turn.turn_id == f"teams:{PERSONAL}:{said['id']}"
        assert turn.event is not None and turn.event["source"] == "teams"
        assert turn.event["user"] == {"id": ALICE, "attested": True}


async def test_in_a_channel_the_reply_is_posted_in_its_chain_and_updated_in_place(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.say("status 8", conversation=CHANNEL)
        reply = await w.fake.wait(lambda: next((a for a in w.fake.in_conversation(CHANNEL)
                                                if a.text.endswith("tomorrow.")), None),
                                  "the reply, finished")
        await w.teams.idle()
        assert reply.edited and reply.texts[0] == "⏳ lookup"
        assert all("entities" not in b for _m, _p, b in w.fake.calls)  # never streamed
        methods = [m for m, _p, _b in w.fake.calls]
        assert methods[0] == "POST" and set(methods[1:]) == {"PUT"}
        assert {p for _m, p, _b in w.fake.calls} >= {
            f"/v3/conversations/{CHANNEL}/activities",
            f"/v3/conversations/{CHANNEL}/activities/{reply.id}"}
        s = w.teams.ctx.session(f"teams:{CHANNEL}")
        (turn,) = await s.chain()
        assert turn.event is not None and turn.event["text"] == "status 8"  # no mention


async def test_where_teams_refuses_a_stream_the_reply_is_updated_in_place(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        w.fake.streaming_allowed = False
        await w.say("status 10")
        reply = await w.fake.wait(lambda: next((a for a in w.fake.in_conversation(PERSONAL)
                                                if a.text.endswith("tomorrow.")), None),
                                  "the reply, finished")
        await w.teams.idle()
        (refused, posted, *updates) = w.fake.calls
        assert "entities" in refused[2] and "entities" not in posted[2]  # the 403, then a post
        assert {m for m, _p, _b in updates} == {"PUT"} and reply.edited
        assert len(w.fake.in_conversation(PERSONAL)) == 1


async def test_updates_in_place_are_spaced_by_the_stream_interval(tmp_path: Path) -> None:
    async with world(tmp_path, stream_interval=3600.0) as w:
        await w.say("status 9", conversation=CHANNEL)
        reply = await w.fake.wait(lambda: next((a for a in w.fake.in_conversation(CHANNEL)
                                                if a.text.endswith("tomorrow.")), None),
                                  "the reply, finished")
        await w.teams.idle()
        # The first post, then the final text whole: the appends between were held back.
        assert [m for m, _p, _b in w.fake.calls] == ["POST", "PUT"]
        assert reply.text.endswith("Order 9 ships tomorrow.")


async def test_a_call_answered_429_is_retried_after_its_retry_after(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        w.fake.rate_limit(retry_after=1)
        started = time.monotonic()
        await w.say("hello")
        (reply,) = await w.done(PERSONAL)
        assert reply.text == "You said: hello"
        first, again = w.fake.calls[0], w.fake.calls[1]
        assert first[2] == again[2]  # the same activity, sent again
        assert time.monotonic() - started >= 1.0  # after the Retry-After, not before


async def test_an_approval_clicked_by_the_wrong_user_then_by_the_asker(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.say("refund 5", conversation=CHANNEL)
        prompt = await w.fake.wait(lambda: w.fake.prompt(CHANNEL), "the card")
        card = prompt.card
        assert card is not None and card["body"][0]["text"] == "Refund order 5?"
        assert [a["title"] for a in card["actions"]] == ["Approve", "Deny"]

        r = await w.send(w.fake.click(prompt, aad=BOB))
        assert r.status_code == 200
        assert r.json() == {"statusCode": 200, "type": "application/vnd.microsoft.activity."
                            "message", "value": NOT_YOURS}  # only Bob sees it
        assert not prompt.edited and slack_app.paid == []
        s = w.teams.ctx.session(f"teams:{CHANNEL}")
        assert (await s.pending()) is not None

        alice = w.fake.click(prompt, aad=ALICE)
        r = await w.send(alice)
        answer = r.json()
        assert answer["type"] == CARD and answer["value"]["body"][1]["text"] == \
            "Approved by Alice"
        assert prompt.edited and prompt.card is not None and "actions" not in prompt.card
        assert prompt.card["body"][1]["text"] == "Approved by Alice"  # everyone sees it
        shown = await w.fake.wait(lambda: next(
            (a for a in w.fake.in_conversation(CHANNEL)
             if a.text.endswith("Refunded order 5.") and not a.streaming and a.edited), None),
            "the reply after the answer")
        assert shown.conversation == CHANNEL
        assert slack_app.paid == ["5"]
        turn = (await s.chain())[0]
        assert turn.status == "completed"

        again = await w.send(alice)  # a double click on the card she saw: one answer
        assert again.json()["value"]["body"][1]["text"] == "Approved by Alice"
        deny = {**alice["value"]["action"], "verb": "durable_turns.deny"}
        late = await w.send({**alice, "value": {**alice["value"], "action": deny}})
        assert late.json()["type"] == "application/vnd.microsoft.activity.message"
        assert late.json()["value"].startswith("This request can't take that answer")
        assert slack_app.paid == ["5"]


@tool
async def pick(ctx: ToolContext) -> str:
    """Ask how many."""
    n = await ctx.request_input("count", "How many?", schema={"type": "integer",
                                                              "minimum": 1})
    return f"picked {n}"


async def test_a_request_for_a_value_gets_an_input_and_its_schema_is_checked(
        tmp_path: Path) -> None:
    def brain(r: ModelRequest) -> ModelReply:
        if calls_this_turn(r):
            return ModelReply(str(r.messages[-1].result))
        return ModelReply(tool_calls=[ToolCall("call-pick", "pick", {})])

    agent = Agent("helper", "Help.", tools=[pick], model=scripted(brain))
    async with world(tmp_path, agent=agent) as w:
        await w.say("pick one")
        prompt = await w.fake.wait(lambda: w.fake.prompt(PERSONAL), "the card")
        assert prompt.card is not None
        assert prompt.card["body"][1]["type"] == "Input.Number"
        verb = "durable_turns.submit"
        low = await w.send(w.fake.click(prompt, aad=ALICE, verb=verb, value="0"))
        assert low.json()["value"].startswith("That answer doesn't fit the request")
        words = await w.send(w.fake.click(prompt, aad=ALICE, verb=verb, value="three"))
        assert words.json()["value"].startswith("That answer doesn't fit the request")
        ok = await w.send(w.fake.click(prompt, aad=ALICE, verb=verb, value="3"))
        assert ok.json()["value"]["body"][1]["text"] == "Answered 3 by Alice"
        await w.fake.wait(lambda: any(a.text.endswith("picked 3") for a in
                                      w.fake.in_conversation(PERSONAL)), "the reply")


async def test_a_turn_nobody_typed_is_delivered_to_a_stored_conversation_reference(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.say("hello")
        await w.done(PERSONAL)
        target = await w.teams.reference(w.teams.ctx.session(f"teams:{PERSONAL}"))
        assert target == {"conversation_id": PERSONAL, "service_url": w.fake.base,
                          "tenant_id": "tenant-1"}
        ctx = mount_agent(w.runtime.agents["helper"], w.runtime)
        result = await receive(w.teams, ctx, seed="daily digest", target=target,
                               trigger=Trigger(by="cron:daily"), session="digest",
                               turn_id="digest-1")
        assert result.status == "completed"
        posted = w.fake.in_conversation(PERSONAL)[-1]
        assert posted.text == "You said: daily digest" and posted.reply_to is None
        (turn,) = await ctx.session("digest").chain()
        assert turn.data is not None
        assert turn.data["delivered"]["receipt"] == {**{k: target[k] for k in (
            "conversation_id", "service_url")}, "id": posted.id}


async def test_teams_turns_run_under_the_teams_policy(tmp_path: Path) -> None:
    seen: list[tuple[list[str], str]] = []

    def brain(request: ModelRequest) -> ModelReply:
        seen.append((sorted(t.name for t in request.tools), request.system))
        return ModelReply("ok")

    agent = Agent("helper", "Help.", tools=[slack_app.refund, slack_app.lookup],
                  surfaces={"teams": SurfacePolicy(mode="append", deny_tools=("refund",),
                                                   instructions="Be brief in Teams.")})
    async with world(tmp_path, agent=agent, model=scripted(brain)) as w:
        await w.say("hi")
        await w.done(PERSONAL)
        ((tools, system),) = seen
        assert tools == ["lookup"]
        assert system.startswith("Help.") and system.endswith("Be brief in Teams.")


async def test_a_refused_speaker_is_told_privately(tmp_path: Path) -> None:
    async def only_alice(principal: Any, action: Any, session: Any) -> bool:
        return bool(principal["id"] == ALICE and principal["source"] == "teams")

    async with world(tmp_path, authorize=only_alice) as w:
        await w.say("hello", conversation=CHANNEL, aad=BOB)
        (note,) = await w.fake.wait(lambda: w.fake.targeted(f"29:{BOB}"), "the note")
        assert note.text == "You can't talk to this agent here."
        assert w.fake.in_conversation(CHANNEL) == []  # nobody else sees it
        assert not (await w.teams.ctx.session(f"teams:{CHANNEL}").summary()).exists


def test_the_registry_makes_it_from_the_environment() -> None:
    made = channel_from_env("teams", {"TEAMS_APP_ID": APP_ID, "TEAMS_APP_PASSWORD": "pw",
                                      "TEAMS_TENANT_ID": "tenant-1"})
    assert isinstance(made, TeamsChannel) and made.name == "teams"
    with pytest.raises(ConfigurationError, match="TEAMS_APP_ID"):
        channel_from_env("teams", {})
    with pytest.raises(ValueError, match="password, certificate or token"):
        teams_channel(app_id=APP_ID)


async def test_a_card_s_data_never_answers_another_source_s_turn(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        other = w.teams.ctx.session("http:desk")
        await other.start("refund 6", turn_id="t-http")
        await other.result("t-http", timeout=WAIT)
        assert (await other.pending()) is not None
        await w.say("refund 5")
        prompt = await w.fake.wait(lambda: w.fake.prompt(PERSONAL), "the card")
        click = w.fake.click(prompt, aad=ALICE)
        action = click["value"]["action"]
        action["data"] = {**action["data"], "s": "http:desk", "t": "t-http"}
        r = await w.send(click)
        assert r.json()["value"] == "This card answers no request of this bot."
        assert (await other.pending()) is not None and slack_app.paid == []


async def test_a_stream_teams_ended_is_finished_by_an_update(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.say("hold")
        stream = await w.fake.wait(lambda: next(iter(w.fake.in_conversation(PERSONAL)), None),
                                   "the stream")
        assert stream.streaming and stream.statuses == ["⏳ hold"] and stream.text == ""
        assert w.fake.expire_streams() == 1  # its two minutes ran out while the tool ran
        slack_app.held.setdefault("hold", asyncio.Event()).set()
        await w.fake.wait(lambda: stream.edited, "the update")
        await w.teams.idle()
        assert stream.text == "✓ hold\n\nYou said: hold"
        assert len(w.fake.in_conversation(PERSONAL)) == 1  # finished, not posted again


async def test_a_message_while_an_approval_waits_is_told_to_answer_it_first(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.say("refund 5")
        await w.fake.wait(lambda: w.fake.prompt(PERSONAL), "the card")
        await w.say("and another thing")
        note = await w.fake.wait(lambda: next((a for a in w.fake.in_conversation(PERSONAL)
                                               if "waiting for an answer" in a.text), None),
                                 "the note")
        assert note.text == BUSY


async def test_the_bot_s_token_comes_from_its_password_through_msal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = tls_files(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # MSAL's requests trusts the fake
    login = TeamsFake()  # Entra ID's side: the same fake's routes, over https
    async with serving(login.app, ssl_certfile=str(cert), ssl_keyfile=str(key)) as url:
        https = url.replace("http://", "https://")
        async with world(tmp_path, token=None, password=login.password, tenant=TENANT,
                         login_url=https) as w:
            await w.say("hello")
            (reply,) = await w.done(PERSONAL)
            assert reply.text == "You said: hello"  # the connector took the token
            await w.say("again")
            await w.done(PERSONAL, 2)
    assert len(login.token_requests) == 1  # MSAL's cache: one token for every call
    (asked,) = login.token_requests
    assert asked["client_id"] == APP_ID and asked["client_secret"] == login.password
