"""F22: The store kit's live relay (``stores.live``): frames within the wire's limit, text merged,
a bounded queue, the session's text sent ahead of its step; and thinking streamed live.

The wire here is a loopback double of the ``LiveWire`` seam (as httpx ships
``MockTransport``): what one relay sends, another receives. The real wires run in
``test_live_processes.py`` and the conformance suite.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from durable_turns import Agent, MemoryStore, Runtime, Stop, TextDelta
from durable_turns.events import MessageDelta, MessageThinking, TurnEvent
from durable_turns.model import ModelRequest, ThinkingDelta
from durable_turns.records import SessionKey
from durable_turns.stores.live import LiveRelay, decode_frame

KEY = SessionKey("ops", "s1")


class Loopback:
    """A wire whose frames go to every other loopback wire on the same bus, in order."""

    transactional = False

    def __init__(self, bus: list[Loopback], origin: str, limit: int = 7900) -> None:
        self.bus = bus
        self.origin = origin
        self.limit = limit
        self.sent: list[str] = []
        self._receive: Callable[[str], None] | None = None
        bus.append(self)

    def peers(self) -> bool:
        return len(self.bus) > 1

    async def send(self, frames: list[str]) -> None:
        self.sent.extend(frames)
        for other in self.bus:
            if other is not self and other._receive is not None:
                for f in frames:
                    other._receive(f)

    def on_frame(self, receive: Callable[[str], None]) -> None:
        self._receive = receive


def delta(text: str, seq: int = 1, turn_id: str = "t1", session: str = "s1") -> MessageDelta:
    return MessageDelta(agent="ops", session=session, turn_id=turn_id, seq=seq, text=text)


async def test_pieces_of_one_turn_s_text_are_merged_and_frames_keep_within_the_limit() -> None:
    bus: list[Loopback] = []
    sender, receiver = Loopback(bus, "a", limit=600), Loopback(bus, "b")
    got: list[tuple[SessionKey, TurnEvent]] = []
    relay = LiveRelay(sender, lambda _k, _e: None, interval=0.001)
    LiveRelay(receiver, lambda k, e: got.append((k, e)))
    for i in range(50):
        relay.put(delta(f"{i:02} "))                # one turn: merged
        relay.put(delta("x" * 30, session=f"o{i}"))  # fifty other sessions: an item each
    async with asyncio.timeout(10):
        while len(got) < 51:
            await asyncio.sleep(0.001)
    await relay.close()
    assert all(len(f) <= 600 for f in sender.sent) and len(sender.sent) > 1
    assert all(json.loads(f)["from"] == "a" for f in sender.sent)
    mine = "".join(e.text for k, e in got if k == KEY)  # type: ignore[attr-defined]
    assert mine == "".join(f"{i:02} " for i in range(50))
    assert [k.session for k, _e in got if k != KEY] == [f"o{i}" for i in range(50)]


async def test_a_relay_drops_what_its_wire_cannot_keep_up_with() -> None:
    bus: list[Loopback] = []
    relay = LiveRelay(Loopback(bus, "a"), lambda _k, _e: None, max_pending=1000)
    for i in range(100):
        relay.put(delta("y" * 40, session=f"s{i}"))  # not merged: a session each
    assert relay.dropped > 0
    await relay.close()


async def test_a_step_takes_its_session_s_text_ahead_of_the_rest() -> None:
    bus: list[Loopback] = []
    relay = LiveRelay(Loopback(bus, "a"), lambda _k, _e: None, interval=3600)
    relay.put(delta("mine "))
    relay.put(delta("theirs", session="s2"))
    relay.put(delta("too"))
    frames = await relay.take(KEY)
    _origin, events = decode_frame(frames[0])
    assert [e.text for e in events] == ["mine ", "too"]  # type: ignore[attr-defined]
    assert await relay.take(KEY) == []
    await relay.close()


def test_a_frame_that_is_not_one_is_ignored() -> None:
    assert decode_frame("not json") == (None, [])
    assert decode_frame('{"from": "a", "live": [["ops", "s1", "t1", 1, "nope", {}]]}') == \
        ("a", [])


class Thinker:
    """A model that reasons aloud, then answers."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        yield ThinkingDelta("Let me ")
        yield ThinkingDelta("see.")
        yield TextDelta("Forty-two.")
        yield Stop("end_turn")


async def test_thinking_streams_live_as_its_own_event_never_as_answer_text() -> None:
    async with Runtime([Agent("ops")], MemoryStore(), Thinker()) as rt:
        session = rt.session("ops", "s1")
        seen: list[TurnEvent] = []
        session.observe(seen.append)
        r = await session.turn("the answer?", turn_id="t1")
    assert r.text == "Forty-two."
    thinking = [e.text for e in seen if isinstance(e, MessageThinking)]
    text = [e.text for e in seen if isinstance(e, MessageDelta)]
    assert (thinking, text) == (["Let me ", "see."], ["Forty-two."])
    assert all(not e.durable for e in seen if isinstance(e, MessageThinking))
