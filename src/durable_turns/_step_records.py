"""The engine's step records: each step kind's id (``model:<n>``, ``tool:<n>:<call_id>``, …)
and what its checkpoint keeps, with the one codec that reads a stored memo back.

Re-exported by ``durable_turns.records``, where every name is documented to be imported from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

from ._compact_memo import CompactionMemo, CompactStepId
from .messages import encode_json

StepKind = Literal["model", "tool", "input", "child", "intent", "compact"]

@dataclass(frozen=True, slots=True)
class ModelStepId:
    """``model:<n>``: the model call whose reply gets transcript index ``n``."""

    n: int
    kind: ClassVar[StepKind] = "model"

    def __str__(self) -> str:
        return f"model:{self.n}"


@dataclass(frozen=True, slots=True)
class ToolStepId:
    """``tool:<n>:<call_id>``: a call of the assistant message at transcript index ``n``."""

    n: int
    call_id: str
    kind: ClassVar[StepKind] = "tool"

    def __str__(self) -> str:
        return f"tool:{self.n}:{self.call_id}"


@dataclass(frozen=True, slots=True)
class InputStepId:
    """``input:<turn_id>:<input_id>``: a person's answer to a request of the turn (F6)."""

    turn_id: str
    input_id: str
    kind: ClassVar[StepKind] = "input"

    def __str__(self) -> str:
        return f"input:{self.turn_id}:{self.input_id}"


@dataclass(frozen=True, slots=True)
class ChildStepId:
    """``child:<turn_id>:<call_id>``: the child turn a subagent call started (F13)."""

    turn_id: str
    call_id: str
    kind: ClassVar[StepKind] = "child"

    def __str__(self) -> str:
        return f"child:{self.turn_id}:{self.call_id}"


@dataclass(frozen=True, slots=True)
class IntentStepId:
    """``intent:<n>:<attempt>:<call_id>``: attempt ``attempt`` of a remote call, written
    before it runs when its tool is not ``in_doubt="rerun"`` (F26)."""

    n: int
    attempt: int
    call_id: str
    kind: ClassVar[StepKind] = "intent"

    def __str__(self) -> str:
        return f"intent:{self.n}:{self.attempt}:{self.call_id}"


StepId = ModelStepId | ToolStepId | InputStepId | ChildStepId | IntentStepId | CompactStepId
"""A step's id: printed by ``str()``, read back by :func:`parse_step_id`."""

HOT_STEP_PREFIXES = ("model:", "tool:")
"""How the ids of the steps a turn's loop writes on every call begin; the other kinds (a
person's answer, a subagent's record) are looked up by id."""


def parse_step_id(text: str, turn_id: str = "") -> StepId:
    """The step id ``text`` names. ``turn_id`` (the step's turn) separates an ``input:`` or
    ``child:`` id's turn from its own part, since turn ids may hold ``:`` themselves.

    Raises:
        ValueError: not a step id.
    """
    kind, _, rest = text.partition(":")
    try:
        if kind in ("model", "tool", "intent", "compact"):
            n, _, call_id = rest.partition(":")
            if kind in ("model", "compact") and not call_id:
                return ModelStepId(int(n)) if kind == "model" else CompactStepId(int(n))
            if kind == "tool" and call_id:
                return ToolStepId(int(n), call_id)
            attempt, _, own = call_id.partition(":")
            if kind == "intent" and own:
                return IntentStepId(int(n), int(attempt), own)
        elif kind in ("input", "child") and rest:
            if turn_id and rest.startswith(f"{turn_id}:"):
                own = rest[len(turn_id) + 1:]
            else:
                turn_id, _, own = rest.rpartition(":")
            if turn_id and own:
                return InputStepId(turn_id, own) if kind == "input" else ChildStepId(turn_id,
                                                                                     own)
    except ValueError:
        pass
    raise ValueError(f"not a step id: {text!r}")


@dataclass(frozen=True, slots=True)
class ModelMemo:
    """What a model step keeps: where its reply is, and how the model stopped."""

    m: int
    """The reply's transcript index."""
    stop: str | None = None

    def to_json(self) -> str:
        return encode_json({"m": self.m, "stop": self.stop})


@dataclass(frozen=True, slots=True)
class ToolMemo:
    """What a tool step keeps: where its tool message is (the result lives there)."""

    m: int

    def to_json(self) -> str:
        return f'{{"m":{int(self.m)}}}'  # the most common step: no encoder needed


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """A parallel call's result, kept by its step until its tool message is written (F15)."""

    result: Any
    error: str | None = None

    def to_json(self) -> str:
        return encode_json({"r": self.result, "e": self.error})


@dataclass(frozen=True, slots=True)
class Answer:
    """A person's answer to an input request (F6)."""

    value: Any
    by: str | None = None

    def to_json(self) -> str:
        return encode_json({"value": self.value, "by": self.by})


@dataclass(frozen=True, slots=True)
class ChildMemo:
    """The child turn a subagent call started (F13), recorded before it starts."""

    agent: str
    session: str
    turn_id: str

    def to_json(self) -> str:
        return encode_json({"agent": self.agent, "session": self.session,
                            "turn_id": self.turn_id})


@dataclass(frozen=True, slots=True)
class Intent:
    """A remote call about to run (F26): which tool, its attempt (1, then one more each time
    it is run again after it was in doubt), its idempotency key and when (Unix seconds)."""

    tool: str
    attempt: int
    key: str
    at: float

    def to_json(self) -> str:
        return encode_json({"tool": self.tool, "attempt": self.attempt, "key": self.key,
                            "at": self.at})


StepResult = ModelMemo | ToolMemo | CallOutcome | Answer | ChildMemo | Intent | CompactionMemo
"""What a step keeps, by kind: :class:`ModelMemo`, :class:`ToolMemo` (:class:`CallOutcome` in a
batch), :class:`Answer`, :class:`ChildMemo`, :class:`Intent`, :class:`CompactionMemo`."""


def decode_step(kind: StepKind, data: str) -> StepResult:
    """A stored step memo read back (what its ``to_json()`` wrote), by its step's kind.

    Raises ``ValueError`` for a memo of another shape than its kind keeps."""
    d = json.loads(data)
    if not isinstance(d, dict):
        raise ValueError(f"not a step memo: {data[:80]!r}")
    if kind == "tool":
        return CallOutcome(d["r"], d.get("e")) if "r" in d else ToolMemo(int(d["m"]))
    if kind == "model":
        return ModelMemo(int(d["m"]), d.get("stop"))
    if kind == "input":
        return Answer(d.get("value"), d.get("by"))
    if kind == "child":
        return ChildMemo(str(d["agent"]), str(d["session"]), str(d["turn_id"]))
    if kind == "intent":
        return Intent(str(d["tool"]), int(d["attempt"]), str(d["key"]), float(d["at"]))
    if kind == "compact":
        return CompactionMemo.from_dict(d)
    raise ValueError(f"unknown step kind {kind!r}")


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A checkpointed step, as a store keeps it: its id, turn and stored memo."""

    id: str
    turn_id: str
    data: str
    """The step's memo as stored JSON (its ``to_json()``; :func:`decode_step` reads it)."""

    @property
    def kind(self) -> StepKind:
        """``model``, ``tool``, ``input``, ``child`` or ``intent``, read off the step id."""
        return cast(StepKind, self.id.partition(":")[0])

    @property
    def step(self) -> StepId:
        """The step's id, parsed."""
        return parse_step_id(self.id, self.turn_id)

    @property
    def result(self) -> StepResult:
        """What the step keeps, decoded."""
        return decode_step(self.kind, self.data)


__all__ = [
    "HOT_STEP_PREFIXES",
    "Answer",
    "CallOutcome",
    "ChildMemo",
    "ChildStepId",
    "InputStepId",
    "Intent",
    "IntentStepId",
    "ModelMemo",
    "ModelStepId",
    "StepId",
    "StepKind",
    "StepRecord",
    "StepResult",
    "ToolMemo",
    "ToolStepId",
    "decode_step",
    "parse_step_id",
]
