"""The Anthropic adapter against a fake Messages API that speaks the real SSE protocol (F11)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic as sdk
import pytest

from durable_turns import Agent, Runtime, SqliteStore, Tool, ToolContext
from durable_turns.errors import ConfigurationError, ModelError
from durable_turns.events import TurnEvent
from durable_turns.messages import Message, ToolCall
from durable_turns.models import ModelRequest, Stop, TextDelta, ThinkingDelta
from durable_turns.models.anthropic_messages import AnthropicModel, anthropic
from durable_turns.tools import ToolSpec
from fakes import clear_provider_env, collect
from fakes.anthropic_api import (
    Fail,
    RedactedThinking,
    Reply,
    Text,
    Thinking,
    ToolUse,
    anthropic_app,
    assistant_blocks,
)
from fakes.serving import in_process, serving

ADD = ToolSpec("add", "Add two integers.", {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]})
NOW = ToolSpec("now", "The current time.")
WAIT = 30.0
"""The bound on every wait in these tests: a backstop against a hang, never a timing claim
(``bench/adapters.py`` measures how fast a stall is cut or a stream is closed)."""


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clear_provider_env(monkeypatch, tmp_path)


def model_for(app: Any, **kw: Any) -> AnthropicModel:
    kw.setdefault("max_retries", 0)
    return anthropic("claude-test", api_key="sk-test", http_client=in_process(app), **kw)


@pytest.fixture
async def make() -> AsyncIterator[Any]:
    """``make(app, **kw)`` → an in-process model on ``app``, closed after the test."""
    made: list[AnthropicModel] = []

    def build(app: Any, **kw: Any) -> AnthropicModel:
        made.append(model_for(app, **kw))
        return made[-1]

    yield build
    for m in made:
        await m.aclose()


def ask(*messages: Message, tools: tuple[ToolSpec, ...] = (ADD, NOW)) -> ModelRequest:
    return ModelRequest(system="Be brief.", messages=list(messages), tools=list(tools),
                        turn_id="t1")


def user(text: str) -> Message:
    return Message("user", text, turn_id="t1")


def text_of(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def only_stop(events: list[Any]) -> Stop:
    stops: list[Stop] = [e for e in events if isinstance(e, Stop)]
    assert len(stops) == 1 and isinstance(events[-1], Stop)  # exactly one, and last
    return stops[0]


def reply_message(events: list[Any]) -> Message:
    """The assistant message the engine would store for ``events``."""
    stop = only_stop(events)
    calls = tuple(e for e in events if isinstance(e, ToolCall))
    return Message("assistant", text_of(events), calls, turn_id="t1", content=stop.content,
                   usage=dict(stop.usage))


# -- the fake itself, checked by the SDK -------------------------------------------------------


@pytest.mark.parametrize("reason", ["end_turn", "max_tokens", "stop_sequence", "tool_use",
                                    "pause_turn", "refusal", "model_context_window_exceeded"])
async def test_the_fake_passes_the_sdks_strict_validation(reason: str) -> None:
    # The SDK's own stream helper, with strict validation, puts the fake's frames together.
    think, redacted = Thinking("Let me think."), RedactedThinking()
    call = ToolUse("add", {"a": 1, "b": 2})
    app = anthropic_app([Reply([think, redacted, Text("Hi there."), call], stop_reason=reason,
                               cache_read_input_tokens=5)])
    client = sdk.AsyncAnthropic(api_key="k", http_client=in_process(app), max_retries=0,
                                _strict_response_validation=True)
    try:
        async with client.messages.stream(model="claude-test", max_tokens=64,
                                          messages=[{"role": "user", "content": "hi"}]) as s:
            final = await s.get_final_message()
    finally:
        await client.close()
    assert final.stop_reason == reason
    assert [b.model_dump(exclude_none=True) for b in final.content] == [
        {"type": "thinking", "thinking": think.thinking, "signature": think.signature},
        {"type": "redacted_thinking", "data": redacted.data},
        {"type": "text", "text": "Hi there."},
        {"type": "tool_use", "id": call.id, "name": "add", "input": {"a": 1, "b": 2}},
    ]
    assert (final.usage.input_tokens, final.usage.output_tokens,
            final.usage.cache_read_input_tokens) == (21, 34, 5)


# -- happy paths -------------------------------------------------------------------------------


async def test_text_reply_streams_deltas_and_ends_with_one_stop(make: Any) -> None:
    app = anthropic_app([Reply([Text("Hello there, how are you?")], input_tokens=11,
                               output_tokens=7, cache_read_input_tokens=3,
                               cache_creation_input_tokens=2)])
    events = await collect(make(app), ask(user("hi")))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == 3
    assert text_of(events) == "Hello there, how are you?"
    stop = only_stop(events)
    assert stop == Stop("end_turn", {"input_tokens": 11, "output_tokens": 7,
                                     "cache_read_input_tokens": 3,
                                     "cache_creation_input_tokens": 2})
    assert stop.content == ()  # no thinking: nothing provider-native to keep
    sent = app.state.requests[0]
    assert sent["headers"]["authorization"] == "Bearer sk-test"
    body = sent["body"]
    assert body["model"] == "claude-test" and body["stream"] is True
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert body["tools"][0] == {"name": "add", "description": "Add two integers.",
                                "input_schema": dict(ADD.input)}
    assert "thinking" not in body


@pytest.mark.parametrize("reason", ["end_turn", "max_tokens", "stop_sequence", "tool_use",
                                    "pause_turn", "refusal", "model_context_window_exceeded"])
async def test_every_stop_reason_is_passed_through(make: Any, reason: str) -> None:
    details = ({"type": "refusal", "category": "cyber", "explanation": "no"}
               if reason == "refusal" else None)
    app = anthropic_app([Reply([Text("partial")], stop_reason=reason, stop_details=details)])
    events = await collect(make(app), ask(user("hi")))
    assert only_stop(events).reason == reason
    assert text_of(events) == "partial"


async def test_empty_reply_with_abnormal_stop_still_yields_its_stop(make: Any) -> None:
    # The engine, not the adapter, fails an empty abnormal reply (ABNORMAL_STOPS).
    app = anthropic_app([Reply([], stop_reason="refusal")])
    events = await collect(make(app), ask(user("hi")))
    assert events == [Stop("refusal", {"input_tokens": 21, "output_tokens": 34})]


async def test_tool_calls_are_assembled_from_input_json_deltas(make: Any) -> None:
    a = ToolUse("add", {"a": 2, "b": 40, "note": "x" * 50})
    b = ToolUse("now", {})
    app = anthropic_app([Reply([Text("Let me add."), a, b])])
    events = await collect(make(app), ask(user("2+40?")))
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert calls == [ToolCall(a.id, "add", a.input), ToolCall(b.id, "now", {})]
    assert only_stop(events).reason == "tool_use"
    assert text_of(events) == "Let me add."


async def test_a_tool_call_cut_by_max_tokens_is_dropped(make: Any) -> None:
    cut = ToolUse("add", {}, raw_json='{"a": 2, "b"')
    app = anthropic_app([Reply([Text("Adding"), cut], stop_reason="max_tokens")])
    events = await collect(make(app), ask(user("2+40?")))
    assert not [e for e in events if isinstance(e, ToolCall)]
    assert only_stop(events).reason == "max_tokens"


async def test_unparseable_tool_input_without_max_tokens_fails(make: Any) -> None:
    app = anthropic_app([Reply([ToolUse("add", {}, raw_json='{"a": ')])])
    with pytest.raises(ModelError, match="not a JSON object") as info:
        await collect(make(app), ask(user("2+40?")))
    assert info.value.provider == "anthropic"


# -- transcript → request ----------------------------------------------------------------------


async def test_transcript_is_sent_as_alternating_messages_with_grouped_tool_results(
    make: Any,
) -> None:
    calls = (ToolCall("toolu_1", "add", {"a": 1, "b": 2}), ToolCall("toolu_2", "now", {}))
    transcript = [
        Message("trigger", "daily report", turn_id="t0", by="cron:daily"),
        Message("assistant", "Done.", turn_id="t0"),
        user("add 1 and 2, and tell me the time"),
        Message("assistant", "", calls, turn_id="t1"),
        Message("tool", call_id="toolu_1", result=3, turn_id="t1"),
        Message("tool", call_id="toolu_2", result={"error": "RuntimeError: no clock"},
                is_error=True, turn_id="t1"),
    ]
    app = anthropic_app([Reply([Text("3; no clock.")])])
    events = await collect(make(app), ask(*transcript))
    assert text_of(events) == "3; no clock."
    assert app.state.requests[0]["body"]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "daily report"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        {"role": "user", "content": [
            {"type": "text", "text": "add 1 and 2, and tell me the time"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
            {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"},
            {"type": "tool_result", "tool_use_id": "toolu_2",
             "content": '{"error": "RuntimeError: no clock"}', "is_error": True}]},
    ]


async def test_fake_refuses_a_tool_use_without_its_tool_result(make: Any) -> None:
    transcript = [user("add"), Message("assistant", "", (ToolCall("toolu_9", "add", {}),),
                                       turn_id="t1"), user("well?")]
    app = anthropic_app([Reply([Text("never")])])
    with pytest.raises(ModelError) as info:
        await collect(make(app), ask(*transcript))
    assert info.value.status == 400 and not info.value.retryable
    assert str(info.value).startswith(
        "anthropic: HTTP 400 invalid_request_error: messages.1: `tool_use` ids were found "
        "without `tool_result` blocks immediately after: toolu_9.")
    assert len(app.state.script) == 1  # the fake refused before playing anything


# -- thinking ----------------------------------------------------------------------------------


async def test_thinking_is_kept_verbatim_and_echoed_back_unchanged(make: Any) -> None:
    think = Thinking("The user wants a sum. I should call add.")
    call = ToolUse("add", {"a": 2, "b": 40})
    app = anthropic_app([Reply([think, Text("Adding."), call]), Reply([Text("42.")])])
    model = make(app, thinking=True)

    first = await collect(model, ask(user("2+40?")))
    assert "".join(e.text for e in first if isinstance(e, ThinkingDelta)) == think.thinking
    assert text_of(first) == "Adding."  # thinking is never answer text
    stop = only_stop(first)
    assert stop.content == (
        {"type": "thinking", "thinking": think.thinking, "signature": think.signature},
        {"type": "text", "text": "Adding."},
        {"type": "tool_use", "id": call.id, "name": "add", "input": {"a": 2, "b": 40}},
    )
    assert app.state.requests[0]["body"]["thinking"] == {"type": "adaptive"}

    transcript = [user("2+40?"), reply_message(first),
                  Message("tool", call_id=call.id, result=42, turn_id="t1")]
    second = await collect(model, ask(*transcript))
    assert text_of(second) == "42."
    assert assistant_blocks(app.state.requests[1]["body"]) == [list(stop.content)]


async def test_redacted_thinking_is_echoed_back(make: Any) -> None:
    redacted = RedactedThinking()
    call = ToolUse("now", {})
    app = anthropic_app([Reply([redacted, call]), Reply([Text("Noon.")])])
    model = make(app, thinking=4096)
    first = await collect(model, ask(user("time?")))
    assert only_stop(first).content[0] == {"type": "redacted_thinking", "data": redacted.data}
    transcript = [user("time?"), reply_message(first),
                  Message("tool", call_id=call.id, result="12:00", turn_id="t1")]
    assert text_of(await collect(model, ask(*transcript))) == "Noon."
    body = app.state.requests[1]["body"]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert body["messages"][1]["content"][0] == {"type": "redacted_thinking",
                                                 "data": redacted.data}


async def test_fake_refuses_a_tampered_or_dropped_thinking_block(make: Any) -> None:
    think = Thinking("secret reasoning")
    call = ToolUse("now", {})
    app = anthropic_app([Reply([think, call])])
    model = make(app, thinking=True)
    first = reply_message(await collect(model, ask(user("time?"))))
    answer = Message("tool", call_id=call.id, result="12:00", turn_id="t1")

    tampered = dict(first.content[0], thinking="edited reasoning")
    edited = Message("assistant", "", first.tool_calls, turn_id="t1",
                     content=(tampered, *first.content[1:]))
    with pytest.raises(ModelError, match="Invalid `signature` in `thinking` block"):
        await collect(model, ask(user("time?"), edited, answer))

    dropped = Message("assistant", "", first.tool_calls, turn_id="t1")
    with pytest.raises(ModelError, match="must start with a thinking block"):
        await collect(model, ask(user("time?"), dropped, answer))


def test_thinking_options() -> None:
    assert anthropic("claude-test", api_key="k").thinking is None
    assert anthropic("claude-test", api_key="k", thinking=True).thinking == {"type": "adaptive"}
    assert anthropic("claude-test", api_key="k", thinking=2048).thinking == {
        "type": "enabled", "budget_tokens": 2048}
    custom = {"type": "adaptive", "display": "omitted"}
    assert anthropic("claude-test", api_key="k", thinking=custom).thinking == custom
    with pytest.raises(ConfigurationError, match="thinking budget"):
        anthropic("claude-test", api_key="k", thinking=512)
    with pytest.raises(ConfigurationError, match="thinking budget"):
        anthropic("claude-test", api_key="k", thinking=9000, max_tokens=8192)


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cut_after", [0, 2, 5, 10, 13, 14])
async def test_a_cut_stream_raises_and_never_stops(make: Any, cut_after: int) -> None:
    # 0: an empty 200 body; 2: after message_start + ping; 5: inside the text block;
    # 10: inside the tool's JSON; 13: before message_delta; 14: before message_stop.
    reply = Reply([Text("Hello there, world"), ToolUse("add", {"a": 1, "b": 2})],
                  cut_after=cut_after)
    app = anthropic_app([reply])
    events: list[Any] = []
    with pytest.raises(ModelError, match="ended before message_stop") as info:
        async for ev in make(app).stream(ask(user("hi"))):
            events.append(ev)
    assert info.value.retryable and info.value.provider == "anthropic"
    assert not [e for e in events if isinstance(e, Stop)]


async def test_error_event_mid_stream_raises(make: Any) -> None:
    app = anthropic_app([Reply([Text("Hello there, world")], error_after=4)])
    events: list[Any] = []
    with pytest.raises(ModelError) as info:
        async for ev in make(app).stream(ask(user("hi"))):
            events.append(ev)
    assert str(info.value) == "anthropic: error event mid-stream: overloaded_error: Overloaded"
    assert info.value.retryable and info.value.status is None
    assert events and not [e for e in events if isinstance(e, Stop)]
    assert len(app.state.requests) == 1  # the SDK does not retry an error event


async def test_429_with_retry_after_ms_is_retried_then_succeeds(make: Any) -> None:
    app = anthropic_app([Fail(429, "Too many requests", headers={"retry-after-ms": "1"}),
                         Reply([Text("ok")])])
    events = await collect(make(app, max_retries=2), ask(user("hi")))
    assert text_of(events) == "ok" and only_stop(events).reason == "end_turn"
    counts = [r["headers"]["x-stainless-retry-count"] for r in app.state.requests]
    assert counts == ["0", "1"]


async def test_529_exhausted_fails_with_provider_and_status(make: Any) -> None:
    overloaded = Fail(529, "Overloaded", headers={"retry-after-ms": "1"})
    app = anthropic_app([overloaded, overloaded, overloaded])
    with pytest.raises(ModelError) as info:
        await collect(make(app, max_retries=2), ask(user("hi")))
    e = info.value
    assert (e.provider, e.status, e.retryable) == ("anthropic", 529, True)
    assert str(e).startswith("anthropic: HTTP 529 overloaded_error: Overloaded "
                             "(after 2 retries; request-id req_")
    assert len(app.state.requests) == 3


async def test_client_errors_are_not_retried(make: Any) -> None:
    app = anthropic_app([Fail(403, "no access", headers={"retry-after-ms": "1"}),
                         Reply([Text("never")])])
    with pytest.raises(ModelError, match=r"^anthropic: HTTP 403 permission_error: no access") \
            as info:
        await collect(make(app, max_retries=2), ask(user("hi")))
    assert not info.value.retryable and len(app.state.requests) == 1


async def test_unauthenticated_request_is_refused() -> None:
    app = anthropic_app([Reply([Text("never")])])
    model = anthropic("claude-test", api_key="", http_client=in_process(app), max_retries=0)
    try:
        with pytest.raises(ModelError, match=r"^anthropic: HTTP 401 authentication_error") \
                as info:
            await collect(model, ask(user("hi")))
    finally:
        await model.aclose()
    assert info.value.status == 401 and not info.value.retryable


def test_no_credentials_at_all_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        anthropic("claude-test")


async def test_api_key_and_base_url_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = anthropic_app([Reply([Text("ok")])])
    async with serving(app) as url:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
        model = anthropic("claude-test", max_retries=0)
        try:
            assert text_of(await collect(model, ask(user("hi")))) == "ok"
        finally:
            await model.aclose()
    assert app.state.requests[0]["headers"]["authorization"] == "Bearer sk-env"


# -- over a real socket: stalls, cut connections, cancellation -----------------------------------
#
# A ``stall_after`` stream stalls until the client goes away (the fake's default), so these tests
# hold on a slow machine: only the client's read timeout, ``aclose()`` or a cancel can end it,
# and the fake records that its body ended by a disconnect.


async def test_cut_stream_over_a_socket_raises() -> None:
    app = anthropic_app([Reply([Text("Hello there, world")], cut_after=5)])
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="k", base_url=url, max_retries=0)
        try:
            with pytest.raises(ModelError, match="ended before message_stop"):
                await collect(model, ask(user("hi")))
        finally:
            await model.aclose()


async def test_a_mid_stream_stall_hits_the_read_timeout() -> None:
    app = anthropic_app([Reply([Text("Hello there, world")], stall_after=4)])
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="k", base_url=url, max_retries=0, timeout=1.0)
        events: list[Any] = []
        try:
            with pytest.raises(ModelError, match="stalled past the read timeout") as info:
                async with asyncio.timeout(WAIT):
                    async for ev in model.stream(ask(user("hi"))):
                        events.append(ev)
        finally:
            await model.aclose()
        assert info.value.retryable
        assert [e for e in events if isinstance(e, TextDelta)]  # it stalled mid-reply
        assert not [e for e in events if isinstance(e, Stop)]
        await asyncio.wait_for(app.state.closed[0].wait(), WAIT)
        assert app.state.ended == ["disconnected"]  # the client hung up on the stall


async def test_closing_the_stream_closes_the_http_response() -> None:
    app = anthropic_app([Reply([Text("one two three four five six")], stall_after=4)])
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="k", base_url=url, max_retries=0)
        try:
            stream = model.stream(ask(user("hi")))
            first = await asyncio.wait_for(anext(stream), WAIT)
            assert isinstance(first, TextDelta)
            await asyncio.wait_for(stream.aclose(), WAIT)  # type: ignore[attr-defined]
            # The body stalls until the client goes away: it ends only if the socket closed.
            await asyncio.wait_for(app.state.closed[0].wait(), WAIT)
            assert app.state.ended == ["disconnected"]
        finally:
            await model.aclose()


async def test_connection_refused_is_a_retryable_model_error() -> None:
    async with serving(anthropic_app()) as url:
        pass  # the port is free again
    model = anthropic("claude-test", api_key="k", base_url=url, max_retries=0)
    try:
        with pytest.raises(ModelError, match=r"^anthropic: connection failed") as info:
            await collect(model, ask(user("hi")))
    finally:
        await model.aclose()
    assert info.value.retryable


def test_repr_and_request_shape() -> None:
    model = anthropic("claude-test", api_key="k", thinking=True, max_tokens=1000)
    assert repr(model) == "AnthropicModel('claude-test', thinking={'type': 'adaptive'})"
    params = model.params(ModelRequest(system="", messages=[user("hi")], tools=[]))
    assert params == {"model": "claude-test", "max_tokens": 1000,
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                      "thinking": {"type": "adaptive"}}
    assert json.dumps(params)  # plain JSON: no SDK objects


# -- through the engine ------------------------------------------------------------------------


def ops_agent(counts: dict[str, int] | None = None) -> Agent:
    seen = counts if counts is not None else {}

    def add(args: dict[str, Any], ctx: ToolContext) -> int:
        seen["add"] = seen.get("add", 0) + 1
        return int(args["a"]) + int(args["b"])

    async def weather(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        seen["weather"] = seen.get("weather", 0) + 1
        return {"city": args["city"], "sky": "sunny"}

    async def broken(args: dict[str, Any], ctx: ToolContext) -> None:
        raise RuntimeError("the sensor is offline")

    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    # No engine retries here: these tests are about what the adapter reports.
    return Agent("ops", "You are terse.", tools=[
        Tool(ADD, add), Tool(ToolSpec("weather", "Weather in a city.", city), weather),
        Tool(ToolSpec("sensor", "Read the sensor."), broken)], model_retries=0)


async def test_a_multi_tool_turn_through_the_engine(tmp_path: Path) -> None:
    add, weather = ToolUse("add", {"a": 2, "b": 40}), ToolUse("weather", {"city": "Paris"})
    sensor = ToolUse("sensor", {})
    app = anthropic_app([
        Reply([Text("Let me check both."), add, weather], cache_read_input_tokens=8),
        Reply([sensor]),
        Reply([Text("42, sunny in Paris; the sensor is offline.")]),
    ])
    counts: dict[str, int] = {}
    events: list[Any] = []
    runtime = Runtime(agents=[ops_agent(counts)], store=SqliteStore(tmp_path / "s.sqlite"),
                      model=model_for(app))
    async with runtime:
        session = runtime.session("ops", "s1")
        session.observe(events.append, turn_id="t1")
        result = await session.turn(user_text="2+40, Paris weather, and the sensor?",
                                    turn_id="t1")
        transcript = await session.transcript()
    assert (result.status, result.text) == ("completed",
                                            "42, sunny in Paris; the sensor is offline.")
    assert counts == {"add": 1, "weather": 1}
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "tool", "assistant",
                                            "tool", "assistant"]
    assert transcript[1].usage == {"input_tokens": 21, "output_tokens": 34,
                                   "cache_read_input_tokens": 8}
    second, third = (r["body"]["messages"] for r in app.state.requests[1:])
    assert second[-1] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": add.id, "content": "42"},
        {"type": "tool_result", "tool_use_id": weather.id,
         "content": '{"city": "Paris", "sky": "sunny"}'}]}
    assert third[-1] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": sensor.id,
         "content": '{"error": "RuntimeError: the sensor is offline"}', "is_error": True}]}
    types = [e.type for e in events]
    assert "message.delta" in types and types[-1] == "turn.completed"
    completed = [e for e in events if e.type == "message.completed"]
    assert [e.stop_reason for e in completed] == ["tool_use", "tool_use", "end_turn"]
    assert completed[0].usage == transcript[1].usage  # usage rides on message.completed


async def test_thinking_across_tool_use_through_the_engine(tmp_path: Path) -> None:
    first, second = Thinking("Need the sum first."), Thinking("Now the weather.")
    add, weather = ToolUse("add", {"a": 1, "b": 2}), ToolUse("weather", {"city": "Oslo"})
    app = anthropic_app([Reply([first, add]), Reply([second, Text("Also:"), weather]),
                         Reply([Thinking("Both done."), Text("3, and sunny in Oslo.")])])
    runtime = Runtime(agents=[ops_agent()], store=SqliteStore(tmp_path / "s.sqlite"),
                      model=model_for(app, thinking=True))
    async with runtime:
        session = runtime.session("ops", "s1")
        result = await session.turn(user_text="1+2 and Oslo?", turn_id="t1")
        transcript = await session.transcript()
    assert (result.status, result.text) == ("completed", "3, and sunny in Oslo.")
    # Stored verbatim (read back from SQLite) and sent back unchanged on every later call.
    stored = [list(m.content) for m in transcript if m.role == "assistant"]
    assert stored[0] == [
        {"type": "thinking", "thinking": first.thinking, "signature": first.signature},
        {"type": "tool_use", "id": add.id, "name": "add", "input": {"a": 1, "b": 2}}]
    assert stored[1][0]["signature"] == second.signature
    assert assistant_blocks(app.state.requests[1]["body"]) == stored[:1]
    assert assistant_blocks(app.state.requests[2]["body"]) == stored[:2]
    assert all(r["body"]["thinking"] == {"type": "adaptive"} for r in app.state.requests)


@pytest.mark.parametrize(("script", "error"), [
    ([Fail(529, "Overloaded", headers={"retry-after-ms": "1"})] * 3,
     "anthropic: HTTP 529 overloaded_error: Overloaded (after 2 retries; request-id req_"),
    ([Reply([Text("Hello there, world")], cut_after=5)],
     "anthropic: the stream ended before message_stop"),
    ([Reply([Text("Hello there, world")], error_after=4)],
     "anthropic: error event mid-stream: overloaded_error: Overloaded"),
])
async def test_a_failed_model_call_fails_the_turn_and_commits_nothing(
    tmp_path: Path, script: list[Any], error: str,
) -> None:
    app = anthropic_app(script)
    events: list[Any] = []
    runtime = Runtime(agents=[ops_agent()], store=SqliteStore(tmp_path / "s.sqlite"),
                      model=model_for(app, max_retries=2))
    async with runtime:
        session = runtime.session("ops", "s1")
        session.observe(events.append, turn_id="t1")
        result = await session.turn(user_text="hi", turn_id="t1")
        transcript = await session.transcript()
    assert result.status == "failed" and (result.error or "").startswith(error)
    assert [m.role for m in transcript] == ["user"]
    failed = [e for e in events if e.type == "turn.failed"]
    assert len(failed) == 1 and failed[0].error.startswith(error)


async def test_thinking_survives_a_sigkill_and_a_replay_in_a_new_process(tmp_path: Path) -> None:
    think = Thinking("The disk check needs the probe tool.")
    probe = ToolUse("probe", {"path": "/"})
    app = anthropic_app([Reply([think, Text("Checking."), probe]),
                         Reply([Text("The disk is fine: 81% free.")])])
    child = Path(__file__).parents[1] / "fakes" / "thinking_child.py"
    db = tmp_path / "s.sqlite"

    async def deliver(url: str, mode: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(child), str(db), url, "turn-1", mode,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode() + err.decode()

    async with serving(app) as url:
        code, output = await deliver(url, "crash")
        assert code == -signal.SIGKILL, output
        assert len(app.state.requests) == 1  # the thinking step committed, then the kill
        code, output = await deliver(url, "replay")
        assert code == 0, output
    result = json.loads(output.strip().splitlines()[-1])
    assert result == {"status": "completed", "text": "The disk is fine: 81% free.",
                      "error": None}
    assert len(app.state.requests) == 2  # the replay did not call the model for step 1 again
    replayed = app.state.requests[1]["body"]["messages"]
    assert replayed[1] == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": think.thinking, "signature": think.signature},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": probe.id, "name": "probe", "input": {"path": "/"}}]}
    assert replayed[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": probe.id,
         "content": '{"path": "/", "free": "81%"}'}]}


async def test_cancelling_a_turn_closes_the_model_stream(tmp_path: Path) -> None:
    app = anthropic_app([Reply([Text("one two three four five six")], stall_after=4)])
    streaming = asyncio.Event()

    def on_event(e: TurnEvent) -> None:
        if e.type == "message.delta":
            streaming.set()

    async with serving(app) as url:
        model = anthropic("claude-test", api_key="k", base_url=url, max_retries=0)
        async with Runtime(agents=[ops_agent()], store=SqliteStore(tmp_path / "s.sqlite"),
                           model=model) as runtime:
            session = runtime.session("ops", "s1")
            session.observe(on_event, turn_id="t1")
            await session.start(user_text="count slowly", turn_id="t1")
            await asyncio.wait_for(streaming.wait(), WAIT)  # open, and stalled mid-reply
            await session.cancel("t1", reason="the user left")
            # The stall never ends by itself: the turn ends only if the cancel cut the stream.
            result = await asyncio.wait_for(session.result("t1"), WAIT)
            await asyncio.wait_for(app.state.closed[0].wait(), WAIT)
            assert app.state.ended == ["disconnected"]
            transcript = await session.transcript()
        await model.aclose()
    assert (result.status, result.reason) == ("cancelled", "the user left")
    assert [m.role for m in transcript] == ["user"]
