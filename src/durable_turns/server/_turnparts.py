"""A turn's events as the parts a frontend protocol shows: steps, text, reasoning, tool calls,
a park, an end — what the AI SDK's UI message stream (``_ai_sdk.py``) and AG-UI (``_ag_ui.py``)
both render, each in its own words.

One rule lives here, for both: **a message's text is shown once, whole**. Live text
(``message.delta``) is never stored, so a stream that joins a turn late (a reload that
resumes it, a redelivered run) cannot have the start of the model step under way when it
joined. Its live pieces of that step are held back, and the step's stored
``message.completed`` gives the whole text at once. A step seen from its start is streamed
live, and its ``message.completed`` adds only what a lost live piece left out (a lost piece
in the middle, or a model call tried again after it had streamed, resets the step: see
:class:`ResetStep`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..events import (
    ActionCompleted,
    InputRequested,
    MessageCompleted,
    MessageDelta,
    MessageRetry,
    MessageThinking,
    TurnCancelled,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
)
from ..messages import ToolCall
from ..records import InputRequest, resume_entry_id


@dataclass(frozen=True, slots=True)
class StepStart:
    """A model step begins (one model call and the tool calls it asks for)."""


@dataclass(frozen=True, slots=True)
class StepEnd:
    """The step ends: the next model call begins, or the turn ends or parks."""


@dataclass(frozen=True, slots=True)
class ResetStep:
    """What the current step showed is void (a model call tried again after it had streamed,
    or live text that the stored reply does not continue): the step starts over."""


@dataclass(frozen=True, slots=True)
class TextStart:
    """A piece of answer text begins; ``id`` is stable for a step, live or replayed."""

    id: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    """More of the text ``id``."""

    id: str
    text: str


@dataclass(frozen=True, slots=True)
class TextEnd:
    """The text ``id`` is whole."""

    id: str


@dataclass(frozen=True, slots=True)
class ReasoningStart:
    """The model's reasoning begins (live only: a replay has none)."""

    id: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """More of the reasoning ``id``."""

    id: str
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningEnd:
    """The reasoning ``id`` ends."""

    id: str


@dataclass(frozen=True, slots=True)
class ToolInput:
    """The model asked for a call."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A call's result: ``error`` is set when the tool failed (the result says why)."""

    call: ToolCall
    result: Any
    error: str | None


@dataclass(frozen=True, slots=True)
class Parked:
    """The turn waits for people: each request is answered on its own."""

    requests: tuple[InputRequest, ...]


@dataclass(frozen=True, slots=True)
class Ended:
    """The turn ended: ``status`` completed (``detail``: its text), failed (its error) or
    cancelled (why)."""

    status: str
    detail: str


Part = (StepStart | StepEnd | ResetStep | TextStart | TextDelta | TextEnd | ReasoningStart
        | ReasoningDelta | ReasoningEnd | ToolInput | ToolOutput | Parked | Ended)
"""What :class:`TurnParts` gives."""


def request_id(request: InputRequest) -> str:
    """The id a protocol gives a person's request (an approval's id, an interrupt's): the id
    of its answer's chain entry, ``resume:<turn_id>:<input_id>`` (so an answer given again
    finds the one stored)."""
    return resume_entry_id(request.turn_id, request.id)


def is_yes_no(request: InputRequest) -> bool:
    """Whether the request asks for a boolean (an approval), as its JSON schema says."""
    return isinstance(request.schema, dict) and request.schema.get("type") == "boolean"


class TurnParts:
    """Turns one turn's events into :data:`Part` values, in order, with the text rule of the
    module.

    Args:
        turn_id: the turn (events of other turns and those a subagent forwards are skipped).
        joined: ``TurnStream.joined``: live text carrying a seq up to it is held back.
    """

    def __init__(self, turn_id: str, joined: int = 0) -> None:
        self.turn_id = turn_id
        self.joined = joined
        self._in_step = False
        self._step_done = False  # its reply came: the next model event starts a new step
        self._step_seq = 0  # the durable event before the step: its parts' ids
        self._last_durable = 0
        self._text: str | None = None  # what the open text showed, or None
        self._reasoning = False
        self._held = False  # live text of this step is not shown (see the module)

    def feed(self, event: TurnEvent) -> list[Part]:
        """The parts ``event`` adds (often none)."""
        if event.turn_id != self.turn_id or event.child is not None:
            return []
        out: list[Part] = []
        if isinstance(event, MessageDelta | MessageThinking):
            self._model_event(event.seq, out)
            if self._held:
                return out
            if isinstance(event, MessageDelta):
                self._close_reasoning(out)
                if self._text is None:
                    self._text = ""
                    out.append(TextStart(self._id("text")))
                self._text += event.text
                out.append(TextDelta(self._id("text"), event.text))
            else:
                if self._text is not None:
                    # Reasoning after the answer began is not shown: one text part per
                    # step keeps the answer whole and once (and reasoning is live only).
                    return out
                if not self._reasoning:
                    self._reasoning = True
                    out.append(ReasoningStart(self._id("reasoning")))
                out.append(ReasoningDelta(self._id("reasoning"), event.text))
            return out
        if isinstance(event, MessageRetry):
            if self._in_step and not self._step_done and (self._text or self._reasoning):
                self._text, self._reasoning = None, False
                out += [ResetStep(), StepStart()]
            self._held = True  # the next attempt's text comes whole with its reply
            return out
        if not event.durable:
            return out  # a tool's retry notice: nothing to show
        if isinstance(event, MessageCompleted):
            self._model_event(self._last_durable, out)
            self._reply(event, out)
        elif isinstance(event, ActionCompleted):
            out.append(ToolOutput(event.call, event.result, event.error))
        elif isinstance(event, InputRequested):
            out += self._end_step()
            out.append(Parked(event.request.all))
        elif isinstance(event, TurnCompleted):
            out += [*self._end_step(), Ended("completed", event.text)]
        elif isinstance(event, TurnFailed):
            out += [*self._end_step(), Ended("failed", event.error)]
        elif isinstance(event, TurnCancelled):
            out += [*self._end_step(), Ended("cancelled", event.reason)]
        self._last_durable = event.seq
        return out

    def _id(self, kind: str) -> str:
        return f"{self.turn_id}:{self._step_seq}:{kind}"

    def _model_event(self, seq: int, out: list[Part]) -> None:
        """A model step's event: open the step if none is, or if the last one's reply came."""
        if self._in_step and not self._step_done:
            return
        out += self._end_step()
        self._in_step, self._step_done, self._step_seq = True, False, seq
        self._held = seq <= self.joined and self.joined > 0
        out.append(StepStart())

    def _reply(self, event: MessageCompleted, out: list[Part]) -> None:
        whole = event.text
        self._close_reasoning(out)
        shown = self._text
        if shown is not None and not whole.startswith(shown):
            # A live piece was lost: the stored reply is the truth, shown anew.
            out += [ResetStep(), StepStart()]
            shown = None
        if shown is None and whole:
            out += [TextStart(self._id("text")), TextDelta(self._id("text"), whole)]
            shown = whole
        if shown is not None:
            if len(whole) > len(shown):
                out.append(TextDelta(self._id("text"), whole[len(shown):]))
            out.append(TextEnd(self._id("text")))
        self._text = None
        out += [ToolInput(call) for call in event.tool_calls]
        self._step_done = True

    def _close_reasoning(self, out: list[Part]) -> None:
        if self._reasoning:
            out.append(ReasoningEnd(self._id("reasoning")))
            self._reasoning = False

    def _end_step(self) -> list[Part]:
        out: list[Part] = []
        if not self._in_step:
            return out
        self._close_reasoning(out)
        if self._text is not None:
            out.append(TextEnd(self._id("text")))
            self._text = None
        self._in_step = False
        out.append(StepEnd())
        return out


__all__ = [
    "Ended", "Parked", "Part", "ReasoningDelta", "ReasoningEnd", "ReasoningStart",
    "ResetStep", "StepEnd", "StepStart", "TextDelta", "TextEnd", "TextStart", "ToolInput",
    "ToolOutput", "TurnParts", "is_yes_no", "request_id",
]
