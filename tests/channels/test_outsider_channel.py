"""F16 and F9: a thread channel added as an outsider would, on the thread-channel base.

The channel is one module (``toychat.py``: its routes and its platform calls on
``ThreadChannel``) and one registration (``channel_from_env("toychat", factories={…})``, what
an app's ``channels = {…}`` in ``agent.py`` feeds); the platform is a local fake spoken to
over real HTTP (``fakes/toychat_api.py``), the app served by uvicorn with its lifespan (which
opens the runtime and starts the channel). It shows a turn started from the platform, its
reply streamed into the thread, a park answered by a button click (a wrong clicker refused
and told why, the right one answering), a delivery the platform could not take made after
a restart, by a second runtime on the same SQLite store, and a turn nobody on the platform
started (``receive()``) posted at its target, its prompt answered there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from durable_turns import (
    Agent,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    Trigger,
    scripted,
    tool,
)
from durable_turns.channels import Channel, channel_from_env, receive
from durable_turns.clock import Clock, ManualClock
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.schedules import fire_turn_id
from durable_turns.server import create_app
from fakes.serving import serving
from fakes.toychat_api import SECRET, TOKEN, Post, ToyChatFake
from toychat import ToyChat, toychat_from_env

WAIT = 30.0
"""The bound on every wait of these tests."""


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once the speaker approves it."""
    return {"refunded": await ctx.request_input("approve", f"Refund order {order_id}?",
                                                schema={"type": "boolean"})}


@tool
async def approve_digest(ctx: ToolContext) -> bool:
    """Ask ann whether the digest may go out."""
    return bool(await ctx.request_input("send", "Send the digest?", schema={"type": "boolean"},
                                        answerers={"user": "ann"}))


def brain(request: ModelRequest) -> ModelReply:
    opening = next(m.text for m in reversed(request.messages) if m.is_opening)
    if opening == "digest" and calls_this_turn(request) == 0:
        return ModelReply("", [ToolCall("d1", "approve_digest", {})])
    if opening == "digest":
        return ModelReply("Digest sent." if request.messages[-1].result else "Digest held.")
    if opening.startswith("refund") and calls_this_turn(request) == 0:
        return ModelReply("Asking first. ", [ToolCall("c1", "refund", {"order_id": "7"})])
    if opening.startswith("refund"):
        return ModelReply(f"Refunded: {request.messages[-1].result['refunded']}.")
    return ModelReply(f"You said: {opening}")


@asynccontextmanager
async def hosted(fake: ToyChatFake, api: str, db: Path, clock: Clock | None = None
                 ) -> AsyncIterator[tuple[Runtime, ToyChat]]:
    """The app of a runtime on ``db`` with the ToyChat channel, served with its lifespan."""
    runtime = Runtime([Agent("desk", "You help.", tools=[refund, approve_digest])], SqliteStore(db),
                      scripted(brain, chunks=3), clock=clock)
    env = {"TOYCHAT_API": api, "TOYCHAT_TOKEN": TOKEN, "TOYCHAT_SECRET": SECRET}
    channel = channel_from_env("toychat", env, factories={"toychat": toychat_from_env})
    assert isinstance(channel, ToyChat) and isinstance(channel, Channel)
    app = create_app(runtime, channels=[channel])
    async with serving(app, lifespan="on") as url:
        fake.app_url = url
        try:
            yield runtime, channel
        finally:
            await asyncio.wait_for(channel.idle(), WAIT)


async def test_a_turn_from_the_platform_streams_its_reply_and_its_park_takes_the_right_click(
        tmp_path: Path) -> None:
    fake = ToyChatFake()
    async with serving(fake.app) as api, hosted(fake, api, tmp_path / "s.db") as (rt, _ch):
        said = await fake.say("ann", "r1", "t1", "refund 7", message_id="m1")
        assert said.status_code == 200
        prompt: Post = await fake.wait(lambda: next(
            (p for p in fake.thread("r1", "t1") if p.buttons), None), "the prompt")
        first = fake.thread("r1", "t1")[0]
        assert first.streamed and not first.streaming and first.text == "Asking first. "
        assert prompt.text == "Refund order 7?"

        # Bob may not answer ann's request: he is told why, privately; the turn waits on.
        assert (await fake.click("bob", prompt, "Approve")).status_code == 200
        (refused,) = await fake.wait(lambda: fake.private("bob") or None, "the refusal")
        assert "someone else" in refused.text and refused.thread == "t1"
        s = rt.session("desk", "toychat:r1:t1")
        assert (await s.summary()).status == "suspended" and not prompt.edited

        assert (await fake.click("ann", prompt, "Approve")).status_code == 200
        await fake.wait(lambda: prompt.edited or None, "the prompt's update")
        assert prompt.text == "Refund order 7? (approved by ann)" and not prompt.buttons
        last = await fake.wait(lambda: next((p for p in fake.thread("r1", "t1")
                                             if p.text == "Refunded: True."
                                             and not p.streaming), None), "the reply")
        assert last.streamed and "append" in fake.calls  # streamed as the model wrote it
        result = await s.result("toychat:m1")
        assert result.status == "completed" and result.text == "Refunded: True."
        answer = next(m for m in await s.transcript() if m.call_id == "c1")
        assert answer.result == {"refunded": True}
        assert [p.text for p in fake.thread("r1", "t1")] == [
            "Asking first. ", "Refund order 7? (approved by ann)", "Refunded: True."]


async def test_a_reply_the_platform_could_not_take_is_delivered_after_a_restart(
        tmp_path: Path) -> None:
    fake = ToyChatFake()
    db = tmp_path / "s.db"
    async with serving(fake.app) as api:
        fake.down = True  # the platform's API answers 503: the reply cannot be delivered
        async with hosted(fake, api, db) as (rt, _ch):
            assert (await fake.say("ann", "r2", "t2", "hello", message_id="m2")).status_code \
                == 200
            result = await rt.session("desk", "toychat:r2:t2").result("toychat:m2")
            assert result.status == "completed"
            await fake.wait(lambda: fake.calls or None, "the failed delivery")
        assert fake.posts == {}  # nothing reached the thread; the delivery stays owed

        fake.down = False
        async with hosted(fake, api, db) as (_rt, channel):  # the restart: a new runtime
            reply = await fake.wait(lambda: next((p for p in fake.thread("r2", "t2")
                                                  if not p.streaming), None), "the reply")
            assert reply.text == "You said: hello"
            await asyncio.wait_for(channel.idle(), WAIT)
            assert await channel.recover() == 0  # delivered: nothing is owed any more
        assert [p.text for p in fake.posts.values()] == ["You said: hello"]


async def test_a_turn_nobody_on_the_platform_started_is_posted_and_its_prompt_answered(
        tmp_path: Path) -> None:
    fake = ToyChatFake()
    async with serving(fake.app) as api, hosted(fake, api, tmp_path / "s.db") as (rt, ch):
        parked = await receive(ch, ch.context(rt), seed="digest", target={"room": "ops"},
                               trigger=Trigger(by="cron:daily"), turn_id="digest-1")
        assert parked.status == "suspended"
        (prompt,) = fake.thread("ops", "main")
        assert prompt.text == "Send the digest?" and prompt.buttons
        await fake.click("bob", prompt, "Approve")  # the request names ann: bob is refused
        (refused,) = await fake.wait(lambda: fake.private("bob") or None, "the refusal")
        assert "someone else" in refused.text
        await fake.click("ann", prompt, "Approve")
        done = await fake.wait(lambda: next((p for p in fake.thread("ops", "main")
                                             if p.text == "Digest sent."), None), "the outcome")
        assert prompt.text == "Send the digest? (approved by ann)" and done.id != prompt.id
        result = await rt.session("desk", "proactive:cron:daily").result("digest-1")
        assert result.status == "completed" and result.text == "Digest sent."


async def test_a_schedule_with_a_channel_is_delivered_through_it(tmp_path: Path) -> None:
    """F24: a schedule's fire (the runtime's clock moved by hand) is posted by the channel it
    names, to its target, as ``receive`` does."""
    fake = ToyChatFake()
    clock = ManualClock()
    async with serving(fake.app) as api, hosted(fake, api, tmp_path / "s.db",
                                                clock=clock) as (rt, _ch):
        await rt.schedule("hello", agent="desk", seed="good morning", every=3600,
                          channel="toychat", target={"room": "ops"})
        clock.advance(3600)  # due: the clock loop fires it, the channel posts it
        posted = await fake.wait(lambda: next((p for p in fake.thread("ops", "main")
                                               if not p.streaming), None), "the post")
        assert posted.text == "You said: good morning"
        turn = fire_turn_id("hello", clock.now())
        result = await rt.session("desk", "schedule:hello").result(turn)
        assert result.status == "completed"
