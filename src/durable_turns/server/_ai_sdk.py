"""The Vercel AI SDK's UI message stream (v1, as ``ai`` v7 reads it): ``useChat`` and
``DefaultChatTransport`` talk to a durable session.

``mount_ai_sdk(app)`` serves, for each agent:

- ``POST /agents/{agent}/ai-sdk/chat``: the transport's request ``{id, messages, trigger,
  messageId, …}``. ``id`` is the session. Only the last message is read (the stored transcript
  is the history, never the client's copy): a user message starts a turn with its text (sent
  while a turn runs, it joins that turn at its next model call, F25, and the answer is that
  turn's stream); an assistant message whose tool parts carry approval responses (what
  ``addToolApprovalResponse`` leaves) answers the turn's requests. The answer is the turn's
  UI message stream.
- ``GET /agents/{agent}/ai-sdk/chat/{session}/stream``: the transport's resume request
  (``useChat({resume: true})`` after a reload, ``resumeStream()``): the running turn's stream
  from its start, then live; a parked turn's, to the request it waits for (so a reloaded page
  shows the approval again and can answer it); 204 when no turn runs or waits. The store is
  the stream.

A turn's events become chunks (``_turnparts.py`` says how text is shown once, whole): ``start``
(its ``messageId`` is the turn id), ``start-step``/``finish-step`` per model step,
``text-*``, ``reasoning-*`` (live only), ``tool-input-available``, ``tool-output-available``
or ``tool-output-error``, a ``tool-approval-request`` for a yes/no request of a tool call
(its ``approvalId``: ``resume:<turn_id>:<input_id>``), a ``data-input-request`` part for any
other request, ``finish``; a failed turn sends ``error`` first, a cancelled one ``abort``.
A yes/no request of the turn itself, no tool call's (a limit's ask, ``limit:<n>``, F25), is an
approval too: a dynamic tool part of its own (``tool-input-available`` with ``dynamic``, its
``toolCallId`` the approval's id, ``toolName`` the input id's kind: ``limit``) and its
``tool-approval-request``; once answered, the answer's stream settles that part first
(``tool-output-available`` ``{"approved": true}``, or ``tool-output-denied``).
A request refused after it was read (messages that neither say something nor answer an
approval, a wrong answerer, an approval nothing waits for, a busy session) is a stream of one
``error`` chunk: nothing is stored. A body that is no such request at all (not JSON, no
``id``, no ``messages``) is refused as every route refuses it (400 with a JSON error).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .._input_limits import HttpError
from ..access import Action
from ..channels import ChannelContext, TurnStream
from ..events import InputRequested, TurnEvent
from ..records import InputRequest, TurnStatus
from ._guard import SESSION_NAME
from ._http import read_body
from ._idempotency import idempotent, open_keyed
from ._mounts import (
    ProtocolSeam,
    answer_all,
    component_schemas,
    jsonable,
    protocol_seam,
    refusal,
)
from ._turnparts import (
    Ended,
    Parked,
    Part,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    ResetStep,
    StepEnd,
    StepStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolInput,
    ToolOutput,
    TurnParts,
    is_yes_no,
    request_id,
)

SOURCE = "http"
"""The event source of the turns this mount starts: the API's (an agent's policy for
``"http"`` applies to them too)."""
HEADERS = {"x-vercel-ai-ui-message-stream": "v1", "x-accel-buffering": "no"}
"""What marks a response as a UI message stream (and keeps a proxy from buffering it)."""
DATA_INPUT = "data-input-request"
"""The data part of a request that is no yes/no question of a tool call."""


class UIMessage(BaseModel):
    """A message of the request, as the AI SDK's ``UIMessage`` (only ``role`` and ``parts``
    of the last one are read)."""

    model_config = ConfigDict(extra="allow", strict=True)
    id: str = ""
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]]


class ChatRequest(BaseModel):
    """``POST …/ai-sdk/chat``: what ``DefaultChatTransport`` sends (fields it adds, and the
    app's own ``body``, are allowed and ignored)."""

    model_config = ConfigDict(extra="allow", strict=True)
    id: str = Field(min_length=1, max_length=200)
    """The chat: the session."""
    messages: list[UIMessage] = Field(min_length=1)
    trigger: str | None = None
    """``submit-message`` or ``regenerate-message``: a regenerate always starts a new turn."""
    by: str | None = None
    """Development mode only: who speaks or answers (with ``authenticate``, the principal)."""


def _asked(body: ChatRequest) -> str | list[tuple[str, bool]]:
    """The last message's text (a new turn), or its approval responses ``(id, approved)``.

    Raises:
        HttpError: 400 neither.
    """
    last = body.messages[-1]
    if last.role == "user":
        text = "\n".join(p["text"] for p in last.parts
                         if p.get("type") == "text" and isinstance(p.get("text"), str))
        if not text.strip():
            raise HttpError(400, "MalformedBody", "the last message (the user's) has no text")
        return text
    answers = []
    for part in last.parts:
        approval = part.get("approval")
        if part.get("state") == "approval-responded" and isinstance(approval, dict):
            if not isinstance(approval.get("id"), str) or \
                    not isinstance(approval.get("approved"), bool):
                raise HttpError(400, "MalformedBody",
                                "an approval response needs an id and approved: true|false")
            answers.append((approval["id"], approval["approved"]))
    if last.role != "assistant" or not answers:
        raise HttpError(400, "MalformedBody",
                        "the last message is neither the user's nor an assistant message "
                        "with approval responses")
    return answers


def _action(body: ChatRequest) -> Action:
    # An assistant message can only answer; what it holds is checked by the handler, which
    # refuses in the protocol's own shape.
    return "resume" if body.messages[-1].role == "assistant" else "turn"


def chunks(part: Part) -> list[dict[str, Any]]:
    """The UI message stream's chunks for one part of a turn."""
    match part:
        case StepStart():
            return [{"type": "start-step"}]
        case StepEnd():
            return [{"type": "finish-step"}]
        case ResetStep():
            return [{"type": "reset-step"}]
        case TextStart(id=i):
            return [{"type": "text-start", "id": i}]
        case TextDelta(id=i, text=t):
            return [{"type": "text-delta", "id": i, "delta": t}]
        case TextEnd(id=i):
            return [{"type": "text-end", "id": i}]
        case ReasoningStart(id=i):
            return [{"type": "reasoning-start", "id": i}]
        case ReasoningDelta(id=i, text=t):
            return [{"type": "reasoning-delta", "id": i, "delta": t}]
        case ReasoningEnd(id=i):
            return [{"type": "reasoning-end", "id": i}]
        case ToolInput(call=c):
            return [{"type": "tool-input-available", "toolCallId": c.id, "toolName": c.name,
                     "input": jsonable(c.input)}]
        case ToolOutput(call=c, error=str() as error):
            return [{"type": "tool-output-error", "toolCallId": c.id, "errorText": error}]
        case ToolOutput(call=c, result=r):
            return [{"type": "tool-output-available", "toolCallId": c.id,
                     "output": jsonable(r)}]
        case Parked(requests=rs):
            return [*(c for r in rs for c in _request(r)),
                    {"type": "finish", "finishReason": "tool-calls"}]
        case Ended(status="completed"):
            return [{"type": "finish", "finishReason": "stop"}]
        case Ended(status="failed", detail=d):
            return [{"type": "error", "errorText": d}, {"type": "finish", "finishReason": "error"}]
        case Ended(detail=d):
            return [{"type": "abort", "reason": d}, {"type": "finish", "finishReason": "other"}]
    return []


def _request(r: InputRequest) -> list[dict[str, Any]]:
    rid = request_id(r)
    if is_yes_no(r) and r.call_id:
        return [{"type": "tool-approval-request", "approvalId": rid, "toolCallId": r.call_id,
                 "reason": r.prompt}]
    if is_yes_no(r):  # the turn's own question (a limit's): a tool part of its own to approve
        return [{"type": "tool-input-available", "toolCallId": rid, "dynamic": True,
                 "toolName": r.id.partition(":")[0], "title": r.prompt,
                 "input": {"input_id": r.id, "prompt": r.prompt}},
                {"type": "tool-approval-request", "approvalId": rid, "toolCallId": rid,
                 "reason": r.prompt}]
    return [{"type": DATA_INPUT, "id": rid, "data": {
        "id": rid, "turn_id": r.turn_id, "input_id": r.id, "call_id": r.call_id,
        "prompt": r.prompt, "schema": r.schema}}]


def _own_approvals(body: ChatRequest, answers: list[tuple[str, bool]]) -> list[dict[str, Any]]:
    """The chunks that settle the approval parts of the turn's own questions the answers
    went to (their part's ``toolCallId`` is the approval's id): approved, or denied."""
    own = {p.get("toolCallId") for p in body.messages[-1].parts
           if p.get("type") == "dynamic-tool"}
    return [{"type": "tool-output-available", "toolCallId": i, "dynamic": True,
             "output": {"approved": True}} if yes else
            {"type": "tool-output-denied", "toolCallId": i}
            for i, yes in answers if i in own]


async def ui_stream(events: AsyncIterable[TurnEvent], turn_id: str,
                    joined: int = 0, settled: list[dict[str, Any]] | None = None,
                    ) -> AsyncIterator[str]:
    """A turn's UI message stream: each chunk's JSON, then ``[DONE]``.

    Args:
        events: the turn's events (a :class:`TurnStream`, or what the store has of it).
        turn_id: the turn (the message's id).
        joined: ``TurnStream.joined``.
        settled: chunks sent right after ``start`` (approvals this request answered).
    """
    yield json.dumps({"type": "start", "messageId": turn_id})
    for chunk in settled or ():
        yield json.dumps(chunk)
    parts = TurnParts(turn_id, joined)
    async for event in events:
        for part in parts.feed(event):
            for chunk in chunks(part):
                yield json.dumps(chunk)
    yield "[DONE]"


async def _as_parked(events: list[TurnEvent]) -> AsyncIterator[TurnEvent]:
    """A parked turn's stored events, its earlier parks left out (they were answered: their
    calls' results follow), so that its stream ends at the request it waits for."""
    last = max(i for i, e in enumerate(events) if isinstance(e, InputRequested))
    for i, e in enumerate(events[:last + 1]):
        if i == last or not isinstance(e, InputRequested):
            yield e


async def _refused(kind: str, message: str) -> AsyncIterator[str]:
    yield json.dumps({"type": "error", "errorText": f"{kind}: {message}"})
    yield "[DONE]"


class _AiSdk:
    def __init__(self, seam: ProtocolSeam) -> None:
        self.seam = seam

    def routes(self, base: str) -> list[BaseRoute]:
        g = self.seam.guard
        return [
            Route(base, g(self.chat, _action, body=ChatRequest, session=lambda b: b.id),
                  methods=["POST"]),
            Route(f"{base}/{{session}}/stream", g(self.resume, "read"), methods=["GET"]),
        ]

    async def chat(self, request: Request) -> Response:
        body = await read_body(request, ChatRequest)
        ch = self.seam.channel(request)
        by, principal = self.seam.speaker(request, body.by)
        try:
            asked = _asked(body)
            settled = None
            if isinstance(asked, str):
                stream = await self._start(ch, body, asked, by)
            else:
                stream = await answer_all(ch, body.id, list(asked), by=by,
                                          principal=principal)
                settled = _own_approvals(body, asked)
        except Exception as e:
            said = refusal(e)
            if said is None:
                raise
            return self.seam.sse(_refused(*said), headers=HEADERS)
        return self.seam.sse(ui_stream(stream, stream.turn_id, stream.joined, settled), stream,
                             HEADERS)

    async def _start(self, ch: ChannelContext, body: ChatRequest, text: str,
                     by: str | None) -> TurnStream:
        # The user message's id keys the turn (as an Idempotency-Key would: a request sent
        # again gets the same turn's stream, never a second turn), hashed into a name of its
        # own, apart from the keys of POST …/turn. A regenerate asks anew.
        message = body.messages[-1].id
        key = None
        if message and body.trigger != "regenerate-message":
            key = "ai-sdk:" + hashlib.sha256(message.encode()).hexdigest()[:40]
        # Sent while a turn streams, the message steers it (F25): its stream is that turn's.
        return await open_keyed(ch, text, idempotent(key, {"text": text}, by), session=body.id,
                                event=self.seam.inbound(by, text, SOURCE), mode="steer")

    async def resume(self, request: Request) -> Response:
        ch = self.seam.channel(request)
        session = request.path_params["session"]
        s = ch.session(session)
        unfinished = [t for t in await s.turns() if not t.status.final]
        if not unfinished:
            return Response(status_code=204)
        turn = unfinished[0]
        if turn.status == TurnStatus.SUSPENDED:
            # Waiting for a person: the page that reloaded shows the request again, as the
            # store has it (nothing is live), and can answer it.
            logged = await s.events(turn_id=turn.turn_id)
            if any(isinstance(e, InputRequested) for e in logged):
                return self.seam.sse(ui_stream(_as_parked(logged), turn.turn_id),
                                     headers=HEADERS)
        stream = await ch.follow(turn.turn_id, session=session)
        return self.seam.sse(ui_stream(stream, stream.turn_id, stream.joined), stream, HEADERS)


def mount_ai_sdk(app: Starlette, *, path: str = "/agents/{agent}/ai-sdk/chat") -> None:
    """Serve the AI SDK's UI message stream protocol on ``app`` (see the module).

    Args:
        app: an app of ``create_app(runtime, …)`` serving the API: its ``authenticate`` and
            ``authorize`` apply (a new turn is the ``turn`` action, approval responses are
            ``resume``, the resume request is ``read``).
        path: the chat route, with ``{agent}`` (what ``DefaultChatTransport({api})`` is given
            once the agent is filled in); the resume route is ``{path}/{id}/stream``.

    Raises:
        ConfigurationError: ``app`` is no such app, or the protocol is mounted already.
    """
    seam = protocol_seam(app)
    seam.add(app, "ai-sdk", _AiSdk(seam).routes(path), _openapi(path),
             component_schemas(ChatRequest, "AiSdkChatRequest", id={"pattern": SESSION_NAME}))


def _openapi(path: str) -> dict[str, Any]:
    params = [{"name": "agent", "in": "path", "required": True, "schema": {"type": "string"}}]
    error = {"description": "refused: {\"error\": {\"type\", \"message\"}}",
             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    chunk = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
    stream = {"description": "the turn's UI message stream (header "
                             "x-vercel-ai-ui-message-stream: v1)",
              "content": {"text/event-stream": {"itemSchema": chunk}}}
    return {
        path: {"post": {
            "summary": "AI SDK chat: start a turn with the last user message, or answer "
                       "approvals; the UI message stream",
            "parameters": params,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/AiSdkChatRequest"}}}},
            "responses": {"200": stream,
                          **{str(c): error for c in (400, 401, 403, 404, 408, 413, 415, 503)}}}},
        f"{path}/{{session}}/stream": {"get": {
            "summary": "AI SDK resume: the running turn's stream from its start, then live",
            "parameters": [*params, {"name": "session", "in": "path", "required": True,
                                     "schema": {"type": "string", "minLength": 1,
                                                "pattern": SESSION_NAME}}],
            "responses": {"200": stream, "204": {"description": "no turn runs"},
                          **{str(c): error for c in (400, 401, 403, 404, 503)}}}},
    }


__all__ = ["DATA_INPUT", "HEADERS", "SOURCE", "ChatRequest", "chunks", "mount_ai_sdk",
           "ui_stream"]
