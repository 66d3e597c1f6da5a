"""The OpenAI-compatible adapter (F11): chat completions, streamed, on the official ``openai`` SDK.

It works with OpenAI and with local servers that speak the same protocol (Ollama, vLLM,
llama.cpp, LM Studio): point ``base_url`` at the server's ``/v1``. It calls
``chat.completions.create(stream=True)`` and puts the reply together itself, because local
servers bend the protocol and the SDK's helpers raise on ``length``/``content_filter``:

- tool-call fragments are joined by ``index``; a server that sends a whole call in one delta
  works too, and so does one that sends several calls all at index 0 with their own ids;
- whether the reply asks for tools is decided from the calls put together, not from
  ``finish_reason`` (some servers say ``stop`` after streaming tool calls);
- ``finish_reason`` maps to the engine's stop reasons: ``stop`` → ``end_turn``, tool calls →
  ``tool_use``, ``length`` → ``max_tokens``, ``content_filter`` → ``content_filter``;
- a stream that ends without a ``finish_reason`` (the connection was cut) is a
  :class:`~durable_turns.errors.ModelError`: the SDK reports no error for it.

Reasoning deltas (``reasoning_content`` / ``reasoning``) are streamed as
:class:`ThinkingDelta` and not stored: compatible servers do not take them back.

Structured output (F25): a turn's output schema (``ModelRequest.output``) goes as
``response_format`` ``{"type": "json_schema", …}`` with ``strict`` off (strict mode takes
only a subset of JSON Schema, and the engine validates the answer against the whole schema
anyway); OpenAI, Ollama, vLLM, llama.cpp and LM Studio take it. ``structured_output=False``
asks for it in the system prompt instead, for a server that refuses the parameter.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

try:
    import httpx2
    import openai as sdk
except ImportError as e:  # pragma: no cover - exercised by test_resolve with a hidden SDK
    raise ImportError(
        "durable_turns.models.openai_compat needs the OpenAI SDK: "
        "pip install 'durable-turns[openai]'"
    ) from e

from ..errors import ConfigurationError, ModelError
from ..messages import Message, ToolCall
from ..model import ModelEvent, ModelRequest, Stop, TextDelta, ThinkingDelta
from ..tools import ToolSpec
from ._sdk_errors import translate

PROVIDER = "openai"

_FINISH = {"stop": "end_turn", "length": "max_tokens", "content_filter": "content_filter",
           "tool_calls": "end_turn", "function_call": "end_turn"}
_RETRYABLE_TYPES = frozenset({"server_error", "rate_limit_exceeded", "rate_limit_error",
                              "overloaded_error", "api_error", "timeout"})
_NO_KEY = "unused"
"""Sent as the key to a server given by ``base_url`` when none is configured (local servers
take any key, the SDK insists on one)."""


class OpenAICompatibleModel:
    """A :class:`~durable_turns.model.Model` on streamed chat completions.

    Build it with :func:`openai_compatible`. Each ``stream()`` call is one HTTP request;
    closing the stream early (a cancelled turn) closes the HTTP response at once.
    """

    def __init__(self, client: sdk.AsyncOpenAI, model: str, *, max_tokens: int | None,
                 include_usage: bool, structured_output: bool = True) -> None:
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.include_usage = include_usage
        self.structured_output = structured_output
        """Whether a turn's output schema is sent as ``response_format`` (the engine reads
        it: else the schema is asked for in the system prompt)."""

    def __repr__(self) -> str:
        return f"OpenAICompatibleModel({self.model!r}, base_url={str(self.client.base_url)!r})"

    async def aclose(self) -> None:
        """Close the SDK client and its connections."""
        await self.client.close()

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The ``chat.completions.create`` arguments for ``request`` (without ``stream``)."""
        params: dict[str, Any] = {"model": self.model,
                                  "messages": to_messages(request.system, request.messages)}
        if request.tools:
            params["tools"] = [to_tool(s) for s in request.tools]
        if self.include_usage:
            params["stream_options"] = {"include_usage": True}
        if self.max_tokens is not None:
            params["max_completion_tokens"] = self.max_tokens
        if request.output is not None and self.structured_output:
            params["response_format"] = to_response_format(request.output)
        return params

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        params = self.params(request)
        reply = _Reply()
        try:
            async with await self.client.chat.completions.create(**params, stream=True) as chunks:
                async for chunk in chunks:
                    for out in reply.feed(chunk):
                        yield out
        except (sdk.OpenAIError, httpx2.TransportError, ValueError) as e:
            raise translate(PROVIDER, sdk, e, midstream="error object",
                            retryable_types=_RETRYABLE_TYPES) from e
        for out in reply.end():
            yield out


def openai_compatible(
    model: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    max_retries: int = 2,
    max_tokens: int | None = None,
    timeout: float | httpx2.Timeout | None = None,
    include_usage: bool = True,
    http_client: httpx2.AsyncClient | None = None,
    client: sdk.AsyncOpenAI | None = None,
    structured_output: bool = True,
) -> OpenAICompatibleModel:
    """A model behind an OpenAI-compatible chat completions endpoint.

    Args:
        model: the model name the server knows (``"gpt-4o"``, ``"llama3.1"``, …).
        base_url: the server's API root, ending in ``/v1`` (Ollama:
            ``http://localhost:11434/v1``); else ``OPENAI_BASE_URL``, else OpenAI.
        api_key: else ``OPENAI_API_KEY``; a server named by ``base_url`` may need none.
        max_retries: SDK retries of 408/409/429/5xx and connection errors, honouring
            ``retry-after``; when they run out the model step fails without committing.
        max_tokens: sent as ``max_completion_tokens`` when set.
        timeout: seconds (or an ``httpx2.Timeout``); a stream idle for longer than the read
            timeout fails the step.
        include_usage: ask for the usage chunk (``stream_options``); turn it off for a server
            that rejects the option.
        http_client: an ``httpx2.AsyncClient`` for the SDK (proxies, tests).
        client: a ready ``AsyncOpenAI`` (or Azure variant); the connection arguments above
            must then be left unset.
        structured_output: send a turn's output schema (``turn(output=…)``) as
            ``response_format`` (``json_schema``); ``False`` asks for it in the system prompt
            instead, for a server that refuses the parameter.

    Raises:
        ConfigurationError: contradictory arguments, or no key for OpenAI itself.
    """
    if client is None:
        options: dict[str, Any] = {"max_retries": max_retries}
        if base_url is not None:
            options["base_url"] = base_url
        if api_key is None and not os.environ.get("OPENAI_API_KEY") and (
            base_url is not None or os.environ.get("OPENAI_BASE_URL")
        ):
            api_key = _NO_KEY
        if api_key is not None:
            options["api_key"] = api_key
        if timeout is not None:
            options["timeout"] = timeout
        if http_client is not None:
            options["http_client"] = http_client
        try:
            client = sdk.AsyncOpenAI(**options)
        except sdk.OpenAIError as e:  # no key: the SDK says which variables it read
            raise ConfigurationError(f"{PROVIDER}: {e}") from e
    elif api_key or base_url or timeout is not None or http_client is not None:
        raise ConfigurationError(
            "openai_compatible(): pass either client= or api_key/base_url/timeout/http_client"
        )
    return OpenAICompatibleModel(client, model, max_tokens=max_tokens,
                                 include_usage=include_usage,
                                 structured_output=structured_output)


# -- request: our transcript → chat messages -----------------------------------------------------


def to_tool(spec: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": spec.name, "description": spec.description,
                                             "parameters": dict(spec.input)}}


def to_response_format(schema: dict[str, Any]) -> dict[str, Any]:
    """A turn's output schema as ``response_format``: named after its ``title`` (the API
    wants ``[A-Za-z0-9_-]{1,64}``), ``strict`` off (see the module docstring)."""
    title = schema.get("title")
    name = re.sub(r"[^A-Za-z0-9_-]", "_", title)[:64] if isinstance(title, str) else ""
    return {"type": "json_schema",
            "json_schema": {"name": name or "output", "schema": schema, "strict": False}}


def to_messages(system: str, transcript: list[Message]) -> list[dict[str, Any]]:
    """Our message log as chat ``messages``: ``trigger`` goes as ``user``; each tool result as
    a ``tool`` message (errors are the ``{"error": …}`` JSON: the protocol has no flag)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for m in transcript:
        if m.role in ("user", "trigger"):
            out.append({"role": "user", "content": m.text})
        elif m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name,
                                  "arguments": json.dumps(c.input, ensure_ascii=False)}}
                    for c in m.tool_calls
                ]
            elif not m.text:
                continue  # an empty reply says nothing and some servers refuse it
            out.append(msg)
        elif m.role == "tool":
            content = (m.result if isinstance(m.result, str)
                       else json.dumps(m.result, ensure_ascii=False))
            out.append({"role": "tool", "tool_call_id": m.call_id, "content": content})
    return out


# -- reply: chunks → our events ------------------------------------------------------------------


@dataclass
class _Call:
    id: str | None = None
    name: str = ""
    args: list[str] = field(default_factory=list)


@dataclass
class _Reply:
    calls: list[_Call] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)
    """A delta's ``index`` → its position in ``calls``."""
    text: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    finish: str | None = None

    def feed(self, chunk: Any) -> list[ModelEvent]:
        if getattr(chunk, "usage", None) is not None:
            self._usage(chunk.usage)
        out: list[ModelEvent] = []
        for choice in getattr(chunk, "choices", None) or []:
            if getattr(choice, "index", 0) != 0:
                continue
            if choice.finish_reason is not None:
                self.finish = choice.finish_reason
            delta = getattr(choice, "delta", None)
            if delta is None:
                continue
            extra = getattr(delta, "model_extra", None) or {}
            thought = extra.get("reasoning_content") or extra.get("reasoning")
            if isinstance(thought, str) and thought:
                out.append(ThinkingDelta(thought))
            if delta.content:
                self.text.append(delta.content)
                out.append(TextDelta(delta.content))
            if getattr(delta, "refusal", None):
                self.refusal.append(delta.refusal)
                out.append(TextDelta(delta.refusal))
            for position, tc in enumerate(delta.tool_calls or []):
                self._call(tc, position)
        return out

    def _call(self, tc: Any, position: int) -> None:
        index = tc.index if isinstance(getattr(tc, "index", None), int) else position
        slot = self.slots.get(index)
        if slot is not None and tc.id and self.calls[slot].id and tc.id != self.calls[slot].id:
            slot = None  # a new call reusing an index (some servers put every call at 0)
        if slot is None:
            self.calls.append(_Call())
            slot = self.slots[index] = len(self.calls) - 1
        call = self.calls[slot]
        if tc.id:
            call.id = tc.id
        fn = tc.function
        if fn is not None:
            if fn.name:
                call.name = fn.name  # some servers repeat the name on every fragment
            if isinstance(fn.arguments, dict):  # a server that sends an object, not text
                call.args.append(json.dumps(fn.arguments))
            elif fn.arguments:
                call.args.append(fn.arguments)

    def _usage(self, usage: Any) -> None:
        for ours, theirs in (("input_tokens", "prompt_tokens"),
                             ("output_tokens", "completion_tokens")):
            value = getattr(usage, theirs, None)
            if isinstance(value, int):
                self.usage[ours] = value
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None)
        if isinstance(cached, int):
            self.usage["cache_read_input_tokens"] = cached

    def end(self) -> list[ModelEvent]:
        """The tool calls and the final :class:`Stop`; a :class:`ModelError` if unfinished."""
        if self.finish is None:
            raise ModelError(
                f"{PROVIDER}: the stream ended without a finish_reason (connection cut?); "
                "nothing was committed",
                provider=PROVIDER, retryable=True,
            )
        truncated = self.finish == "length"
        calls: list[ToolCall] = []
        for call in self.calls:
            raw = "".join(call.args)
            try:
                value = json.loads(raw) if raw.strip() else {}
            except ValueError:
                value = None
            if not isinstance(value, dict) or not call.name:
                if truncated:
                    continue  # cut off by the token limit: not a call
                raise ModelError(
                    f"{PROVIDER}: tool call {call.name or '?'!r} came with arguments that are "
                    f"not a JSON object: {raw[:200]!r}",
                    provider=PROVIDER, retryable=True,
                )
            # A server that sends no id still needs one: the transcript keys results on it.
            calls.append(ToolCall(call.id or f"call_{uuid.uuid4().hex[:24]}", call.name, value))
        if truncated:
            reason = "max_tokens"
        elif calls:
            reason = "tool_use"
        elif self.refusal and not self.text:
            reason = "refusal"
        else:
            reason = _FINISH.get(self.finish, self.finish)
        return [*calls, Stop(reason, dict(self.usage))]


__all__ = ["PROVIDER", "OpenAICompatibleModel", "openai_compatible", "to_messages",
           "to_response_format", "to_tool"]
