"""F16: The thread-delivery base (``channels/threads.py``) on a platform that is not Slack: an
in-memory board that implements the six calls. What it shows is the base's alone: a reply
streamed, a prompt per park and the reply going on after the answer, a half-streamed reply
finished after a restart from the stored state, a ``receive()`` turn recovered while it runs."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

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
from durable_turns.channels import mount_agent, receive, recover_deliveries
from durable_turns.channels.threads import (
    Chunk,
    StreamEnded,
    Task,
    Text,
    Thread,
    ThreadDeliveries,
)
from durable_turns.events import TurnEvent
from durable_turns.inbound import InboundEvent
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.records import InputRequest
from durable_turns.scheduling import NoDriveScheduler

WAIT = 30.0
"""The bound on every wait of these tests."""
T = TypeVar("T")


@dataclass
class Message:
    room: str
    chunks: list[Chunk] = field(default_factory=list)
    text: str = ""
    streaming: bool = False
    prompt: InputRequest | None = None

    @property
    def shown(self) -> str:
        """What the message shows: its text once rewritten, else its streamed text."""
        return self.text or "".join(c.text for c in self.chunks if isinstance(c, Text))


class Board:
    """A platform kept in memory: messages by id, every call logged; tests wait on the log."""

    def __init__(self) -> None:
        self.messages: dict[str, Message] = {}
        self.calls: list[str] = []
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()

    def _new(self, message: Message, call: str) -> str:
        mid = f"m{next(self._ids)}"
        self.messages[mid] = message
        self._log(call)
        return mid

    def _log(self, call: str) -> None:
        self.calls.append(call)
        self._changed.set()

    async def wait(self, found: Callable[[], T | None], what: str) -> T:
        async with asyncio.timeout(WAIT):
            while (got := found()) is None:
                self._changed.clear()
                await self._changed.wait()
        return got

    async def start_stream(self, thread: Thread, chunks: Sequence[Chunk]) -> str:
        return self._new(Message(thread.route["room"], list(chunks), streaming=True), "start")

    async def append_stream(self, thread: Thread, message: str,
                            chunks: Sequence[Chunk]) -> None:
        if not self.messages[message].streaming:
            raise StreamEnded("not streaming")
        self.messages[message].chunks += chunks
        self._log("append")

    async def stop_stream(self, thread: Thread, message: str,
                          chunks: Sequence[Chunk] = ()) -> None:
        if not self.messages[message].streaming:
            raise StreamEnded("not streaming")
        self.messages[message].chunks += chunks
        self.messages[message].streaming = False
        self._log("stop")

    async def post(self, thread: Thread, text: str) -> str:
        return self._new(Message(thread.route["room"], text=text), "post")

    async def update(self, thread: Thread, message: str, text: str) -> None:
        self.messages.setdefault(message, Message(thread.route["room"])).text = text
        self._log("update")

    async def post_prompt(self, thread: Thread, request: InputRequest) -> str:
        return self._new(Message(thread.route["room"], text=request.prompt, prompt=request),
                         "prompt")


class BoardChannel:
    """The channel's part the base needs: its name and ``deliver`` (F9)."""

    name = "board"

    def __init__(self) -> None:
        self.delivered: list[tuple[Mapping[str, Any], list[str]]] = []

    async def deliver(self, target: Mapping[str, Any],
                      events: AsyncIterable[TurnEvent]) -> Any:
        self.delivered.append((target, [e.type async for e in events]))
        return {"n": len(self.delivered)}


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once the speaker approves it."""
    return {"refunded": await ctx.request_input("approve", f"Refund {order_id}?",
                                                schema={"type": "boolean"})}


def brain(request: ModelRequest) -> ModelReply:
    opening = next(m.text for m in reversed(request.messages) if m.is_opening)
    if opening.startswith("refund") and calls_this_turn(request) == 0:
        return ModelReply("Asking first. ", [ToolCall("c1", "refund", {"order_id": "7"})])
    if opening.startswith("refund"):
        return ModelReply(f"Refunded: {request.messages[-1].result['refunded']}.")
    return ModelReply(f"You said: {opening}")


def agent() -> Agent:
    return Agent("desk", "You help.", [refund])


def said(text: str, room: str = "r1") -> InboundEvent:
    return InboundEvent("board", {"id": "ann", "attested": True}, text, meta={"room": room})


async def test_a_reply_streams_parks_on_a_prompt_and_goes_on_after_the_answer(
        tmp_path: Path) -> None:
    board, channel = Board(), BoardChannel()
    threads = ThreadDeliveries(channel, board)
    async with Runtime([agent()], SqliteStore(tmp_path / "s.db"), scripted(brain)) as rt:
        s = rt.session("desk", "board:r1")
        await threads.start_turn(s, "refund 7", turn_id="t1", event=said("refund 7"))
        prompt = await board.wait(lambda: next(
            (m for m in board.messages.values() if m.prompt), None), "the prompt")
        assert prompt.text == "Refund 7?" and prompt.prompt is not None
        first = board.messages["m1"]
        assert not first.streaming and first.shown == "Asking first. "
        assert [(c.id, c.status) for c in first.chunks if isinstance(c, Task)] == [
            ("c1", "in_progress")]
        await threads.answer(s, "t1", prompt.prompt.id, True, by="ann")
        await asyncio.wait_for(threads.idle(), WAIT)
        last = board.messages["m3"]
        assert last.shown == "Refunded: True." and not last.streaming
        assert [(c.id, c.status) for c in last.chunks if isinstance(c, Task)] == [
            ("c1", "complete")]
        rec = await s.entry("t1")
        assert rec is not None and rec.data is not None
        assert rec.data["board"]["done"] is True
        assert rec.data["board"]["prompts"] == {"approve": "m2"}


async def test_a_reply_cut_mid_stream_is_rewritten_whole_after_a_restart(
        tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with Runtime([agent()], SqliteStore(db), scripted(brain)) as rt:
        s = rt.session("desk", "board:r1")
        # Accepted as the channel accepts its turns: owed a delivery through it.
        await s.turn("hello there", turn_id="t1", event=said("hello there"), deliver="board")
        # What a process that died mid-stream left: the open stream's message, nothing more.
        await s.set_turn_data("t1", "board", {"seq": 0, "prompts": {},
                                              "stream": {"ts": "m-old", "after": 0}})
    board = Board()
    threads = ThreadDeliveries(BoardChannel(), board)
    async with Runtime([agent()], SqliteStore(db), scripted(brain)) as rt:
        ctx = mount_agent(rt.agents["desk"], rt)
        assert await threads.recover(ctx) == 1
        await asyncio.wait_for(threads.idle(), WAIT)
        assert board.calls == ["update"]
        assert board.messages["m-old"].text == "You said: hello there"
        assert await threads.recover(ctx) == 0  # delivered: nothing is owed any more


async def test_a_receive_turn_still_running_at_recovery_is_delivered_when_it_ends(
        tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    channel = BoardChannel()
    async with Runtime([agent()], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        # Accepted by receive() in a process that died before the turn ran.
        event = InboundEvent("board", None, "daily digest", meta={
            "deliver": {"channel": "board", "target": {"room": "r9"}}})
        await rt.session("desk", "digest").start("daily digest", turn_id="d1", event=event,
                                                 trigger=Trigger(by="cron:daily"),
                                                 deliver="board")
    threads = ThreadDeliveries(channel, Board())
    async with Runtime([agent()], SqliteStore(db), scripted(brain)) as rt:
        assert await threads.recover(mount_agent(rt.agents["desk"], rt)) == 1
        assert channel.delivered == []  # it has not run yet
        await rt.recover()
        await asyncio.wait_for(threads.idle(), WAIT)
        ((target, types),) = channel.delivered
        assert target == {"room": "r9"} and types[-1] == "turn.completed"
        rec = await rt.session("desk", "digest").entry("d1")
        assert rec is not None and (rec.data or {})["delivered"]["final"] is True


class FlakyChannel(BoardChannel):
    """Delivers, or fails while ``down`` (the platform away)."""

    down = False

    async def deliver(self, target: Mapping[str, Any],
                      events: AsyncIterable[TurnEvent]) -> Any:
        if self.down:
            raise ConnectionError("the board is away")
        return await super().deliver(target, events)


async def test_recovery_takes_up_only_the_deliveries_still_owed(tmp_path: Path) -> None:
    # The store keeps the channel's outbox: a turn is owed from its accept until its end is
    # delivered. Recovery asks for what is owed, never reads every turn.
    channel = FlakyChannel()
    async with Runtime([agent()], SqliteStore(tmp_path / "s.db"), scripted(brain)) as rt:
        ctx = mount_agent(rt.agents["desk"], rt)
        for i in range(3):
            await receive(channel, ctx, seed=f"digest {i}", target={"room": "r"},
                          turn_id=f"d{i}")
        assert len(channel.delivered) == 3
        assert await rt.queries.owed_deliveries("board") == []
        channel.down = True
        with pytest.raises(ConnectionError):
            await receive(channel, ctx, seed="digest 3", target={"room": "r"}, turn_id="d3")
        owed = await rt.queries.owed_deliveries("board")
        assert [(key.session, rec.turn_id, rec.deliver) for key, rec in owed] == [
            ("proactive:system", "d3", "board")]
        assert await rt.queries.owed_deliveries("board", "other") == []
        channel.down = False
        assert await recover_deliveries(channel, ctx) == 1
        assert [types[-1] for _target, types in channel.delivered] == ["turn.completed"] * 4
        assert await rt.queries.owed_deliveries("board") == []
        assert await recover_deliveries(channel, ctx) == 0
