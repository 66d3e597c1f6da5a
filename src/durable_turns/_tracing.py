"""Tracing with OpenTelemetry (F17): a span per turn, a child span per step.

The engine calls :func:`begin_turn` when it starts driving a turn and gets a
:class:`TurnTrace` back, or ``None`` — and then does nothing more for tracing — when
``opentelemetry-api`` is not installed or the application set no tracer provider. Spans go
through ``opentelemetry.trace.get_tracer("durable_turns")``, so the application's
``TracerProvider`` decides where they go.

Spans, named and attributed after the OpenTelemetry GenAI semantic conventions:

- ``durable_turns.turn`` (``gen_ai.operation.name`` = ``invoke_agent``): one per stretch of a
  turn driven in one go. A turn that parks ends its span with the park; the resumed part is a
  new span **linked** to it (``durable_turns.link`` = ``resumed``; a two-day approval is not a
  two-day span). A replay after a crash is a new span linked to the crashed attempt's
  (``replayed``), and ``session.retry()`` of a failed turn links to the failed one
  (``retried``): each stretch records its span's context in the turn's ``data``
  (``{"trace": {...}}``) with its first commit, so another process can link to it.
- ``chat <model>`` (``chat``) per model step, ``execute_tool <tool>`` (``execute_tool``) per
  tool step, ``durable_turns.input`` for a person's stored answer, children of the turn's span.
  Steps a replay skips (already committed) appear as zero-length spans with
  ``durable_turns.replayed`` = true.

Attributes: ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` / ``output_tokens``,
``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.agent.name``, and ours:
``durable_turns.session``, ``.turn_id``, ``.step_id``, ``.replayed``, ``.attempt`` (the attempt
that produced a step's result; each failed attempt is a ``durable_turns.retry`` span event).
A failed step or turn sets the span's status to ``ERROR``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .messages import Message, ToolCall
from .records import (
    ChainEntry,
    InputRequest,
    ModelStepId,
    SessionKey,
    ToolStepId,
    TurnResult,
    TurnStatus,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

TRACER_NAME = "durable_turns"
"""The instrumentation scope the engine's spans are created under."""
_LINKS = {TurnStatus.SUSPENDED.value: "resumed", TurnStatus.FAILED.value: "retried"}
"""``durable_turns.link`` by how the stretch before ended; anything else (a crash, a lost
lease: it never recorded an end) is a replay."""


@functools.cache
def _otel() -> ModuleType | None:
    """``opentelemetry.trace``, or ``None`` when the API is not installed (looked up once)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


def begin_turn(key: SessionKey, turn: ChainEntry, transcript: list[Message],
               model: object) -> TurnTrace | None:
    """Start tracing a stretch of ``turn``, or ``None`` when tracing is off.

    Tracing is off when ``opentelemetry-api`` is not installed or no tracer provider was set
    (``opentelemetry.trace.set_tracer_provider``): then nothing else of this module runs.
    """
    trace = _otel()
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return TurnTrace(trace, provider.get_tracer(TRACER_NAME), key, turn, transcript, model)


def _model_name(model: object) -> str:
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else type(model).__name__


class TurnTrace:
    """The spans of one stretch of a turn; the engine calls it at its step boundaries."""

    def __init__(self, trace: ModuleType, tracer: Tracer, key: SessionKey, turn: ChainEntry,
                 transcript: list[Message], model: object) -> None:
        self._trace = trace
        self._tracer = tracer
        self._model = _model_name(model)
        self._ids = {"durable_turns.session": str(key), "durable_turns.turn_id": turn.turn_id}
        self._open: set[StepSpan] = set()
        self._usage = [0, 0]
        self.pending = True
        """Whether this stretch has yet to record its span's context in the turn's data."""
        links = []
        previous = (turn.data or {}).get("trace")
        if isinstance(previous, Mapping):
            try:
                ctx = trace.SpanContext(int(previous["trace_id"], 16),
                                        int(previous["span_id"], 16), is_remote=True,
                                        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
                why = _LINKS.get(str(previous.get("ended")), "replayed")
                links.append(trace.Link(ctx, {"durable_turns.link": why}))
            except (KeyError, TypeError, ValueError):
                pass  # a record this version cannot read: the new span stands alone
        self.span = tracer.start_span(
            "durable_turns.turn",
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": key.agent,
                        **self._ids},
            links=links,
        )
        self._context = trace.set_span_in_context(self.span)
        self._replayed(turn.turn_id, transcript)

    # -- what the engine records -----------------------------------------------------------

    def record(self, ended: TurnStatus | None = None) -> dict[str, Any]:
        """This span's context, kept under the turn's ``data["trace"]`` by a commit of this
        stretch (its first, and the one that ends or parks it); the turn's other data names
        are never touched."""
        self.pending = False
        ctx = self.span.get_span_context()
        return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
                "ended": ended.value if ended else None}

    # -- steps -----------------------------------------------------------------------------

    def _start(self, name: str, attributes: dict[str, Any]) -> Span:
        return self._tracer.start_span(name, context=self._context,
                                       attributes={**self._ids, **attributes})

    def _replayed(self, turn_id: str, transcript: list[Message]) -> None:
        """Zero-length spans for the steps of this turn that committed before this stretch."""
        start = next((i for i in range(len(transcript) - 1, -1, -1)
                      if transcript[i].turn_id == turn_id and transcript[i].is_opening), None)
        if start is None:
            return
        calls: dict[str, tuple[int, ToolCall]] = {}
        for i in range(start + 1, len(transcript)):
            m = transcript[i]
            if m.role == "assistant":
                calls.update((c.id, (i, c)) for c in m.tool_calls)
                span = self._start(f"chat {self._model}",
                                   self._chat(str(ModelStepId(i)), m.usage))
            elif m.role == "tool" and m.call_id in calls:
                n, call = calls[m.call_id]
                span = self._start(f"execute_tool {call.name}",
                                   self._tool(str(ToolStepId(n, call.id)), call))
            else:
                continue
            span.set_attribute("durable_turns.replayed", True)
            span.end()

    def _chat(self, step_id: str, usage: Mapping[str, int] | None = None) -> dict[str, Any]:
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat",
                                 "gen_ai.request.model": self._model,
                                 "durable_turns.step_id": step_id}
        for ours, theirs in (("input_tokens", "gen_ai.usage.input_tokens"),
                             ("output_tokens", "gen_ai.usage.output_tokens")):
            if usage and ours in usage:
                attrs[theirs] = usage[ours]
        return attrs

    @staticmethod
    def _tool(step_id: str, call: ToolCall) -> dict[str, Any]:
        return {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id, "gen_ai.tool.type": "function",
                "durable_turns.step_id": step_id}

    def model_step(self, step_id: str) -> StepSpan:
        """A model step starts."""
        return self._step_started(self._start(f"chat {self._model}", self._chat(step_id)))

    def tool_step(self, step_id: str, call: ToolCall) -> StepSpan:
        """A tool step starts."""
        return self._step_started(self._start(f"execute_tool {call.name}",
                                              self._tool(step_id, call)))

    def input(self, step_id: str, by: str | None) -> None:
        """A person's answer (given ``by``) was read from step ``step_id`` (a resumed tool
        asked again)."""
        span = self._start("durable_turns.input", {"durable_turns.step_id": step_id})
        if isinstance(by, str):
            span.set_attribute("durable_turns.input.by", by)
        span.end()

    def _step_started(self, span: Span) -> StepSpan:
        step = StepSpan(self, span)
        self._open.add(step)
        return step

    def add_usage(self, usage: Mapping[str, int]) -> None:
        self._usage[0] += int(usage.get("input_tokens", 0))
        self._usage[1] += int(usage.get("output_tokens", 0))

    def error_status(self, description: str) -> Any:
        return self._trace.Status(self._trace.StatusCode.ERROR, description)

    def closed(self, step: StepSpan) -> None:
        self._open.discard(step)

    # -- the end ---------------------------------------------------------------------------

    def end(self, out: TurnResult) -> None:
        """The stretch ended: the turn completed, failed, was cancelled or parked."""
        error = out.error if out.status == TurnStatus.FAILED else None
        for step in list(self._open):  # a step that did not commit: the turn ended inside it
            step.done(error or out.reason or "the turn ended inside this step")
        attrs: dict[str, Any] = {"durable_turns.turn.status": out.status.value}
        if self._usage != [0, 0]:
            attrs["gen_ai.usage.input_tokens"] = self._usage[0]
            attrs["gen_ai.usage.output_tokens"] = self._usage[1]
        if out.reason:
            attrs["durable_turns.turn.reason"] = out.reason
        if out.request is not None:
            attrs["durable_turns.input.id"] = out.request.id
        self.span.set_attributes(attrs)
        if error is not None:
            self.span.set_status(self.error_status(error))
        self.span.end()

    def pause(self) -> None:
        """The stretch stopped between two steps, nothing failed: its scheduler steps the
        turn on later (a Temporal activity runs one step), in a stretch of its own."""
        self.span.set_attributes({"durable_turns.turn.status": "running"})
        self.span.end()

    def abandon(self, e: BaseException) -> None:
        """The stretch stopped on an exception (lease lost, store error, a crashing tool):
        nothing of the current step committed and the turn stays for another drive."""
        for span in [s.span for s in self._open] + [self.span]:
            span.record_exception(e)
            span.set_status(self.error_status(f"{type(e).__name__}: {e}"))
            span.end()
        self._open.clear()


class StepSpan:
    """The span of one step while it runs; the engine reports its retries and its end."""

    __slots__ = ("_attempt", "_turn", "span")

    def __init__(self, turn: TurnTrace, span: Span) -> None:
        self._turn = turn
        self.span = span
        self._attempt = 1

    def retry(self, attempt: int, delay: float, error: str) -> None:
        """Attempt ``attempt`` failed; the step is tried again after ``delay`` seconds."""
        self.span.add_event("durable_turns.retry", {"durable_turns.attempt": attempt,
                                                    "durable_turns.retry.delay": delay,
                                                    "error.message": error})
        self._attempt = attempt + 1

    def model_done(self, usage: Mapping[str, int], stop_reason: str) -> None:
        """The model step committed."""
        for ours, theirs in (("input_tokens", "gen_ai.usage.input_tokens"),
                             ("output_tokens", "gen_ai.usage.output_tokens")):
            if ours in usage:
                self.span.set_attribute(theirs, usage[ours])
        self._turn.add_usage(usage)
        self.span.set_attribute("gen_ai.response.finish_reasons", [stop_reason])
        self.done()

    def parked(self, request: InputRequest) -> None:
        """The tool step parked the turn on ``request``."""
        self.span.set_attributes({"durable_turns.parked": True,
                                  "durable_turns.input.id": request.id})
        self.done()

    def done(self, error: str | None = None) -> None:
        """The step committed (``error``: the error result the model reads), or ended."""
        self._turn.closed(self)
        self.span.set_attribute("durable_turns.attempt", self._attempt)
        if error is not None:
            self.span.set_status(self._turn.error_status(error))
        self.span.end()


__all__ = ["TRACER_NAME", "StepSpan", "TurnTrace", "begin_turn"]
