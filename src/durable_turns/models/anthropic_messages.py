"""The Anthropic adapter (F11): the Messages API, streamed, on the official ``anthropic`` SDK.

It reads the raw event stream (``messages.create(stream=True)``) and puts the reply together
itself, because the SDK's helpers do not notice a truncated stream: a body that ends before
``message_stop`` comes back as a "final" message with no stop reason. Here that is a
:class:`~durable_turns.errors.ModelError`, never a :class:`Stop`, so a half reply is never
checkpointed.

Thinking: when a reply has ``thinking`` or ``redacted_thinking`` blocks, its whole content
(thinking with its signature, text, tool uses, in the provider's order) goes on
``Stop.content``; the engine stores it verbatim with the assistant message and this adapter
sends it back unchanged on the next call, which is what the API requires to continue a
tool-use loop with thinking on, including after a crash and a replay in another process.

Structured output (F25): a turn's output schema (``ModelRequest.output``) goes as
``output_config.format`` (``json_schema``), the schema made the API's dialect by the SDK's
``transform_schema`` (objects closed, unsupported constraints moved into descriptions); the
engine validates the answer against the schema as given. ``structured_output=False`` leaves
it to the system prompt instead.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    import anthropic as sdk
    import httpx2
except ImportError as e:  # pragma: no cover - exercised by test_resolve with a hidden SDK
    raise ImportError(
        "durable_turns.models.anthropic needs the Anthropic SDK: "
        "pip install 'durable-turns[anthropic]'"
    ) from e

from ..errors import ConfigurationError, ModelError
from ..messages import Message, ToolCall
from ..model import ModelEvent, ModelRequest, Stop, TextDelta, ThinkingDelta
from ..tools import ToolSpec
from ._sdk_errors import translate

PROVIDER = "anthropic"
DEFAULT_MAX_TOKENS = 8192

_THINKING = ("thinking", "redacted_thinking")
_ECHOABLE = frozenset({"text", "tool_use", *_THINKING})
_RETRYABLE_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error"})
_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
               "cache_read_input_tokens")


class AnthropicModel:
    """A :class:`~durable_turns.model.Model` on Anthropic's streaming Messages API.

    Build it with :func:`anthropic`. Each ``stream()`` call is one HTTP request; closing the
    stream early (a cancelled turn) closes the HTTP response at once.
    """

    def __init__(
        self,
        client: sdk.AsyncAnthropic,
        model: str,
        *,
        max_tokens: int,
        thinking: Mapping[str, Any] | None,
        structured_output: bool = True,
    ) -> None:
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.thinking = dict(thinking) if thinking else None
        self.structured_output = structured_output
        """Whether a turn's output schema is sent as ``output_config.format`` (the engine
        reads it: else the schema is asked for in the system prompt)."""

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r}, thinking={self.thinking!r})"

    async def aclose(self) -> None:
        """Close the SDK client and its connections."""
        await self.client.close()

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The ``messages.create`` arguments for ``request`` (without ``stream``)."""
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": to_messages(request.messages),
        }
        if request.system:
            params["system"] = request.system
        if request.tools:
            params["tools"] = [to_tool(s) for s in request.tools]
        if self.thinking:
            params["thinking"] = self.thinking
        if request.output is not None and self.structured_output:
            params["output_config"] = {"format": {"type": "json_schema",
                                                  "schema": _output_schema(request.output)}}
        return params

    async def count_tokens(self, request: ModelRequest) -> int:
        """The input tokens of ``request``, counted by the API's ``count_tokens`` endpoint
        (:class:`~durable_turns.model.TokenCounter`, F23): free of charge, no reply made.

        Raises:
            ModelError: the count failed (translated as a model call's failure is).
        """
        params = self.params(request)
        del params["max_tokens"]  # (the endpoint refuses it)
        try:
            got = await self.client.messages.count_tokens(**params)
        except (sdk.AnthropicError, httpx2.TransportError, ValueError) as e:
            raise translate(PROVIDER, sdk, e, midstream="error event",
                            retryable_types=_RETRYABLE_TYPES) from e
        return got.input_tokens

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        params = self.params(request)
        reply = _Reply()
        try:
            async with await self.client.messages.create(**params, stream=True) as events:
                async for event in events:
                    for out in reply.feed(event):
                        yield out
        except (sdk.AnthropicError, httpx2.TransportError, ValueError) as e:
            raise translate(PROVIDER, sdk, e, midstream="error event",
                            retryable_types=_RETRYABLE_TYPES) from e
        yield reply.stop()


def anthropic(
    model: str,
    *,
    thinking: bool | int | Mapping[str, Any] = False,
    api_key: str | None = None,
    base_url: str | None = None,
    max_retries: int = 2,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    timeout: float | httpx2.Timeout | None = None,
    http_client: httpx2.AsyncClient | None = None,
    client: sdk.AsyncAnthropic | None = None,
    structured_output: bool = True,
) -> AnthropicModel:
    """An Anthropic model on the official SDK.

    Args:
        model: the model id, e.g. ``"claude-sonnet-4-5"``.
        thinking: ``True`` for adaptive thinking (``{"type": "adaptive"}``), an ``int`` for a
            fixed budget (``{"type": "enabled", "budget_tokens": n}``, older models), or the
            API's ``thinking`` object as a mapping. Thinking blocks are stored with the
            transcript and echoed back, so it works across tool use and replays.
        api_key: else the SDK's environment (``ANTHROPIC_API_KEY``, …).
        base_url: else ``ANTHROPIC_BASE_URL``, else the public API.
        max_retries: SDK retries of 408/409/429/5xx/529 and connection errors, honouring
            ``retry-after``; when they run out the model step fails without committing.
        max_tokens: the reply's token limit (thinking counts toward it).
        timeout: seconds (or an ``httpx2.Timeout``); a stream idle for longer than the read
            timeout fails the step.
        http_client: an ``httpx2.AsyncClient`` for the SDK (proxies, tests).
        client: a ready ``AsyncAnthropic`` (or Bedrock/Vertex variant); the connection
            arguments above must then be left unset.
        structured_output: send a turn's output schema (``turn(output=…)``) as the API's
            structured output (``output_config.format``); ``False`` asks for it in the system
            prompt instead (a model or gateway without structured outputs).

    Raises:
        ConfigurationError: contradictory arguments, or no credentials anywhere.
    """
    if client is not None:
        if api_key or base_url or timeout is not None or http_client is not None:
            raise ConfigurationError(
                "anthropic(): pass either client= or api_key/base_url/timeout/http_client"
            )
    else:
        options: dict[str, Any] = {"max_retries": max_retries}
        if api_key is not None:
            options["api_key"] = api_key
        if base_url is not None:
            options["base_url"] = base_url
        if timeout is not None:
            options["timeout"] = timeout
        if http_client is not None:
            options["http_client"] = http_client
        try:
            client = sdk.AsyncAnthropic(**options)
        except sdk.AnthropicError as e:  # a broken credentials profile, for one
            raise ConfigurationError(f"{PROVIDER}: {e}") from e
        if client.api_key is None and client.auth_token is None and client.credentials is None:
            # The SDK would only notice at the first request, with a TypeError.
            raise ConfigurationError(
                f"{PROVIDER}: no credentials: pass api_key=, or set ANTHROPIC_API_KEY"
            )
    config: dict[str, Any] | None
    if thinking is True:
        config = {"type": "adaptive"}
    elif thinking is False or thinking is None:
        config = None
    elif isinstance(thinking, int):
        if not 1024 <= thinking < max_tokens:
            raise ConfigurationError(
                f"anthropic(): a thinking budget must be ≥ 1024 and below max_tokens "
                f"({max_tokens}); got {thinking}"
            )
        config = {"type": "enabled", "budget_tokens": thinking}
    else:
        config = dict(thinking)
    return AnthropicModel(client, model, max_tokens=max_tokens, thinking=config,
                          structured_output=structured_output)


# -- request: our transcript → the Messages API --------------------------------------------------


def _output_schema(schema: dict[str, Any]) -> dict[str, Any]:
    try:
        return sdk.transform_schema(schema)
    except (ValueError, TypeError) as e:
        raise ModelError(
            f"{PROVIDER}: the output schema cannot be sent as structured output ({e}); "
            "build the model with anthropic(..., structured_output=False) to ask for it in "
            "the system prompt", provider=PROVIDER) from e


def to_tool(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description,
            "input_schema": dict(spec.input)}


def _result_text(m: Message) -> str:
    return m.result if isinstance(m.result, str) else json.dumps(m.result, ensure_ascii=False)


def _assistant_blocks(m: Message) -> list[dict[str, Any]]:
    stored = [dict(b) for b in m.content]
    if any(b.get("type") in _THINKING for b in stored) and all(
        b.get("type") in _ECHOABLE for b in stored
    ):
        return stored  # verbatim: thinking signatures must come back unchanged
    blocks: list[dict[str, Any]] = []
    if m.text:
        blocks.append({"type": "text", "text": m.text})
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}
               for c in m.tool_calls]
    return blocks


def to_messages(transcript: list[Message]) -> list[dict[str, Any]]:
    """Our message log as Messages API ``messages``.

    ``trigger`` messages go as user messages; the tool messages answering one assistant
    message become one user message of ``tool_result`` blocks (``is_error`` for errors);
    consecutive messages of one role are merged, as the API expects alternating roles.
    """
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in transcript:
        if m.role in ("user", "trigger"):
            add("user", [{"type": "text", "text": m.text}] if m.text else [])
        elif m.role == "assistant":
            add("assistant", _assistant_blocks(m))
        elif m.role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.call_id}
            text = _result_text(m)
            if text:
                block["content"] = text
            if m.is_error:
                block["is_error"] = True
            add("user", [block])
    return out


# -- reply: the event stream → our events ------------------------------------------------------


@dataclass
class _Block:
    type: str
    data: dict[str, Any]
    json: list[str] = field(default_factory=list)
    bad_json: str | None = None


@dataclass
class _Reply:
    """Puts one streamed message together and says whether it finished."""

    blocks: dict[int, _Block] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    stop_reason: str | None = None
    finished: bool = False

    def _usage(self, usage: Any) -> None:
        for key in _USAGE_KEYS:
            value = getattr(usage, key, None)
            if isinstance(value, int):
                self.usage[key] = value

    def feed(self, event: Any) -> list[ModelEvent]:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self._usage(event.message.usage)
        elif kind == "content_block_start":
            return self._start(event.index, event.content_block)
        elif kind == "content_block_delta":
            return self._delta(event.index, event.delta)
        elif kind == "content_block_stop":
            return self._stop(event.index)
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason
            self._usage(event.usage)  # cumulative: it overwrites message_start's counts
        elif kind == "message_stop":
            self.finished = True
        return []

    def _start(self, index: int, block: Any) -> list[ModelEvent]:
        kind = getattr(block, "type", None)
        if kind == "text":
            self.blocks[index] = _Block("text", {"type": "text", "text": block.text})
            return [TextDelta(block.text)] if block.text else []
        if kind == "tool_use":
            self.blocks[index] = _Block("tool_use", {"type": "tool_use", "id": block.id,
                                                     "name": block.name, "input": {}})
        elif kind == "thinking":
            self.blocks[index] = _Block("thinking", {"type": "thinking",
                                                     "thinking": block.thinking,
                                                     "signature": block.signature})
            return [ThinkingDelta(block.thinking)] if block.thinking else []
        elif kind == "redacted_thinking":
            self.blocks[index] = _Block("redacted_thinking",
                                        {"type": "redacted_thinking", "data": block.data})
        # Other block types (server tools, …) are not ours to run or to echo.
        return []

    def _delta(self, index: int, delta: Any) -> list[ModelEvent]:
        b = self.blocks.get(index)
        kind = getattr(delta, "type", None)
        if b is None:
            return []
        if kind == "text_delta" and b.type == "text":
            b.data["text"] += delta.text
            return [TextDelta(delta.text)] if delta.text else []
        if kind == "input_json_delta" and b.type == "tool_use":
            b.json.append(delta.partial_json)
        elif kind == "thinking_delta" and b.type == "thinking":
            b.data["thinking"] += delta.thinking
            return [ThinkingDelta(delta.thinking)] if delta.thinking else []
        elif kind == "signature_delta" and b.type == "thinking":
            b.data["signature"] += delta.signature
        return []

    def _stop(self, index: int) -> list[ModelEvent]:
        b = self.blocks.get(index)
        if b is None or b.type != "tool_use":
            return []
        raw = "".join(b.json)
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError:
            value = None
        if not isinstance(value, dict):
            # Cut by max_tokens, usually; judged when the stop reason is known.
            b.bad_json = raw
            return []
        b.data["input"] = value
        return [ToolCall(b.data["id"], b.data["name"], value)]

    def stop(self) -> Stop:
        """The final :class:`Stop`, or a :class:`ModelError` for an unfinished stream."""
        if not self.finished or self.stop_reason is None:
            raise ModelError(
                f"{PROVIDER}: the stream ended before message_stop (connection cut?); "
                "nothing was committed",
                provider=PROVIDER, retryable=True,
            )
        kept: list[dict[str, Any]] = []
        for _, b in sorted(self.blocks.items()):
            if b.bad_json is not None:
                if self.stop_reason == "max_tokens":
                    continue  # a call cut off by the token limit is not a call
                raise ModelError(
                    f"{PROVIDER}: tool_use {b.data['name']!r} came with input that is not a "
                    f"JSON object: {b.bad_json[:200]!r}",
                    provider=PROVIDER, retryable=True,
                )
            if b.type == "text" and not b.data["text"]:
                continue  # the API refuses empty text blocks when they are sent back
            kept.append(b.data)
        has_thinking = any(b["type"] in _THINKING for b in kept)
        return Stop(self.stop_reason, dict(self.usage), tuple(kept) if has_thinking else ())


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "PROVIDER",
    "AnthropicModel",
    "anthropic",
    "to_messages",
    "to_tool",
]
