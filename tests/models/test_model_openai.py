"""The OpenAI-compatible adapter against a fake chat completions API (F11).

The fake speaks the real ``chat.completion.chunk`` protocol and reproduces what local servers
(Ollama, vLLM, llama.cpp) do differently; see ``fakes/openai_api.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai as sdk
import pytest

from durable_turns import Agent, Runtime, SqliteStore, Tool, ToolContext
from durable_turns.errors import ConfigurationError, ModelError
from durable_turns.messages import Message, ToolCall
from durable_turns.models import ModelRequest, Stop, TextDelta, ThinkingDelta
from durable_turns.models.openai_compat import OpenAICompatibleModel, openai_compatible
from durable_turns.tools import ToolSpec
from fakes import clear_provider_env, collect
from fakes.openai_api import Call, Completion, Fail, openai_app
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


@pytest.fixture
async def make() -> AsyncIterator[Any]:
    """``make(app, **kw)`` → an in-process model on ``app``, closed after the test."""
    made: list[OpenAICompatibleModel] = []

    def build(app: Any, **kw: Any) -> OpenAICompatibleModel:
        kw.setdefault("max_retries", 0)
        made.append(openai_compatible("gpt-test", api_key="sk-test",
                                      base_url="http://fake/v1", http_client=in_process(app),
                                      **kw))
        return made[-1]

    yield build
    for m in made:
        await m.aclose()


def ask(*messages: Message, system: str = "Be brief.",
        tools: tuple[ToolSpec, ...] = (ADD, NOW)) -> ModelRequest:
    return ModelRequest(system=system, messages=list(messages), tools=list(tools), turn_id="t1")


def user(text: str) -> Message:
    return Message("user", text, turn_id="t1")


def text_of(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def calls_of(events: list[Any]) -> list[ToolCall]:
    return [e for e in events if isinstance(e, ToolCall)]


def only_stop(events: list[Any]) -> Stop:
    stops: list[Stop] = [e for e in events if isinstance(e, Stop)]
    assert len(stops) == 1 and isinstance(events[-1], Stop)  # exactly one, and last
    return stops[0]


# -- the fake itself, checked by the SDK -------------------------------------------------------


@pytest.mark.parametrize("finish", ["stop", "tool_calls", "length", "content_filter"])
async def test_the_fake_passes_the_sdks_strict_validation(finish: str) -> None:
    # The SDK's own accumulator, with strict validation, puts the fake's chunks together.
    call = Call("add", {"a": 1, "b": 2})
    app = openai_app([Completion("Hi there.", calls=[call], finish_reason=finish,
                                 cached_tokens=3)])
    client = sdk.AsyncOpenAI(api_key="k", base_url="http://fake/v1",
                             http_client=in_process(app), max_retries=0,
                             _strict_response_validation=True)
    snapshot = None
    try:
        async with client.chat.completions.stream(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}],
            stream_options={"include_usage": True},
        ) as stream:
            async for _ in stream:
                snapshot = stream.current_completion_snapshot
    finally:
        await client.close()
    assert snapshot is not None
    choice = snapshot.choices[0]
    assert (choice.finish_reason, choice.message.content) == (finish, "Hi there.")
    assert [(c.id, c.function.name, c.function.arguments)
            for c in choice.message.tool_calls or []] == [(call.id, "add", '{"a": 1, "b": 2}')]
    assert snapshot.usage is not None and snapshot.usage.prompt_tokens == 17


# -- happy paths -------------------------------------------------------------------------------


async def test_text_reply_streams_deltas_with_usage(make: Any) -> None:
    app = openai_app([Completion("Hello there, how are you?", cached_tokens=4)])
    events = await collect(make(app), ask(user("hi")))
    assert len([e for e in events if isinstance(e, TextDelta)]) == 3
    assert text_of(events) == "Hello there, how are you?"
    assert only_stop(events) == Stop("end_turn", {"input_tokens": 17, "output_tokens": 9,
                                                  "cache_read_input_tokens": 4})
    sent = app.state.requests[0]
    assert sent["headers"]["authorization"] == "Bearer sk-test"
    body = sent["body"]
    assert body["model"] == "gpt-test" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "hi"}]
    assert body["tools"][0] == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.", "parameters": dict(ADD.input)}}


async def test_tool_call_fragments_are_joined_by_index(make: Any) -> None:
    a = Call("add", {"a": 2, "b": 40, "note": "x" * 40})
    b = Call("now", {})
    app = openai_app([Completion("Checking.", calls=[a, b])])
    events = await collect(make(app), ask(user("2+40, and the time?")))
    assert calls_of(events) == [ToolCall(str(a.id), "add", dict(a.arguments)),  # type: ignore[arg-type]
                                ToolCall(str(b.id), "now", {})]
    assert only_stop(events).reason == "tool_use"
    assert text_of(events) == "Checking."


async def test_a_whole_call_in_one_delta(make: Any) -> None:
    call = Call("add", {"a": 1, "b": 2})
    app = openai_app([Completion(calls=[call], whole_calls=True)])
    events = await collect(make(app), ask(user("1+2")))
    assert calls_of(events) == [ToolCall(str(call.id), "add", {"a": 1, "b": 2})]
    assert only_stop(events).reason == "tool_use"


async def test_finish_reason_stop_after_tool_calls_still_means_tool_use(make: Any) -> None:
    call = Call("now", {})
    app = openai_app([Completion(calls=[call], finish_reason="stop")])
    events = await collect(make(app), ask(user("time?")))
    assert calls_of(events) == [ToolCall(str(call.id), "now", {})]
    assert only_stop(events).reason == "tool_use"


async def test_calls_without_ids_get_unique_ones(make: Any) -> None:
    app = openai_app([Completion(calls=[Call("now", "", id=None), Call("add", {"a": 1, "b": 1},
                                                                        id=None)])])
    events = await collect(make(app), ask(user("go")))
    calls = calls_of(events)
    assert [(c.name, c.input) for c in calls] == [("now", {}), ("add", {"a": 1, "b": 1})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


def _choice(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    return {"choices": [choice]}


async def test_servers_that_bend_the_chunk_format(make: Any) -> None:
    # Every call at index 0 told apart by its id; arguments sent as an object, not text; a
    # final chunk with no delta; a call with no index at all.
    def call(cid: str | None, name: str, args: Any, index: int | None = 0) -> dict[str, Any]:
        tc: dict[str, Any] = {"function": {"name": name, "arguments": args}}
        if index is not None:
            tc["index"] = index
        if cid is not None:
            tc.update(id=cid, type="function")
        return {"tool_calls": [tc]}

    raw = [_choice({"role": "assistant", "content": ""}),
           _choice(call("c1", "now", "{}")),
           _choice(call("c2", "add", {"a": 1, "b": 2})),
           _choice(call("c3", "now", "", index=None)),
           _choice(None, "tool_calls")]
    app = openai_app([Completion(raw=raw)])
    events = await collect(make(app), ask(user("go")))
    assert calls_of(events) == [ToolCall("c1", "now", {}), ToolCall("c2", "add", {"a": 1, "b": 2}),
                                ToolCall("c3", "now", {})]
    assert only_stop(events).reason == "tool_use"


@pytest.mark.parametrize(("finish", "reason"), [("length", "max_tokens"),
                                                ("content_filter", "content_filter"),
                                                ("stop", "end_turn")])
async def test_finish_reasons_map_to_stop_reasons(make: Any, finish: str, reason: str) -> None:
    app = openai_app([Completion("partial", finish_reason=finish)])
    events = await collect(make(app), ask(user("hi")))
    assert only_stop(events).reason == reason and text_of(events) == "partial"


async def test_an_empty_length_stop_still_yields_its_stop(make: Any) -> None:
    # The engine, not the adapter, fails an empty abnormal reply (ABNORMAL_STOPS).
    app = openai_app([Completion(finish_reason="content_filter", usage=False)])
    assert await collect(make(app), ask(user("hi"))) == [Stop("content_filter", {})]


async def test_a_call_cut_by_length_is_dropped(make: Any) -> None:
    app = openai_app([Completion("Adding", calls=[Call("add", '{"a": 1, "b"')],
                                 finish_reason="length")])
    events = await collect(make(app), ask(user("1+?")))
    assert calls_of(events) == [] and only_stop(events).reason == "max_tokens"


async def test_unparseable_arguments_without_length_fail(make: Any) -> None:
    app = openai_app([Completion(calls=[Call("add", '{"a": 1,')])])
    with pytest.raises(ModelError, match="not a JSON object"):
        await collect(make(app), ask(user("1+?")))


async def test_a_refusal_is_text_with_reason_refusal(make: Any) -> None:
    app = openai_app([Completion(refusal="I can't help with that.")])
    events = await collect(make(app), ask(user("bad")))
    assert text_of(events) == "I can't help with that."
    assert only_stop(events).reason == "refusal"


async def test_reasoning_content_is_thinking_not_text(make: Any) -> None:
    app = openai_app([Completion("42", reasoning="Two plus forty is forty-two.")])
    events = await collect(make(app), ask(user("2+40?")))
    assert "".join(e.text for e in events if isinstance(e, ThinkingDelta)) == \
        "Two plus forty is forty-two."
    assert text_of(events) == "42"
    assert only_stop(events).content == ()


async def test_no_usage_chunk_and_no_done_line_still_finish(make: Any) -> None:
    app = openai_app([Completion("ok", usage=False, done=False)])
    events = await collect(make(app, include_usage=False), ask(user("hi")))
    assert only_stop(events) == Stop("end_turn", {})
    assert "stream_options" not in app.state.requests[0]["body"]


# -- transcript → request ----------------------------------------------------------------------


async def test_transcript_is_sent_as_chat_messages(make: Any) -> None:
    calls = (ToolCall("call_1", "add", {"a": 1, "b": 2}), ToolCall("call_2", "now", {}))
    transcript = [
        Message("trigger", "daily report", turn_id="t0", by="cron:daily"),
        Message("assistant", "Done.", turn_id="t0"),
        user("add 1 and 2, and tell me the time"),
        Message("assistant", "", calls, turn_id="t1"),
        Message("tool", call_id="call_1", result=3, turn_id="t1"),
        Message("tool", call_id="call_2", result={"error": "RuntimeError: no clock"},
                is_error=True, turn_id="t1"),
    ]
    app = openai_app([Completion("3; no clock.")])
    await collect(make(app), ask(*transcript, system=""))
    assert app.state.requests[0]["body"]["messages"] == [
        {"role": "user", "content": "daily report"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "add 1 and 2, and tell me the time"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
            {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "tool", "tool_call_id": "call_2",
         "content": '{"error": "RuntimeError: no clock"}'},
    ]


async def test_fake_refuses_tool_calls_without_tool_messages(make: Any) -> None:
    transcript = [user("x"), Message("assistant", "", (ToolCall("call_9", "now", {}),),
                                     turn_id="t1"), user("well?")]
    app = openai_app([Completion("never")])
    with pytest.raises(ModelError, match="did not have response messages: call_9") as info:
        await collect(make(app), ask(*transcript))
    assert info.value.status == 400 and not info.value.retryable


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cut_after", [0, 1, 3, 6, 8])
async def test_a_cut_stream_raises_and_never_stops(make: Any, cut_after: int) -> None:
    # 0: empty body; 1: after the role chunk; 3: inside the text; 6: inside the call's
    # arguments; 8: after the last fragment, before the finish_reason chunk.
    c = Completion("Hello there", calls=[Call("add", {"a": 1, "b": 2})], cut_after=cut_after)
    app = openai_app([c])
    events: list[Any] = []
    with pytest.raises(ModelError, match="ended without a finish_reason") as info:
        async for ev in make(app).stream(ask(user("hi"))):
            events.append(ev)
    assert info.value.retryable and info.value.provider == "openai"
    assert not [e for e in events if isinstance(e, Stop | ToolCall)]


async def test_a_cut_after_the_finish_reason_keeps_the_reply_without_usage(make: Any) -> None:
    # The SDK hides whether [DONE] came; finish_reason is the terminal event we can see.
    c = Completion("Hello there", calls=[Call("add", {"a": 1, "b": 2})], cut_after=9)
    events = await collect(make(openai_app([c])), ask(user("hi")))
    assert only_stop(events) == Stop("tool_use", {})
    assert [c.name for c in calls_of(events)] == ["add"]


async def test_an_error_object_mid_stream_raises(make: Any) -> None:
    app = openai_app([Completion("Hello there, world", error_after=3)])
    events: list[Any] = []
    with pytest.raises(ModelError) as info:
        async for ev in make(app).stream(ask(user("hi"))):
            events.append(ev)
    assert str(info.value) == ("openai: error object mid-stream: server_error: The server had "
                               "an error while processing your request.")
    assert info.value.retryable and info.value.status is None
    assert events and not [e for e in events if isinstance(e, Stop)]
    assert len(app.state.requests) == 1


async def test_429_with_retry_after_ms_is_retried_then_succeeds(make: Any) -> None:
    app = openai_app([Fail(429, "Rate limit reached", "requests", "rate_limit_exceeded",
                           headers={"retry-after-ms": "1"}),
                      Completion("ok")])
    events = await collect(make(app, max_retries=2), ask(user("hi")))
    assert text_of(events) == "ok"
    counts = [r["headers"]["x-stainless-retry-count"] for r in app.state.requests]
    assert counts == ["0", "1"]


async def test_5xx_exhausted_fails_with_provider_and_status(make: Any) -> None:
    down = Fail(503, "Service unavailable", headers={"retry-after-ms": "1"})
    app = openai_app([down, down, down])
    with pytest.raises(ModelError) as info:
        await collect(make(app, max_retries=2), ask(user("hi")))
    e = info.value
    assert (e.provider, e.status, e.retryable) == ("openai", 503, True)
    assert str(e) == "openai: HTTP 503 server_error: Service unavailable (after 2 retries)"
    assert len(app.state.requests) == 3


async def test_a_missing_key_is_refused_with_401() -> None:
    app = openai_app([Completion("never")])
    model = openai_compatible("gpt-test", api_key=" ", base_url="http://fake/v1",
                              http_client=in_process(app), max_retries=0)
    try:
        with pytest.raises(ModelError, match=r"^openai: HTTP 401 invalid_request_error"):
            await collect(model, ask(user("hi")))
    finally:
        await model.aclose()


def test_key_rules() -> None:
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        openai_compatible("gpt-4o")  # OpenAI itself needs a key
    local = openai_compatible("llama3.1", base_url="http://127.0.0.1:11434/v1")
    assert local.client.api_key == "unused"  # a local server takes any key
    assert repr(local) == ("OpenAICompatibleModel('llama3.1', "
                           "base_url='http://127.0.0.1:11434/v1/')")


async def test_key_and_base_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    app = openai_app([Completion("ok")])
    async with serving(app) as url:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        monkeypatch.setenv("OPENAI_BASE_URL", f"{url}/v1")
        model = openai_compatible("gpt-test", max_retries=0)
        try:
            assert text_of(await collect(model, ask(user("hi")))) == "ok"
        finally:
            await model.aclose()
    assert app.state.requests[0]["headers"]["authorization"] == "Bearer sk-env"


# -- over a real socket --------------------------------------------------------------------------
#
# A ``stall_after`` stream stalls until the client goes away (the fake's default): only the
# client's read timeout or ``aclose()`` can end it, and the fake records the disconnect.


async def test_cut_stream_over_a_socket_raises() -> None:
    app = openai_app([Completion("Hello there, world", cut_after=3)])
    async with serving(app) as url:
        model = openai_compatible("gpt-test", api_key="k", base_url=f"{url}/v1", max_retries=0)
        try:
            with pytest.raises(ModelError, match="ended without a finish_reason"):
                await collect(model, ask(user("hi")))
        finally:
            await model.aclose()


async def test_a_mid_stream_stall_hits_the_read_timeout() -> None:
    app = openai_app([Completion("Hello there, world", stall_after=3)])
    async with serving(app) as url:
        model = openai_compatible("gpt-test", api_key="k", base_url=f"{url}/v1",
                                  max_retries=0, timeout=1.0)
        events: list[Any] = []
        try:
            with pytest.raises(ModelError, match="stalled past the read timeout") as info:
                async with asyncio.timeout(WAIT):
                    async for ev in model.stream(ask(user("hi"))):
                        events.append(ev)
        finally:
            await model.aclose()
        assert info.value.retryable
        assert [e for e in events if isinstance(e, TextDelta)]
        assert not [e for e in events if isinstance(e, Stop)]
        await asyncio.wait_for(app.state.closed[0].wait(), WAIT)
        assert app.state.ended == ["disconnected"]  # the client hung up on the stall


async def test_closing_the_stream_closes_the_http_response() -> None:
    app = openai_app([Completion("one two three four five six", stall_after=2)])
    async with serving(app) as url:
        model = openai_compatible("gpt-test", api_key="k", base_url=f"{url}/v1", max_retries=0)
        try:
            stream = model.stream(ask(user("hi")))
            assert isinstance(await asyncio.wait_for(anext(stream), WAIT), TextDelta)
            await asyncio.wait_for(stream.aclose(), WAIT)  # type: ignore[attr-defined]
            # The body stalls until the client goes away: it ends only if the socket closed.
            await asyncio.wait_for(app.state.closed[0].wait(), WAIT)
            assert app.state.ended == ["disconnected"]
        finally:
            await model.aclose()


async def test_connection_refused_is_a_retryable_model_error() -> None:
    async with serving(openai_app()) as url:
        pass
    model = openai_compatible("gpt-test", api_key="k", base_url=f"{url}/v1", max_retries=0)
    try:
        with pytest.raises(ModelError, match=r"^openai: connection failed") as info:
            await collect(model, ask(user("hi")))
    finally:
        await model.aclose()
    assert info.value.retryable


# -- through the engine ------------------------------------------------------------------------


async def test_a_multi_tool_turn_through_the_engine(tmp_path: Path) -> None:
    calls = {"add": 0, "now": 0}

    def add(args: dict[str, Any], ctx: ToolContext) -> int:
        calls["add"] += 1
        return int(args["a"]) + int(args["b"])

    async def now(args: dict[str, Any], ctx: ToolContext) -> str:
        calls["now"] += 1
        return "12:00"

    a, b = Call("add", {"a": 2, "b": 40}), Call("now", {}, id=None)
    app = openai_app([Completion("Checking.", calls=[a, b], finish_reason="stop",
                                 whole_calls=True),
                      Completion("42, at 12:00.")])
    agent = Agent("ops", "You are terse.", tools=[Tool(ADD, add), Tool(NOW, now)],
                  model_retries=0)  # what the adapter reports, without engine retries
    model = openai_compatible("llama3.1", base_url="http://fake/v1", max_retries=0,
                              http_client=in_process(app))
    async with Runtime(agents=[agent], store=SqliteStore(tmp_path / "s.sqlite"),
                       model=model) as runtime:
        session = runtime.session("ops", "s1")
        result = await session.turn(user_text="2+40, and the time?", turn_id="t1")
        transcript = await session.transcript()
    assert (result.status, result.text) == ("completed", "42, at 12:00.")
    assert calls == {"add": 1, "now": 1}
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "tool", "assistant"]
    minted = transcript[1].tool_calls[1].id  # the server sent no id: one was made and kept
    assert app.state.requests[1]["body"]["messages"][2:] == [
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": a.id, "type": "function",
             "function": {"name": "add", "arguments": '{"a": 2, "b": 40}'}},
            {"id": minted, "type": "function", "function": {"name": "now", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": a.id, "content": "42"},
        {"role": "tool", "tool_call_id": minted, "content": "12:00"},
    ]
    assert app.state.requests[0]["headers"]["authorization"] == "Bearer unused"
