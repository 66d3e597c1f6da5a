"""AG-UI (the Agent User Interaction protocol, 1.0): ``HttpAgent`` and the clients built on it
(CopilotKit, …) run a durable session's turns.

``mount_ag_ui(app)`` serves ``POST /agents/{agent}/ag-ui``: a ``RunAgentInput`` (``threadId`` is
the session, ``runId`` the turn id), answered with AG-UI events over SSE. Only the last user
message of ``messages`` is read: the stored transcript is the history. A ``runId`` the thread
has already is the same turn: its stored events again, then live ones (a redelivery is
idempotent; the same id with other text is a ``RUN_ERROR``).

Events: ``RUN_STARTED``; per model step the text as ``TEXT_MESSAGE_START/CONTENT/END``, the
reasoning as ``REASONING_START``, ``REASONING_MESSAGE_START/CONTENT/END``, ``REASONING_END``
(live only), each call as ``TOOL_CALL_START/ARGS/END`` and its result as
``TOOL_CALL_RESULT``; then ``RUN_FINISHED`` (outcome ``success`` with the turn's text as
``result``, or ``cancelled``) or ``RUN_ERROR`` (a failed turn, or a request refused). A park
ends the run with the ``interrupt`` outcome: one interrupt per request (its ``id``:
``resume:<turn_id>:<input_id>``, ``reason`` ``approval`` for a yes/no question, else
``input``, the prompt as ``message``, the JSON schema as ``responseSchema``). The next run's
``resume`` entries answer them (``resolved`` with the answer as ``payload``; ``cancelled``
cancels the turn), under the same rules as ``POST …/resume``.

Encoded with the ``ag-ui-protocol`` package's event types and encoder (the ``ag-ui`` extra).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any, Literal, get_origin

try:
    from ag_ui.core import (
        BaseEvent,
        Interrupt,
        ReasoningEndEvent,
        ReasoningMessageContentEvent,
        ReasoningMessageEndEvent,
        ReasoningMessageStartEvent,
        ReasoningStartEvent,
        ResumeEntry,
        RunAgentInput,
        RunErrorEvent,
        RunFinishedCancelledOutcome,
        RunFinishedEvent,
        RunFinishedInterruptOutcome,
        RunFinishedSuccessOutcome,
        RunStartedEvent,
        TextMessageContentEvent,
        TextMessageEndEvent,
        TextMessageStartEvent,
        ToolCallArgsEvent,
        ToolCallEndEvent,
        ToolCallResultEvent,
        ToolCallStartEvent,
        UserMessage,
    )
    from ag_ui.encoder import EventEncoder
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("mount_ag_ui needs the ag-ui extra: pip install 'durable-turns[ag-ui]'") \
        from e
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .._input_limits import HttpError
from ..access import Action
from ..channels import ChannelContext, TurnStream
from ..records import InputRequest
from ._guard import SESSION_NAME
from ._http import read_body
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
"""The event source of the turns this mount starts: the API's."""
RUN_ID = r"^[!-~]{1,200}$"
"""A run id names its turn: 1 to 200 printable ASCII characters, no spaces (as ``turn_id``)."""


def _text(body: RunAgentInput) -> str:
    """The last user message's text.

    Raises:
        HttpError: 400 none, or one without text.
    """
    users = [m for m in body.messages if isinstance(m, UserMessage)]
    if not users:
        raise HttpError(400, "MalformedBody", "messages has no user message to run")
    content = users[-1].content
    text = content if isinstance(content, str) else "\n".join(
        str(getattr(p, "text", "")) for p in content if getattr(p, "type", None) == "text")
    if not text.strip():
        raise HttpError(400, "MalformedBody", "the last user message has no text")
    return text


def _untagged(value: Any, path: str = "") -> str | None:
    """Where ``value`` leaves out a constant field (a message's ``role``, a tool call's
    ``type``): the protocol's schemas require them (``toolCalls[].type`` is ``"function"``),
    though the package's models fill them in. ``None``: nowhere."""
    if isinstance(value, BaseModel):
        for name, info in type(value).model_fields.items():
            alias = info.alias or name
            if get_origin(info.annotation) is Literal and name not in value.model_fields_set:
                return f"{path}{alias}"
            found = _untagged(getattr(value, name), f"{path}{alias}.")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _untagged(item, f"{path}{i}.")
            if found is not None:
                return found
    return None


def _check(body: RunAgentInput) -> RunAgentInput:
    missing = _untagged(body)
    if missing is not None:
        raise HttpError(400, "MalformedBody", f"{missing}: a required field of the AG-UI "
                        "protocol is missing (RunAgentInput's schema)")
    if not re.fullmatch(RUN_ID, body.run_id):
        raise HttpError(400, "MalformedBody",
                        "runId names the turn: 1 to 200 printable ASCII characters, no spaces")
    if not body.thread_id or len(body.thread_id) > 200:
        raise HttpError(400, "MalformedBody", "threadId is the session: 1 to 200 characters")
    return body


def _action(body: RunAgentInput) -> Action:
    _check(body)
    if body.resume and any(entry.status == "cancelled" for entry in body.resume):
        return "cancel"  # it cancels the turn: who may answer may not therefore cancel
    return "resume" if body.resume else "turn"


class Frames:
    """A turn's parts as AG-UI events, a valid sequence: what is open is closed before the
    run ends, and a step that starts over (:class:`ResetStep`) closes what it had open and
    shows the rest under new message ids (AG-UI cannot take back what a client was shown)."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.reasoning: str | None = None
        self.resets = 0

    def _id(self, part_id: str) -> str:
        return part_id if not self.resets else f"{part_id}~{self.resets}"

    def events(self, part: Part) -> list[BaseEvent]:
        """The events of ``part`` (often none)."""
        match part:
            case TextStart(id=i):
                self.text = self._id(i)
                return [TextMessageStartEvent(message_id=self.text, role="assistant")]
            case TextDelta(text=t) if t and self.text is not None:
                return [TextMessageContentEvent(message_id=self.text, delta=t)]
            case TextEnd() if self.text is not None:
                done, self.text = self.text, None
                return [TextMessageEndEvent(message_id=done)]
            case ReasoningStart(id=i):
                self.reasoning = self._id(i)
                return [ReasoningStartEvent(message_id=self.reasoning),
                        ReasoningMessageStartEvent(message_id=self.reasoning, role="reasoning")]
            case ReasoningDelta(text=t) if t and self.reasoning is not None:
                return [ReasoningMessageContentEvent(message_id=self.reasoning, delta=t)]
            case ReasoningEnd() if self.reasoning is not None:
                done, self.reasoning = self.reasoning, None
                return [ReasoningMessageEndEvent(message_id=done),
                        ReasoningEndEvent(message_id=done)]
            case ResetStep():
                closed = self.close()
                self.resets += 1
                return closed
            case ToolInput(call=c):
                return [ToolCallStartEvent(tool_call_id=c.id, tool_call_name=c.name),
                        ToolCallArgsEvent(tool_call_id=c.id, delta=json.dumps(jsonable(c.input))),
                        ToolCallEndEvent(tool_call_id=c.id)]
            case ToolOutput(call=c, result=r, error=err):
                content = json.dumps(jsonable(r) if err is None else {"error": err})
                return [ToolCallResultEvent(message_id=f"result:{c.id}", tool_call_id=c.id,
                                            content=content, role="tool")]
        # A step's start or end shows nothing here (AG-UI's steps are optional).
        return []

    def close(self) -> list[BaseEvent]:
        """End what is open (the run cannot end on an open message)."""
        out: list[BaseEvent] = []
        if self.reasoning is not None:
            out += self.events(ReasoningEnd(self.reasoning))
        if self.text is not None:
            out += self.events(TextEnd(self.text))
        return out


def _end(part: Parked | Ended, thread: str, run: str) -> BaseEvent:
    if isinstance(part, Parked):
        return RunFinishedEvent(thread_id=thread, run_id=run, outcome=RunFinishedInterruptOutcome(
            interrupts=[_interrupt(r) for r in part.requests]))
    if part.status == "completed":
        return RunFinishedEvent(thread_id=thread, run_id=run, result=part.detail,
                                outcome=RunFinishedSuccessOutcome())
    if part.status == "cancelled":
        return RunFinishedEvent(thread_id=thread, run_id=run,
                                outcome=RunFinishedCancelledOutcome())
    return RunErrorEvent(message=part.detail, code="TurnFailed")


def _interrupt(r: InputRequest) -> Interrupt:
    return Interrupt(id=request_id(r), reason="approval" if is_yes_no(r) else "input",
                     message=r.prompt, tool_call_id=r.call_id or None,
                     response_schema=r.schema if isinstance(r.schema, dict) else None)


async def run_events(stream: TurnStream | None, thread: str, run: str,
                     done: BaseEvent | None = None) -> AsyncIterator[str]:
    """One run's SSE ``data`` lines: ``RUN_STARTED``, the turn's events, its end."""
    encode = EventEncoder().encode
    yield _data(encode(RunStartedEvent(thread_id=thread, run_id=run)))
    if stream is not None:
        shown = Frames()
        parts = TurnParts(stream.turn_id, stream.joined)
        async for event in stream:
            for part in parts.feed(event):
                if isinstance(part, Parked | Ended):
                    for e in [*shown.close(), _end(part, thread, run)]:
                        yield _data(encode(e))
                    return
                for e in shown.events(part):
                    yield _data(encode(e))
    if done is not None:
        yield _data(encode(done))


def _data(frame: str) -> str:
    """The encoder's frame (``data: …\\n\\n``) as the ``data`` of an SSE event."""
    return frame.removeprefix("data: ").rstrip("\n")


class _AgUi:
    def __init__(self, seam: ProtocolSeam) -> None:
        self.seam = seam

    def routes(self, path: str) -> list[BaseRoute]:
        g = self.seam.guard
        return [Route(path, g(self.run, _action, body=RunAgentInput,
                              session=lambda b: b.thread_id), methods=["POST"])]

    async def run(self, request: Request) -> Response:
        body = _check(await read_body(request, RunAgentInput))
        ch = self.seam.channel(request)
        props = body.forwarded_props if isinstance(body.forwarded_props, dict) else {}
        dev_by = props.get("by") if isinstance(props.get("by"), str) else None
        by, principal = self.seam.speaker(request, dev_by)
        thread, run = body.thread_id, body.run_id
        try:
            if body.resume:
                stream = await self._resume(ch, thread, body.resume, by, principal)
                done = None if stream is not None else RunFinishedEvent(
                    thread_id=thread, run_id=run, outcome=RunFinishedCancelledOutcome())
            else:
                text = _text(body)
                stream = await ch.open_turn(text, session=thread, turn_id=run,
                                            event=self.seam.inbound(by, text, SOURCE))
                done = None
        except Exception as e:
            said = refusal(e)
            if said is None:
                raise
            return self.seam.sse(run_events(None, thread, run, RunErrorEvent(
                message=said[1], code=said[0])))
        return self.seam.sse(run_events(stream, thread, run, done), stream)

    async def _resume(self, ch: ChannelContext, thread: str, entries: list[ResumeEntry],
                      by: str | None, principal: Any) -> TurnStream | None:
        """Answer the interrupts; ``None`` when the client cancelled them (and so the turn)."""
        if any(entry.status == "cancelled" for entry in entries):
            pending = await ch.session(thread).pending()
            asked = {request_id(r): r.turn_id for r in (pending.all if pending else ())}
            turn_id = asked.get(entries[0].interrupt_id)
            if turn_id is None:
                raise HttpError(409, "NoSuchRequest", f"nothing waits for "
                                f"{entries[0].interrupt_id!r} in session {thread!r}")
            await ch.session(thread).cancel(turn_id, reason="the client cancelled the interrupt")
            return None
        return await answer_all(ch, thread, [(e.interrupt_id, e.payload) for e in entries],
                                by=by, principal=principal)


def mount_ag_ui(app: Starlette, *, path: str = "/agents/{agent}/ag-ui") -> None:
    """Serve AG-UI on ``app`` (see the module).

    Args:
        app: an app of ``create_app(runtime, …)`` serving the API: its ``authenticate`` and
            ``authorize`` apply (a run is the ``turn`` action, a run that resumes is
            ``resume``, one that cancels its interrupts ``cancel``). In development mode,
            ``forwardedProps.by`` says who speaks.
        path: the route, with ``{agent}`` (``HttpAgent({url})`` once the agent is filled in).

    Raises:
        ConfigurationError: ``app`` is no such app, or the protocol is mounted already.
    """
    seam = protocol_seam(app)
    schemas = component_schemas(RunAgentInput, "RunAgentInput",
                                threadId={"minLength": 1, "maxLength": 200,
                                          "pattern": SESSION_NAME},
                                runId={"pattern": RUN_ID})
    for schema in schemas.values():
        # A constant field (a message's role, a part's type) tells which model it is, its
        # union's discriminator: required, though the generated schemas give it a default.
        tags = {k for k, v in schema.get("properties", {}).items() if "const" in v}
        if tags:
            schema["required"] = sorted({*schema.get("required", ()), *tags})
    seam.add(app, "ag-ui", _AgUi(seam).routes(path), _openapi(path), schemas)


def _openapi(path: str) -> dict[str, Any]:
    error = {"description": "refused: {\"error\": {\"type\", \"message\"}}",
             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    item = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
    return {path: {"post": {
        "summary": "AG-UI: run the thread's turn (RunAgentInput); its AG-UI events",
        "parameters": [{"name": "agent", "in": "path", "required": True,
                        "schema": {"type": "string"}}],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/RunAgentInput"}}}},
        "responses": {"200": {"description": "the run's AG-UI events",
                              "content": {"text/event-stream": {"itemSchema": item}}},
                      **{str(c): error for c in (400, 401, 403, 404, 408, 413, 415, 503)}}}}}


__all__ = ["Frames", "mount_ag_ui", "run_events"]
