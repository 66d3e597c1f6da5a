"""A fake Anthropic Messages API that speaks the real streaming protocol.

``app = anthropic_app(script)``: a Starlette app with ``POST /v1/messages``. Each request takes
the next entry of ``app.state.script`` (a FIFO of :class:`Reply`, :class:`Fail`, or a function
``fn(body) -> Reply | Fail``) and is logged in ``app.state.requests``. When the script runs
out the fake answers 500 with ``x-should-retry: false``.

Frames are built from the SDK's own event types, so they are valid by construction. The fake
checks requests the way the real API does: authentication, required fields, every
``tool_use`` answered by a ``tool_result`` in the very next message (and no ``tool_result``
without its ``tool_use``), non-empty text blocks, and, when thinking is on, thinking blocks
echoed back exactly as issued and a final assistant message that starts with one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from anthropic import types as t
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

_ids = itertools.count(1)


@dataclass
class Text:
    text: str


@dataclass
class ToolUse:
    name: str
    input: dict[str, Any]
    id: str = field(default_factory=lambda: f"toolu_{next(_ids):04d}{secrets.token_hex(4)}")
    raw_json: str | None = None
    """Stream this text as the input JSON instead of ``input`` (e.g. cut by max_tokens)."""


@dataclass
class Thinking:
    thinking: str
    signature: str = field(default_factory=lambda: "sig" + secrets.token_urlsafe(24))


@dataclass
class RedactedThinking:
    data: str = field(default_factory=lambda: "redacted" + secrets.token_urlsafe(16))


Block = Text | ToolUse | Thinking | RedactedThinking


@dataclass
class Reply:
    """One streamed message, and the knobs that break it."""

    blocks: list[Block]
    stop_reason: str | None = None
    """Defaults to ``tool_use`` when a block is a tool use, else ``end_turn``."""
    stop_details: dict[str, Any] | None = None
    input_tokens: int = 21
    output_tokens: int = 34
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    error_after: int | None = None
    """Send an ``error`` event after this many frames instead of the rest."""
    error_type: str = "overloaded_error"
    error_message: str = "Overloaded"
    cut_after: int | None = None
    """End the body after this many frames (EOF without ``message_stop``)."""
    stall_after: int | None = None
    """Stall before this frame, for ``stall`` seconds."""
    stall: float = math.inf
    """The default stalls until the client goes away: only a disconnect ends the body."""
    delay: float = 0.0
    """Seconds to wait before each frame."""

    @property
    def reason(self) -> str:
        if self.stop_reason is not None:
            return self.stop_reason
        return "tool_use" if any(isinstance(b, ToolUse) for b in self.blocks) else "end_turn"


@dataclass
class Fail:
    """An HTTP error before the stream starts."""

    status: int
    message: str = "something went wrong"
    headers: dict[str, str] = field(default_factory=dict)
    error_type: str | None = None


Entry = Reply | Fail | Callable[[dict[str, Any]], "Reply | Fail"]


# -- frames ------------------------------------------------------------------------------------


def _pieces(s: str, n: int = 3) -> list[str]:
    if not s:
        return []
    size = max(1, -(-len(s) // n))
    return [s[i : i + size] for i in range(0, len(s), size)]


def _frame(event: Any) -> bytes:
    return f"event: {event.type}\ndata: {event.to_json(indent=None)}\n\n".encode()


def frames(reply: Reply, model: str) -> list[bytes]:
    """The whole SSE sequence of ``reply`` (§1.1 of the protocol notes)."""
    cache = {"cache_read_input_tokens": reply.cache_read_input_tokens,
             "cache_creation_input_tokens": reply.cache_creation_input_tokens}
    usage = t.Usage.model_validate({"input_tokens": reply.input_tokens, "output_tokens": 1,
                                    **{k: v for k, v in cache.items() if v is not None}})
    message = t.Message(
        id=f"msg_{secrets.token_hex(8)}", type="message", role="assistant", model=model,
        content=[], stop_reason=None, stop_sequence=None, usage=usage,
    )
    out = [_frame(t.RawMessageStartEvent(type="message_start", message=message)),
           b'event: ping\ndata: {"type": "ping"}\n\n']
    for i, b in enumerate(reply.blocks):
        start: Any
        deltas: list[Any] = []
        if isinstance(b, Text):
            start = t.TextBlock(type="text", text="")
            deltas = [t.TextDelta(type="text_delta", text=p) for p in _pieces(b.text)]
        elif isinstance(b, ToolUse):
            start = t.ToolUseBlock(type="tool_use", id=b.id, name=b.name, input={})
            raw = json.dumps(b.input) if b.raw_json is None else b.raw_json
            deltas = [t.InputJSONDelta(type="input_json_delta", partial_json=p)
                      for p in ["", *_pieces(raw)]]
        elif isinstance(b, Thinking):
            start = t.ThinkingBlock(type="thinking", thinking="", signature="")
            deltas = [t.ThinkingDelta(type="thinking_delta", thinking=p)
                      for p in _pieces(b.thinking)]
            deltas.append(t.SignatureDelta(type="signature_delta", signature=b.signature))
        else:
            start = t.RedactedThinkingBlock(type="redacted_thinking", data=b.data)
        out.append(_frame(t.RawContentBlockStartEvent(
            type="content_block_start", index=i, content_block=start)))
        out += [_frame(t.RawContentBlockDeltaEvent(type="content_block_delta", index=i, delta=d))
                for d in deltas]
        out.append(_frame(t.RawContentBlockStopEvent(type="content_block_stop", index=i)))
    delta: dict[str, Any] = {"stop_reason": reply.reason, "stop_sequence": None}
    if reply.stop_details is not None:
        delta["stop_details"] = reply.stop_details
    end_usage = t.MessageDeltaUsage(output_tokens=reply.output_tokens)
    out.append(_frame(t.RawMessageDeltaEvent.model_validate(
        {"type": "message_delta", "delta": delta, "usage": end_usage.model_dump(exclude_none=True)}
    )))
    out.append(_frame(t.RawMessageStopEvent(type="message_stop")))
    return out


def whole_message(reply: Reply, model: str) -> dict[str, Any]:
    """The non-streaming ``Message`` JSON of ``reply``."""
    content: list[dict[str, Any]] = []
    for b in reply.blocks:
        if isinstance(b, Text):
            content.append({"type": "text", "text": b.text})
        elif isinstance(b, ToolUse):
            content.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
        elif isinstance(b, Thinking):
            content.append({"type": "thinking", "thinking": b.thinking,
                            "signature": b.signature})
        else:
            content.append({"type": "redacted_thinking", "data": b.data})
    return {"id": f"msg_{secrets.token_hex(8)}", "type": "message", "role": "assistant",
            "model": model, "content": content, "stop_reason": reply.reason,
            "stop_sequence": None,
            "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens}}


# -- request checks ----------------------------------------------------------------------------


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or [])


def check_request(body: dict[str, Any], issued: dict[str, str], redacted: set[str]) -> str | None:
    """What the real API would answer 400 to, or ``None``."""
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            return f"{name}: Field required"
    for i, tool in enumerate(body.get("tools") or []):
        if "name" not in tool or "input_schema" not in tool:
            return f"tools.{i}.custom.input_schema: Field required"
        if tool["input_schema"].get("type") != "object":
            return f"tools.{i}.custom.input_schema.type: Input should be 'object'"
    problem = _check_output_config(body.get("output_config"))
    if problem:
        return problem
    messages = body["messages"]
    if not messages:
        return "messages: at least one message is required"
    if messages[0].get("role") != "user":
        return "messages: first message must use the \"user\" role"
    thinking = (body.get("thinking") or {}).get("type") not in (None, "disabled")
    for n, m in enumerate(messages):
        if m.get("role") not in ("user", "assistant"):
            return f"messages.{n}.role: Input should be 'user' or 'assistant'"
        blocks = _blocks(m.get("content"))
        if not blocks:
            return f"messages.{n}: all messages must have non-empty content"
        for k, b in enumerate(blocks):
            if b.get("type") == "text" and not b.get("text"):
                return f"messages.{n}.content.{k}.text: text content blocks must be non-empty"
            if b.get("type") in ("thinking", "redacted_thinking") and m["role"] != "assistant":
                return f"messages.{n}.content.{k}: thinking blocks are only allowed in assistant"
            if thinking and b.get("type") == "thinking" and (
                issued.get(b.get("signature", "")) != b.get("thinking")
            ):
                return f"messages.{n}.content.{k}: Invalid `signature` in `thinking` block"
            if thinking and b.get("type") == "redacted_thinking" and b.get("data") not in redacted:
                return f"messages.{n}.content.{k}: Invalid `data` in `redacted_thinking` block"
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if m["role"] == "assistant" and uses:
            nxt = _blocks(messages[n + 1].get("content")) if n + 1 < len(messages) else []
            if n + 1 < len(messages) and messages[n + 1].get("role") != "user":
                nxt = []
            answered = {b.get("tool_use_id") for b in nxt if b.get("type") == "tool_result"}
            missing = [u for u in uses if u not in answered]
            if missing:
                return (
                    f"messages.{n}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message."
                )
        if m["role"] == "user":
            prev = _blocks(messages[n - 1].get("content")) if n > 0 else []
            known = {b.get("id") for b in prev if b.get("type") == "tool_use"}
            for k, b in enumerate(blocks):
                if b.get("type") == "tool_result" and b.get("tool_use_id") not in known:
                    return (
                        f"messages.{n}.content.{k}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {b.get('tool_use_id')}. Each `tool_result` block "
                        "must have a corresponding `tool_use` block in the previous message."
                    )
    if thinking and len(messages) >= 2:
        last_user = _blocks(messages[-1].get("content"))
        if messages[-1]["role"] == "user" and any(
            b.get("type") == "tool_result" for b in last_user
        ):
            n = len(messages) - 2
            first = _blocks(messages[n].get("content"))[0].get("type")
            if first not in ("thinking", "redacted_thinking"):
                return (
                    f"messages.{n}.content.0.type: Expected `thinking` or `redacted_thinking`, "
                    f"but found `{first}`. When `thinking` is enabled, a final `assistant` "
                    "message must start with a thinking block."
                )
    return None


_UNSUPPORTED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                "minLength", "maxLength", "pattern")
"""Constraints structured outputs refuse (the SDK's ``transform_schema`` moves them into the
description)."""


def _schemas(schema: Any) -> list[Any]:
    """The subschemas of ``schema`` (where JSON Schema puts them), not its keywords' values."""
    if not isinstance(schema, dict):
        return []
    out: list[Any] = list((schema.get("properties") or {}).values())
    out += list((schema.get("$defs") or {}).values())
    for k in ("anyOf", "allOf", "oneOf"):
        out += list(schema.get(k) or [])
    for k in ("items", "additionalProperties"):
        if isinstance(schema.get(k), dict):
            out.append(schema[k])
    return out


def _check_schema(schema: Any, where: str) -> str | None:
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "object" and schema.get("additionalProperties") is not False:
        return (f"{where}: For 'object' type, 'additionalProperties' must be explicitly set "
                "to false")
    for k in _UNSUPPORTED:
        if k in schema:
            return f"{where}: '{k}' is not supported in structured outputs"
    for sub in _schemas(schema):
        problem = _check_schema(sub, where)
        if problem:
            return problem
    return None


def _check_output_config(config: Any) -> str | None:
    """The structured outputs rules the real API answers 400 to (``output_config.format``)."""
    if config is None:
        return None
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is None:
        return None
    if fmt.get("type") != "json_schema":
        return "output_config.format.type: Input should be 'json_schema'"
    if not isinstance(fmt.get("schema"), dict):
        return "output_config.format.schema: Field required"
    return _check_schema(fmt["schema"], "output_config.format.schema")


# -- the app -----------------------------------------------------------------------------------


def _error(status: int, message: str, error_type: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    request_id = f"req_{secrets.token_hex(6)}"
    body = {"type": "error",
            "error": {"type": error_type or ERROR_TYPES.get(status, "api_error"),
                      "message": message},
            "request_id": request_id}
    return JSONResponse(body, status_code=status,
                        headers={"request-id": request_id, **(headers or {})})


def tokens_of(body: dict[str, Any]) -> int:
    """The fake's own token count of a request body: its JSON's length over four."""
    return len(json.dumps(body)) // 4


def anthropic_app(script: Iterable[Entry] = (),
                  count: Callable[[dict[str, Any]], int] = tokens_of) -> Starlette:
    """A fake ``POST /v1/messages`` playing ``script`` (see the module docstring), and
    ``POST /v1/messages/count_tokens`` answering ``{"input_tokens": count(body)}`` for a
    valid request (the Messages API's own checks; ``max_tokens`` and ``stream`` are refused
    there as the real endpoint refuses extra inputs), each logged in ``app.state.counted``.

    ``app.state``: ``script`` (deque), ``requests`` (list of ``{"headers", "body"}``),
    ``issued`` (thinking signature → text), ``redacted`` (issued redacted data),
    ``closed`` (one ``asyncio.Event`` per stream, set when its body generator ends) and
    ``ended`` (one entry per stream, in the same order: ``"streaming"`` until its body
    ends, then how it ended: ``"complete"``, ``"cut"``,
    ``"error"`` (an error event sent), ``"disconnected"`` (the client went away first, e.g.
    mid-stall), or ``"failed"`` (the fake itself raised)).
    """

    async def messages(request: Request) -> Response:
        state = request.app.state
        auth = request.headers.get("authorization", "")
        if not (auth.startswith("Bearer ") and auth[7:]) and not request.headers.get("x-api-key"):
            return _error(401, "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return _error(400, "anthropic-version: header is required")
        body = await request.json()
        state.requests.append({"headers": dict(request.headers), "body": body})
        problem = check_request(body, state.issued, state.redacted)
        if problem:
            return _error(400, problem)
        if not state.script:
            return _error(500, "the fake's script ran out", headers={"x-should-retry": "false"})
        entry = state.script.popleft()
        if callable(entry):
            entry = entry(body)
        if isinstance(entry, Fail):
            return _error(entry.status, entry.message, entry.error_type, entry.headers)
        reply: Reply = entry
        for b in reply.blocks:
            if isinstance(b, Thinking):
                state.issued[b.signature] = b.thinking
            elif isinstance(b, RedactedThinking):
                state.redacted.add(b.data)
        if not body.get("stream"):
            return JSONResponse(whole_message(reply, body["model"]))
        closed = asyncio.Event()
        state.closed.append(closed)
        state.ended.append("streaming")
        stream = _play(reply, body["model"], closed, state.ended, len(state.ended) - 1)
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"request-id": f"req_{secrets.token_hex(6)}"})

    async def count_tokens(request: Request) -> Response:
        state = request.app.state
        if not request.headers.get("x-api-key") and not request.headers.get("authorization"):
            return _error(401, "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return _error(400, "anthropic-version: header is required")
        body = await request.json()
        state.counted.append(body)
        for extra in ("max_tokens", "stream"):
            if extra in body:
                return _error(400, f"{extra}: Extra inputs are not permitted")
        problem = check_request({**body, "max_tokens": 1}, state.issued, state.redacted)
        if problem:
            return _error(400, problem)
        return JSONResponse({"input_tokens": count(body)})

    app = Starlette(routes=[Route("/v1/messages", messages, methods=["POST"]),
                            Route("/v1/messages/count_tokens", count_tokens,
                                  methods=["POST"])])
    app.state.counted = []
    app.state.script = deque(script)
    app.state.requests = []
    app.state.issued = {}
    app.state.redacted = set()
    app.state.closed = []
    app.state.ended = []
    return app


async def _play(reply: Reply, model: str, closed: asyncio.Event, ended: list[str],
                i: int) -> AsyncIterator[bytes]:
    how = "failed"
    try:
        for k, frame in enumerate(frames(reply, model)):
            if reply.error_after is not None and k == reply.error_after:
                err = {"type": "error",
                       "error": {"type": reply.error_type, "message": reply.error_message}}
                yield f"event: error\ndata: {json.dumps(err)}\n\n".encode()
                how = "error"
                return
            if reply.cut_after is not None and k == reply.cut_after:
                how = "cut"
                return
            if reply.stall_after is not None and k == reply.stall_after:
                await _stall(reply.stall)
            if reply.delay:
                await asyncio.sleep(reply.delay)
            yield frame
        how = "complete"
    except (asyncio.CancelledError, GeneratorExit):
        how = "disconnected"
        raise
    finally:
        ended[i] = how
        closed.set()


async def _stall(seconds: float) -> None:
    if seconds == math.inf:
        await asyncio.Event().wait()  # until the client goes away and the body is cancelled
    else:
        await asyncio.sleep(seconds)


def assistant_blocks(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The content of every assistant message of a logged request body."""
    return [_blocks(m["content"]) for m in body["messages"] if m["role"] == "assistant"]
