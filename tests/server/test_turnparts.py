"""F19: A turn's events as frontend parts (``server/_turnparts.py``): the text of a message shown
once and whole, whether the stream saw the step from its start, joined it late, lost a live
piece or saw a model call tried again; and AG-UI's frames of those parts a valid sequence."""

from __future__ import annotations

from typing import Any

from durable_turns.events import (
    ActionCompleted,
    EventIds,
    InputRequested,
    MessageCompleted,
    MessageDelta,
    MessageRetry,
    MessageThinking,
    TurnCompleted,
    TurnEvent,
    TurnStarted,
)
from durable_turns.messages import ToolCall
from durable_turns.records import InputRequest
from durable_turns.server._ag_ui import Frames
from durable_turns.server._ai_sdk import chunks
from durable_turns.server._turnparts import Part, TurnParts

IDS: EventIds = {"agent": "ops", "session": "s1", "turn_id": "t1"}
CALL = ToolCall("c1", "lookup", {"city": "Paris"})


def parts(events: list[TurnEvent], joined: int = 0) -> list[Part]:
    tp = TurnParts("t1", joined)
    return [p for e in events for p in tp.feed(e)]


def ui(events: list[TurnEvent], joined: int = 0) -> list[dict[str, Any]]:
    return [c for p in parts(events, joined) for c in chunks(p)]


def shown_text(found: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in found if c["type"] == "text-delta")


def turn(*middle: TurnEvent) -> list[TurnEvent]:
    return [TurnStarted(**IDS, seq=1, text="hi"), *middle,
            TurnCompleted(**IDS, seq=9, text="Hello there.")]


def delta(text: str, seq: int = 1) -> MessageDelta:
    return MessageDelta(**IDS, seq=seq, text=text)


def reply(text: str, seq: int = 2, calls: tuple[ToolCall, ...] = ()) -> MessageCompleted:
    return MessageCompleted(**IDS, seq=seq, text=text, tool_calls=calls)


def test_a_step_seen_from_its_start_streams_live() -> None:
    found = ui(turn(delta("Hello "), delta("there."), reply("Hello there.")))
    assert [c["type"] for c in found] == [
        "start-step", "text-start", "text-delta", "text-delta", "text-end", "finish-step",
        "finish"]
    assert shown_text(found) == "Hello there."


def test_a_stream_that_joined_late_holds_the_step_back_and_shows_it_whole() -> None:
    # It joined after seq 1: the live pieces of that step (they carry seq 1) began before it.
    found = ui(turn(delta("there."), reply("Hello there.")), joined=1)
    assert [c["type"] for c in found] == [
        "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish"]
    assert shown_text(found) == "Hello there."


def test_a_replay_without_live_text_shows_each_reply_whole() -> None:
    found = ui(turn(reply("Let me look.", seq=2, calls=(CALL,)),
                    ActionCompleted(**IDS, seq=3, call=CALL, result={"celsius": 21}),
                    reply("Hello there.", seq=4)))
    assert [c["type"] for c in found] == [
        "start-step", "text-start", "text-delta", "text-end", "tool-input-available",
        "tool-output-available", "finish-step", "start-step", "text-start", "text-delta",
        "text-end", "finish-step", "finish"]
    assert shown_text(found) == "Let me look.Hello there."


def test_a_lost_live_piece_resets_the_step_and_shows_the_stored_reply() -> None:
    found = ui(turn(delta("Hello "), delta("thar"), reply("Hello there.")))
    types = [c["type"] for c in found]
    reset = types.index("reset-step")
    assert types[reset:reset + 2] == ["reset-step", "start-step"]
    assert shown_text(found[reset:]) == "Hello there."


def test_a_model_call_tried_again_voids_what_it_streamed() -> None:
    found = ui(turn(delta("Hel"), MessageRetry(**IDS, seq=1, attempt=1, retries=3, delay=0.1,
                                               error="reset"),
                    delta("Hello "), delta("there."), reply("Hello there.")))
    types = [c["type"] for c in found]
    reset = types.index("reset-step")
    assert shown_text(found[:reset]) == "Hel"
    assert shown_text(found[reset:]) == "Hello there."  # the retry's, once, whole


def test_reasoning_before_the_answer_is_shown_and_after_it_is_not() -> None:
    found = ui(turn(MessageThinking(**IDS, seq=1, text="Think."), delta("Hello there."),
                    MessageThinking(**IDS, seq=1, text="More."), reply("Hello there.")))
    assert [c["type"] for c in found][:6] == [
        "start-step", "reasoning-start", "reasoning-delta", "reasoning-end", "text-start",
        "text-delta"]
    assert [c["delta"] for c in found if c["type"] == "reasoning-delta"] == ["Think."]


def test_a_park_asks_for_approval_or_input_then_finishes() -> None:
    yes_no = InputRequest("ok", "Refund?", {"type": "boolean"}, turn_id="t1", call_id="c1")
    other = InputRequest("color", "Which?", {"type": "string"}, turn_id="t1", call_id="c2")
    found = ui([TurnStarted(**IDS, seq=1, text="hi"), reply("", calls=(CALL,)),
                InputRequested(**IDS, seq=3, request=InputRequest(
                    yes_no.id, yes_no.prompt, yes_no.schema, turn_id="t1", call_id="c1",
                    more=(other,)))])
    assert found[-3:] == [
        {"type": "tool-approval-request", "approvalId": "resume:t1:ok", "toolCallId": "c1",
         "reason": "Refund?"},
        {"type": "data-input-request", "id": "resume:t1:color", "data": {
            "id": "resume:t1:color", "turn_id": "t1", "input_id": "color", "call_id": "c2",
            "prompt": "Which?", "schema": {"type": "string"}}},
        {"type": "finish", "finishReason": "tool-calls"}]


def test_ag_ui_frames_stay_a_valid_sequence_across_a_reset() -> None:
    frames = Frames()
    events = [e for p in parts(turn(delta("Hello "), delta("thar"), reply("Hello there.")))
              for e in frames.events(p)] + frames.close()
    opened: set[str] = set()
    seen: set[str] = set()
    for e in events:
        kind, mid = e.type.value, str(getattr(e, "message_id", ""))
        if kind == "TEXT_MESSAGE_START":
            assert mid not in seen, "a message id is used once"
            opened.add(mid)
            seen.add(mid)
        elif kind.startswith("TEXT_MESSAGE"):
            assert mid in opened
            if kind == "TEXT_MESSAGE_END":
                opened.remove(mid)
    assert not opened
    contents = [getattr(e, "delta", None) for e in events
                if e.type.value == "TEXT_MESSAGE_CONTENT"]
    assert contents[-1] == "Hello there."  # the stored reply, in a message of its own
