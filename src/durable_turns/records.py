"""The engine's own records: sessions, turns and their outcome, steps, input requests.

Plain frozen dataclasses built from JSON values; stores persist them, the engine and the
hosts pass them around. This module imports nothing of the package but ``messages``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, cast

from .messages import Message

SessionStatus = Literal["new", "idle", "running", "suspended"]
EntryKind = Literal["turn", "reset", "resume", "retry"]
"""What a chain entry is: a turn, or a command that runs in the chain's order (F2, F6, F8)."""
StepKind = Literal["model", "tool", "input", "child"]


class TurnStatus(StrEnum):
    """Where a turn (or a chain command) stands."""

    QUEUED = "queued"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        """Completed, failed or cancelled: nothing will change it any more."""
        return self in _FINAL

    @property
    def unfinished(self) -> bool:
        """Queued or running: the chain still has to drive it."""
        return self in _UNFINISHED

    @property
    def ended(self) -> bool:
        """Final or suspended: what ``result()`` waits for."""
        return self is not TurnStatus.QUEUED and self is not TurnStatus.RUNNING


_FINAL = frozenset({TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.CANCELLED})
_UNFINISHED = frozenset({TurnStatus.QUEUED, TurnStatus.RUNNING})


@dataclass(frozen=True, slots=True, order=True)
class SessionKey:
    """The address of a session."""

    agent: str
    session: str

    def __str__(self) -> str:
        return f"{self.agent}/{self.session}"


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session's row: its status and its generation (F8)."""

    status: SessionStatus
    generation: int


@dataclass(frozen=True, slots=True)
class InputRequest:
    """What a parked turn waits for (F6)."""

    id: str
    """Stable within the turn: it keys the answer (step ``input:<turn_id>:<id>``)."""
    prompt: str
    schema: dict[str, Any] | None = None
    answerers: dict[str, Any] | None = None
    turn_id: str = ""
    call_id: str = ""
    child: dict[str, str] | None = None
    """Set when a subagent's turn asked (F13): ``{agent, session, turn_id, input_id}`` of the
    child's own request. ``resume()`` on the parent routes the answer there, where the
    child's answerer rules are enforced."""
    more: tuple[InputRequest, ...] = ()
    """Other requests the same turn waits for at once: calls of one parallel batch that
    parked too (F15). Each is answered on its own, by its ``id``."""

    @property
    def all(self) -> tuple[InputRequest, ...]:
        """This request and the ones in :attr:`more`, in call order."""
        return (self, *self.more)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "prompt": self.prompt, "schema": self.schema,
               "answerers": self.answerers, "turn_id": self.turn_id, "call_id": self.call_id}
        if self.child is not None:
            out["child"] = dict(self.child)
        if self.more:
            out["more"] = [r.to_dict() for r in self.more]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputRequest:
        return cls(data["id"], data["prompt"], data.get("schema"), data.get("answerers"),
                   data.get("turn_id", ""), data.get("call_id", ""), data.get("child"),
                   tuple(cls.from_dict(r) for r in data.get("more", ())))


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How a turn ended, or where it parked: the one record of a turn's outcome.

    The engine produces it, the store keeps its fields on the turn's row, ``result()``
    returns it. While a turn runs its status is ``queued`` or ``running`` and the other
    fields are empty.
    """

    turn_id: str
    status: TurnStatus
    text: str | None = None
    """The final reply (``completed``)."""
    request: InputRequest | None = None
    """What the turn waits for (``suspended``)."""
    error: str | None = None
    """Why it failed (``failed``)."""
    reason: str | None = None
    """Why it was cancelled (``cancelled``)."""


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One entry of a session's chain, as the store keeps it."""

    turn_id: str
    ordinal: int
    """Position in the chain: entries run in increasing ordinal."""
    status: TurnStatus
    opening: Message
    """The message that opens a turn (appended to the log once, when the turn starts)."""
    event: dict[str, Any] | None = None
    """The inbound event, minus ``raw``."""
    policy: dict[str, Any] | None = None
    """The surface policy the turn runs under."""
    request: InputRequest | None = None
    """The pending input request while suspended."""
    text: str | None = None
    error: str | None = None
    reason: str | None = None
    cancel: str | None = None
    """A durable cancellation request's reason, if one was made."""
    kind: EntryKind = "turn"
    data: dict[str, Any] | None = None
    """A command's arguments and outcome (a resume's answer, a reset's generation)."""

    @property
    def result(self) -> TurnResult:
        return TurnResult(self.turn_id, self.status, self.text, self.request, self.error,
                          self.reason)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A checkpointed step: its id, turn, kind and JSON memo."""

    id: str
    turn_id: str
    data: str
    """The step's memo as JSON text (a model step's stop reason, a tool message's index, a
    person's answer)."""

    @property
    def kind(self) -> StepKind:
        """``model``, ``tool``, ``input`` or ``child``, read off the step id."""
        return cast(StepKind, self.id.partition(":")[0])


def input_step_id(turn_id: str, input_id: str) -> str:
    """The id of the step that stores a person's answer."""
    return f"input:{turn_id}:{input_id}"


def resume_entry_id(turn_id: str, input_id: str) -> str:
    """The chain entry of an answer: one per (turn, input), so a repeat is a redelivery."""
    return f"resume:{turn_id}:{input_id}"
