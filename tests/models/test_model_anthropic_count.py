"""F23 with the Anthropic adapter's ``count_tokens`` (the Messages API's count endpoint), on
a fake API that speaks its real wire protocol and counts with a tokenizer denser than the
engine's estimate: with the count, every request stays under the window; without it, the
estimate misses and the provider refuses.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durable_turns import Agent, Compaction, MemoryStore, Runtime, TokenCounter, tool
from durable_turns.compaction import DEFAULT_INSTRUCTIONS
from durable_turns.errors import ModelError
from durable_turns.messages import Message, ToolCall
from durable_turns.model import ModelEvent, ModelRequest
from durable_turns.models.anthropic_messages import AnthropicModel, anthropic
from durable_turns.tools import ToolSpec
from fakes import clear_provider_env
from fakes.anthropic_api import Fail, Reply, Text, ToolUse, anthropic_app
from fakes.serving import serving

WAIT = 60.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""
WINDOW = 6000
"""The fake provider's window, in its own tokens."""
NOW = ToolSpec("now", "The current time.")


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clear_provider_env(monkeypatch, tmp_path)


def dense(body: dict[str, Any]) -> int:
    """The fake's tokenizer: one token per character (the engine estimates four)."""
    return len(json.dumps(body))


async def test_count_tokens_asks_the_count_endpoint_with_the_request_it_would_send() -> None:
    app = anthropic_app(count=dense)
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0)
        request = ModelRequest("You tell the time.", [
            Message("user", "What time is it?"),
            Message("assistant", "", (ToolCall("toolu_1", "now", {}),)),
            Message("tool", call_id="toolu_1", result="12:00")], [NOW])
        assert isinstance(model, TokenCounter)
        counted = await model.count_tokens(request)
        broken = ModelRequest("", [Message("assistant", "hello")], [])
        with pytest.raises(ModelError) as refused:
            await model.count_tokens(broken)
        await model.aclose()
    (body, _) = app.state.counted
    expected = {k: v for k, v in model.params(request).items() if k != "max_tokens"}
    assert body == expected and counted == dense(expected)
    assert refused.value.status == 400 and "first message must use" in str(refused.value)
    assert app.state.requests == []  # no reply was asked for


@tool
async def lookup(n: int) -> str:
    """A page of the manual."""
    return f"page {n}: " + "abc " * 600


def provider(summaries: list[str]) -> Any:
    def answer(body: dict[str, Any]) -> Reply | Fail:
        tokens = dense(body)
        if tokens > WINDOW:
            return Fail(400, f"prompt is too long: {tokens} tokens > {WINDOW} maximum",
                        error_type="invalid_request_error")
        last = body["messages"][-1]["content"]
        blocks = [{"type": "text", "text": last}] if isinstance(last, str) else last
        if any(DEFAULT_INSTRUCTIONS in b.get("text", "") for b in blocks):
            summaries.append(json.dumps(body))
            return Reply([Text(f"summary {len(summaries)}")], input_tokens=tokens)
        if any(b["type"] == "tool_result" for b in blocks):
            return Reply([Text("read it")], input_tokens=tokens)
        return Reply([ToolUse("lookup", {"n": len(body["messages"])})], input_tokens=tokens)

    return answer


class Uncounted:
    """The same model without its ``count_tokens``: the engine has only its estimate."""

    def __init__(self, model: AnthropicModel) -> None:
        self.inner = model

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        return self.inner.stream(request)


async def _session(counted: bool) -> tuple[Any, list[Any]]:
    summaries: list[str] = []
    app = anthropic_app([provider(summaries)] * 200, count=dense)
    async with serving(app) as url:
        sdk_model = anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0)
        model: Any = sdk_model if counted else Uncounted(sdk_model)
        agent = Agent("desk", "You read the manual.", [lookup], model=model,
                      context=Compaction(trigger_tokens=WINDOW * 3 // 4, keep_recent=4))
        async with Runtime([agent], MemoryStore()) as rt:
            s = rt.session("desk", "s1")
            for i in range(10):
                done = await asyncio.wait_for(s.turn(f"read page {i}"), WAIT)
                assert done.status == "completed", done.error
            events = await s.events()
        await sdk_model.aclose()
    return app, [e for e in events if e.type == "context.compacted"]


async def test_with_the_provider_s_count_no_request_is_over_the_window() -> None:
    app, compacted = await _session(counted=True)
    sent = [dense(r["body"]) for r in app.state.requests]
    assert max(sent) <= WINDOW  # never refused: the count saw what the estimate does not
    assert compacted and app.state.counted
    # The compaction's before and after are the provider's counts, not the estimate.
    counts = {dense(b) for b in app.state.counted}
    assert all(e.to_dict()["tokens_before"] in counts and e.to_dict()["tokens_after"] in counts
               for e in compacted)


async def test_without_the_count_the_estimate_misses_and_the_provider_refuses() -> None:
    app, _ = await _session(counted=False)
    refused = [r for r in app.state.requests if dense(r["body"]) > WINDOW]
    assert refused and app.state.counted == []
