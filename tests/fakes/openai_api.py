"""A fake OpenAI-compatible chat completions API that speaks the real streaming protocol.

``app = openai_app(script)``: a Starlette app with ``POST /v1/chat/completions`` (so a client's
``base_url`` ends in ``/v1``). Each request takes the next entry of ``app.state.script`` (a
FIFO of :class:`Completion`, :class:`Fail`, or ``fn(body) -> Completion | Fail``) and is logged
in ``app.state.requests``; when the script runs out the fake answers 500 with
``x-should-retry: false``.

Chunks are built from the SDK's own ``ChatCompletionChunk`` type. The knobs reproduce what
local servers do (protocol notes §2.3): the whole call in one delta, ``finish_reason: stop``
after tool calls, calls with no id, ``reasoning_content`` deltas, no usage chunk, an error
object mid-stream, a cut before ``finish_reason``/``[DONE]``. Requests are checked like the
real API: a Bearer key, and every assistant ``tool_calls`` answered by ``tool`` messages.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import (
    Choice,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

_ids = itertools.count(1)


@dataclass
class Call:
    name: str
    arguments: dict[str, Any] | str
    """The input, or the raw arguments text to stream."""
    id: str | None = field(default_factory=lambda: f"call_{next(_ids):04d}{secrets.token_hex(4)}")
    """``None``: the server sends no id (and no type), as some local servers do."""

    @property
    def raw(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass
class Completion:
    """One streamed completion, and the knobs that bend or break it."""

    text: str = ""
    calls: list[Call] = field(default_factory=list)
    finish_reason: str | None = None
    """Defaults to ``tool_calls`` when there are calls, else ``stop``."""
    whole_calls: bool = False
    """Send each call complete in one delta (Ollama), not as fragments by index."""
    reasoning: str = ""
    """Stream this as ``reasoning_content`` deltas first (vLLM, llama.cpp, DeepSeek)."""
    refusal: str = ""
    usage: bool = True
    """Send the usage chunk when the request asks for it (``stream_options``)."""
    prompt_tokens: int = 17
    completion_tokens: int = 9
    cached_tokens: int | None = None
    error_after: int | None = None
    """Send an error object after this many chunks instead of the rest."""
    error: dict[str, Any] = field(default_factory=lambda: {
        "message": "The server had an error while processing your request.",
        "type": "server_error", "param": None, "code": None})
    cut_after: int | None = None
    """End the body after this many chunks (no ``finish_reason``, no ``[DONE]``)."""
    done: bool = True
    """End with ``data: [DONE]``."""
    stall_after: int | None = None
    """Stall before this chunk, for ``stall`` seconds."""
    stall: float = math.inf
    """The default stalls until the client goes away: only a disconnect ends the body."""
    delay: float = 0.0
    raw: list[dict[str, Any]] | None = None
    """Stream these chunk objects as they are, instead of the ones built from the fields
    above: for servers that bend the chunk format itself."""

    @property
    def reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.calls else "stop"


@dataclass
class Fail:
    """An HTTP error before the stream starts."""

    status: int
    message: str = "something went wrong"
    type: str = "server_error"
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


Entry = Completion | Fail | Callable[[dict[str, Any]], "Completion | Fail"]


# -- chunks ------------------------------------------------------------------------------------


def _pieces(s: str, n: int = 3) -> list[str]:
    if not s:
        return []
    size = max(1, -(-len(s) // n))
    return [s[i : i + size] for i in range(0, len(s), size)]


def chunks(c: Completion, model: str, include_usage: bool) -> list[str]:
    """The ``data:`` payloads of ``c``, in order, without ``[DONE]``."""
    cid = f"chatcmpl-{secrets.token_hex(8)}"
    if c.raw is not None:
        base = {"id": cid, "object": "chat.completion.chunk", "created": 1767225600,
                "model": model}
        return [json.dumps({**base, **r}) for r in c.raw]

    def chunk(delta: ChoiceDelta | None, finish: str | None = None,
              usage: CompletionUsage | None = None) -> str:
        choices = [] if delta is None else [Choice(index=0, delta=delta, logprobs=None,
                                                   finish_reason=finish)]  # type: ignore[arg-type]
        out = ChatCompletionChunk(id=cid, object="chat.completion.chunk", created=1767225600,
                                  model=model, choices=choices)
        if usage is not None:
            out.usage = usage
        return out.to_json(indent=None)

    out = [chunk(ChoiceDelta(role="assistant", content=""))]
    for p in _pieces(c.reasoning):
        out.append(chunk(ChoiceDelta.model_validate({"reasoning_content": p})))
    out += [chunk(ChoiceDelta(content=p)) for p in _pieces(c.text)]
    out += [chunk(ChoiceDelta(refusal=p)) for p in _pieces(c.refusal)]
    for k, call in enumerate(c.calls):
        head: dict[str, Any] = {"index": k, "function": ChoiceDeltaToolCallFunction(
            name=call.name, arguments=call.raw if c.whole_calls else "")}
        if call.id is not None:
            head.update(id=call.id, type="function")
        out.append(chunk(ChoiceDelta(tool_calls=[ChoiceDeltaToolCall(**head)])))
        if not c.whole_calls:
            out += [chunk(ChoiceDelta(tool_calls=[ChoiceDeltaToolCall(
                index=k, function=ChoiceDeltaToolCallFunction(arguments=p))]))
                for p in _pieces(call.raw)]
    out.append(chunk(ChoiceDelta(), finish=c.reason))
    if include_usage and c.usage:
        usage: dict[str, Any] = {"prompt_tokens": c.prompt_tokens,
                                 "completion_tokens": c.completion_tokens,
                                 "total_tokens": c.prompt_tokens + c.completion_tokens}
        if c.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": c.cached_tokens}
        out.append(chunk(None, usage=CompletionUsage.model_validate(usage)))
    return out


def whole_completion(c: Completion, model: str) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` JSON of ``c``."""
    message: dict[str, Any] = {"role": "assistant", "content": c.text or None,
                               "refusal": c.refusal or None}
    if c.calls:
        message["tool_calls"] = [{"id": call.id or f"call_{k}", "type": "function",
                                  "function": {"name": call.name, "arguments": call.raw}}
                                 for k, call in enumerate(c.calls)]
    return {"id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion",
            "created": 1767225600, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": c.reason}],
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                      "total_tokens": c.prompt_tokens + c.completion_tokens}}


# -- request checks ----------------------------------------------------------------------------


def check_request(body: dict[str, Any]) -> str | None:
    """What the real API would answer 400 to, or ``None``."""
    for name in ("model", "messages"):
        if name not in body:
            return f"Missing required parameter: '{name}'."
    messages = body["messages"]
    for n, m in enumerate(messages):
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', ..."
        if role == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            answered = set()
            for follow in messages[n + 1:]:
                if follow.get("role") != "tool":
                    break
                answered.add(follow.get("tool_call_id"))
            missing = [i for i in ids if i not in answered]
            if missing:
                return (
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not "
                    f"have response messages: {', '.join(missing)}"
                )
        if role == "tool":
            prev = n - 1
            while prev >= 0 and messages[prev].get("role") == "tool":
                prev -= 1
            calls = messages[prev].get("tool_calls") or [] if prev >= 0 else []
            if m.get("tool_call_id") not in {c["id"] for c in calls}:
                return (
                    f"Invalid parameter: messages with role 'tool' must be a response to a "
                    f"preceeding message with 'tool_calls'. (messages.[{n}].role)"
                )
    for k, tool in enumerate(body.get("tools") or []):
        if tool.get("type") != "function" or "name" not in (tool.get("function") or {}):
            return f"Missing required parameter: 'tools[{k}].function.name'."
    return _check_response_format(body.get("response_format"))


def _strict_problem(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "object":
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return "'additionalProperties' is required to be supplied and to be false"
        if sorted(schema.get("required") or []) != sorted(props):
            return "'required' is required to be supplied and to be an array including every key"
    subs = list((schema.get("properties") or {}).values()) + list(schema.get("anyOf") or [])
    subs += list((schema.get("$defs") or {}).values())
    if isinstance(schema.get("items"), dict):
        subs.append(schema["items"])
    return next((p for p in map(_strict_problem, subs) if p), None)


def _check_response_format(fmt: Any) -> str | None:
    """What the real API answers 400 to in ``response_format``."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        return (f"Invalid value: '{kind}'. Supported values are: 'text', 'json_object', and "
                "'json_schema'. (response_format.type)")
    if kind != "json_schema":
        return None
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return "Missing required parameter: 'response_format.json_schema.name'."
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", spec["name"]):
        return ("Invalid 'response_format.json_schema.name': string does not match pattern. "
                "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.")
    if spec.get("strict") is True:
        problem = _strict_problem(spec.get("schema"))
        if problem:
            return (f"Invalid schema for response_format '{spec['name']}': In context=(), "
                    f"{problem}.")
    return None


# -- the app -----------------------------------------------------------------------------------


def _error(status: int, message: str, type_: str, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers or {})


def openai_app(script: Iterable[Entry] = ()) -> Starlette:
    """A fake ``POST /v1/chat/completions`` playing ``script`` (see the module docstring).

    ``app.state``: ``script`` (deque), ``requests`` (list of ``{"headers", "body"}``),
    ``closed`` (one ``asyncio.Event`` per stream, set when its body generator ends) and
    ``ended`` (one entry per stream, in the same order: ``"streaming"`` until its body
    ends, then how it ended: ``"complete"``, ``"cut"``,
    ``"error"`` (an error event sent), ``"disconnected"`` (the client went away first, e.g.
    mid-stall), or ``"failed"`` (the fake itself raised)).
    """

    async def completions(request: Request) -> Response:
        state = request.app.state
        auth = request.headers.get("authorization", "")
        if not (auth.startswith("Bearer ") and auth[7:].strip()):
            return _error(401, "You didn't provide an API key.", "invalid_request_error",
                          "invalid_api_key")
        body = await request.json()
        state.requests.append({"headers": dict(request.headers), "body": body})
        problem = check_request(body)
        if problem:
            return _error(400, problem, "invalid_request_error")
        if not state.script:
            return _error(500, "the fake's script ran out", "server_error",
                          headers={"x-should-retry": "false"})
        entry = state.script.popleft()
        if callable(entry):
            entry = entry(body)
        if isinstance(entry, Fail):
            return _error(entry.status, entry.message, entry.type, entry.code, entry.headers)
        if not body.get("stream"):
            return JSONResponse(whole_completion(entry, body["model"]))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        closed = asyncio.Event()
        state.closed.append(closed)
        state.ended.append("streaming")
        stream = _play(entry, body["model"], include_usage, closed, state.ended,
                       len(state.ended) - 1)
        return StreamingResponse(stream, media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    app.state.script = deque(script)
    app.state.requests = []
    app.state.closed = []
    app.state.ended = []
    return app


async def _play(c: Completion, model: str, include_usage: bool, closed: asyncio.Event,
                ended: list[str], i: int) -> AsyncIterator[bytes]:
    how = "failed"
    try:
        for k, data in enumerate(chunks(c, model, include_usage)):
            if c.error_after is not None and k == c.error_after:
                yield f"data: {json.dumps({'error': c.error})}\n\n".encode()
                how = "error"
                return
            if c.cut_after is not None and k == c.cut_after:
                how = "cut"
                return
            if c.stall_after is not None and k == c.stall_after:
                await _stall(c.stall)
            if c.delay:
                await asyncio.sleep(c.delay)
            yield f"data: {data}\n\n".encode()
        if c.done:
            yield b"data: [DONE]\n\n"
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
