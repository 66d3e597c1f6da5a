"""F24 in Slack: a request with reminders posts its buttons again at each reminder, and
past its deadline the turn goes on with its default and the reply follows in the thread; a
click after the deadline changes nothing. Against the local fake of Slack's Web API, the
runtime on a ManualClock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from durable_turns import (
    Agent,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.channels.slack import slack_channel
from durable_turns.clock import ManualClock
from durable_turns.server import create_app
from fakes.serving import serving
from fakes.slack_api import (
    BOT_USER,
    SECRET,
    TOKEN,
    SlackFake,
    block_actions,
    event_callback,
    signed,
)

WAIT = 30.0
answers: list[Any] = []


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund once the speaker approves; unanswered for an hour, it is not."""
    ok = await ctx.request_input("approve", f"Refund order {order_id}?",
                                 schema={"type": "boolean"}, timeout=3600, default=False,
                                 remind_every=1200)
    answers.append(ok)
    return {"refunded": bool(ok)}


async def test_slack_posts_reminders_then_the_deadline_s_outcome(tmp_path: Path) -> None:
    answers.clear()
    clock = ManualClock()
    model = scripted([ModelReply("", [ToolCall("call-refund", "refund", {"order_id": "7"})]),
                      ModelReply("Not refunded: nobody approved in time.")])
    fake = SlackFake()
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        runtime = Runtime([Agent("helper", "", [refund])], SqliteStore(tmp_path / "s.db"),
                          model, clock=clock)
        slack = slack_channel(signing_secret=SECRET, bot_token=TOKEN,
                              base_url=f"{fake_url}/api/")
        app = create_app(runtime, channels=[slack])
        async with runtime, serving(app) as url, httpx.AsyncClient(timeout=WAIT) as http:
            async def post(path: str, body: Any) -> httpx.Response:
                raw, headers = signed(body)
                return await http.post(f"{url}{path}", content=raw, headers=headers)

            def prompts() -> list[Any]:
                return [m for m in fake.thread("C1", "500.000001")
                        if m.text == "Refund order 7?"]

            await post("/slack/events", event_callback(f"<@{BOT_USER}> refund 7",
                                                       ts="500.000001", user="U1"))
            first = await fake.wait(lambda: prompts() or None, "the prompt")
            assert first[0].blocks[-1]["type"] == "actions"
            clock.advance(1200)  # the first reminder: the buttons posted again
            again = await fake.wait(lambda: p if len(p := prompts()) == 2 else None,
                                    "the reminder")
            assert again[1].blocks[-1]["type"] == "actions"
            clock.advance(1200)
            await fake.wait(lambda: len(prompts()) == 3, "the second reminder")
            clock.advance(1200)  # the deadline: the turn goes on with its default
            reply = await fake.wait(lambda: next(
                (m for m in fake.thread("C1", "500.000001") if not m.streaming
                 and "nobody approved" in m.markdown), None), "the reply after the deadline")
            assert reply.markdown == "Not refunded: nobody approved in time."
            assert answers == [False]
            # A click on a reminder's buttons after the deadline answers nothing.
            assert (await post("/slack/actions", block_actions(
                fake, prompts()[-1], user="U1", approve=True))).status_code == 200
            await asyncio.wait_for(slack.idle(), WAIT)
            assert answers == [False]
