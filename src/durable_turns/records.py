"""The engine's own records: sessions, turns and their outcome, steps, input requests.

Plain frozen dataclasses built from JSON values; stores persist them, the engine and the
hosts pass them around. The steps' ids and memos live in ``_step_records`` and are
re-exported here. It imports only ``messages`` and those of the package.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, cast

from ._step_records import (
    HOT_STEP_PREFIXES,
    Answer,
    CallOutcome,
    ChildMemo,
    ChildStepId,
    InputStepId,
    Intent,
    IntentStepId,
    ModelMemo,
    ModelStepId,
    StepId,
    StepKind,
    StepRecord,
    StepResult,
    ToolMemo,
    ToolStepId,
    decode_step,
    parse_step_id,
)
from .messages import Message, decode_message, encode_json, encode_message

SessionStatus = Literal["new", "idle", "running", "suspended"]
EntryKind = str
"""What a chain entry is: ``turn``, or the kind of a queued command that runs in the chain's
order (``reset``, ``resume``, ``retry``, or any the runtime's command registry knows)."""
WhileParked = Literal["refused", "accepted", "clears"]
"""What accepting a chain entry does while a turn of the session is parked (its request standing):
``refused`` — ``SessionBusyError``, unless an entry that ``clears`` is queued before it (a turn's
rule); ``accepted`` — queued all the same (a command's default: its place comes once the park
ends); ``clears`` — accepted, and while it is queued the entries sent after it are accepted too,
as its place ends the park (a reset's). Declared by the entry (``NewEntry.while_parked``), kept
with it, and applied by the store."""


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
    """A session's row: its status, its generation (F8) and who owns it."""

    status: SessionStatus
    generation: int
    owner: str | None = None
    """The principal that created the session through an authenticated host
    (``SessionQueries.own_session``); ``None`` for one made otherwise (a channel, the CLI, a
    host in development mode). Set once, never changed."""


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
    expires: str | None = None
    """When it is answered by the clock if nobody answers first (ISO time, UTC; F24): a
    request with a deadline (``request_input(timeout=…)``) is answered then with
    :attr:`default`, ``by="timeout"``; a sleep (:attr:`sleep`) wakes then."""
    default: Any = None
    """The answer a request with a deadline gets when it expires."""
    remind_every: float | None = None
    """Seconds between ``input.reminder`` events while it stands unanswered."""
    remind_at: str | None = None
    """When the first reminder is due (ISO time, UTC)."""
    sleep: bool = False
    """A sleeping tool's wait (``ctx.sleep``): only the clock answers it, at :attr:`expires`."""

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
        if self.expires is not None:
            out["expires"] = self.expires
            out["default"] = self.default
        if self.remind_every is not None:
            out["remind_every"] = self.remind_every
            out["remind_at"] = self.remind_at
        if self.sleep:
            out["sleep"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputRequest:
        return cls(data["id"], data["prompt"], data.get("schema"), data.get("answerers"),
                   data.get("turn_id", ""), data.get("call_id", ""), data.get("child"),
                   tuple(cls.from_dict(r) for r in data.get("more", ())),
                   expires=data.get("expires"), default=data.get("default"),
                   remind_every=data.get("remind_every"), remind_at=data.get("remind_at"),
                   sleep=bool(data.get("sleep", False)))


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """What a host shows of a session: where it stands and what it waits for
    (``SessionStore.session_summaries``: its row and the request it is parked on)."""

    key: SessionKey
    status: SessionStatus = "new"
    generation: int = 0
    pending: InputRequest | None = None
    """The standing request it is parked on (a cancel withdraws it)."""
    exists: bool = True
    """Whether the store has the session (a turn or a reset was accepted for it, or a
    principal took it as its own); a session it does not have is ``new``, generation 0."""
    owner: str | None = None
    """Who owns it (:attr:`SessionInfo.owner`)."""

    def to_dict(self) -> dict[str, Any]:
        """As JSON values (what hosts answer)."""
        return {"agent": self.key.agent, "session": self.key.session, "status": self.status,
                "generation": self.generation,
                "pending": self.pending.to_dict() if self.pending else None,
                "owner": self.owner}


@dataclass(frozen=True, slots=True)
class Visibility:
    """Which of an agent's sessions a listing shows one principal
    (``SessionQueries.session_summaries(visible=…)``): those it owns, and those parked on a
    request it may answer. The store applies it in its query, so a listing never reads the
    sessions it leaves out."""

    owner: str | None = None
    """Sessions whose :attr:`SessionInfo.owner` is this."""
    answerer: str | None = None
    """Sessions parked on a request (or a request of its parallel batch, ``more``) whose
    answerers are ``{"user": answerer}``."""
    policies: tuple[str, ...] = ()
    """Sessions parked on a request answered under one of these policies
    (``{"policy": p, "scope": …}``)."""


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
    output: Any = None
    """The validated final answer (``turn(output=…)``, F25): JSON, or ``turn()``'s model."""

    def to_dict(self) -> dict[str, Any]:
        """The outcome as JSON values (what hosts answer); ``output`` only if there is one."""
        out = {"turn_id": self.turn_id, "status": self.status.value, "text": self.text,
               "request": self.request.to_dict() if self.request else None,
               "error": self.error, "reason": self.reason}
        if self.output is not None:
            dump = getattr(self.output, "model_dump", None)
            out["output"] = dump(mode="json") if callable(dump) else self.output
        return out


OUTPUT = "output"
"""The turn data that keeps its validated final answer, written with its end (F25)."""


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """One entry of a session's chain, as the store keeps it: a turn, or a command that
    runs in the chain's order (``kind``)."""

    turn_id: str
    ordinal: int
    """Position in the chain: entries run in increasing ordinal."""
    status: TurnStatus
    opening: Message | None
    """The message that opens a turn (appended to the log once, when the turn starts);
    ``None`` for a command."""
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
    args: dict[str, Any] | None = None
    """A command's arguments (a resume's answer, a retry's turn); ``None`` for a turn."""
    data: dict[str, Any] | None = None
    """State its owners keep on the entry, one name each (``trace``, a channel's delivery
    state, a reset's archived generation), written one name at a time and never replaced
    whole (``SessionStore.set_turn_data``, ``Transaction.set_turn_data``)."""
    deliver: str | None = None
    """The channel (by name) that owes this entry a delivery, until the delivery is settled
    (``SessionStore.settle_delivery``); then, and for an entry nobody owes one, ``None``."""

    @property
    def result(self) -> TurnResult:
        output = (self.data or {}).get(OUTPUT) if self.status is TurnStatus.COMPLETED else None
        return TurnResult(self.turn_id, self.status, self.text, self.request, self.error,
                          self.reason, output)

    @property
    def parked(self) -> bool:
        """Suspended on a request nobody withdrew: what a person may answer."""
        return self.status is TurnStatus.SUSPENDED and self.cancel is None

    @property
    def settled(self) -> bool:
        """Ended, or parked on a standing request: what ``result()`` waits for."""
        return self.status.final or self.parked

    @property
    def needs_driving(self) -> bool:
        """Queued, running, or parked with a cancel to carry out: work for a driver."""
        return self.status.unfinished or (self.status is TurnStatus.SUSPENDED
                                          and self.cancel is not None)


@dataclass(frozen=True, slots=True)
class NewEntry:
    """A chain entry to accept (``SessionStore.enqueue``): a turn or a command."""

    turn_id: str
    opening: Message | None = None
    """A turn's opening message (``kind="turn"``)."""
    kind: EntryKind = "turn"
    args: dict[str, Any] | None = None
    """A command's arguments."""
    event: dict[str, Any] | None = None
    policy: dict[str, Any] | None = None
    supersede: str | None = None
    """Ask every queued or running turn of the session to cancel, with this reason
    (``replace=True``; a command that supersedes gives its own, as a reset does)."""
    deliver: str | None = None
    """The channel (by name) that owes the turn a delivery: set when a channel accepts it,
    read back as ``ChainEntry.deliver`` and listed by ``SessionStore.owed_deliveries``
    until settled."""
    data: dict[str, Any] | None = None
    """Names of the entry's data set as it is accepted, in the same write (``ChainEntry.
    data``): what must never exist without the entry, nor the entry without it (an HTTP
    request's idempotency fingerprint)."""
    while_parked: WhileParked | None = None
    """What accepting it does while a turn is parked (:data:`WhileParked`); ``None``: its
    kind's rule, ``refused`` for a turn, ``accepted`` for a command. A command declares its
    own in its record's ``entry()`` (a reset's ``clears``); a turn's is never ``clears``."""

    @property
    def parked_rule(self) -> WhileParked:
        """:attr:`while_parked`, or its kind's rule."""
        if self.while_parked is not None:
            return self.while_parked
        return "refused" if self.kind == "turn" else "accepted"


def encode_entry(entry: NewEntry) -> str:
    """What a chain entry's row keeps as its body: a turn's opening message, or a command's
    arguments (``{"args": …}``) and its rule while parked, when it declares one."""
    if entry.kind == "turn":
        if entry.opening is None:
            raise ValueError(f"turn {entry.turn_id!r} has no opening message")
        if entry.while_parked == "clears":
            raise ValueError(f"turn {entry.turn_id!r}: only a command's place ends a park "
                             "(while_parked='clears')")
        return encode_message(entry.opening)
    if entry.while_parked is None:
        return encode_json({"args": entry.args or {}})
    return encode_json({"args": entry.args or {}, "while_parked": entry.while_parked})


def decode_while_parked(kind: EntryKind, body: str | None) -> WhileParked:
    """A stored entry's rule while parked (:data:`WhileParked`), from its kind and, for a
    command, its row's body (``None`` for a turn: its kind's rule)."""
    if kind == "turn" or body is None:
        return "refused" if kind == "turn" else "accepted"
    rule = json.loads(body).get("while_parked", "accepted")
    return cast(WhileParked, rule)


def decode_entry(kind: EntryKind, body: str, data: dict[str, Any] | None
                 ) -> tuple[Message | None, dict[str, Any] | None, dict[str, Any] | None]:
    """A row's body read back: ``(opening, args, data)``. A command accepted before commands
    kept their own arguments (its body a ``trigger`` message) has them in ``data``."""
    if kind == "turn":
        return decode_message(body), None, data
    found = json.loads(body)
    if "args" in found:
        return None, dict(found["args"]), data
    return None, dict(data or {}), None


def resume_entry_id(turn_id: str, input_id: str) -> str:
    """The chain entry of an answer: one per (turn, input), so a repeat is a redelivery."""
    return f"resume:{turn_id}:{input_id}"


__all__ = [
    "HOT_STEP_PREFIXES",
    "OUTPUT",
    "Answer",
    "CallOutcome",
    "ChainEntry",
    "ChildMemo",
    "ChildStepId",
    "EntryKind",
    "InputRequest",
    "InputStepId",
    "Intent",
    "IntentStepId",
    "ModelMemo",
    "ModelStepId",
    "NewEntry",
    "SessionInfo",
    "SessionKey",
    "SessionStatus",
    "SessionSummary",
    "StepId",
    "StepKind",
    "StepRecord",
    "StepResult",
    "ToolMemo",
    "ToolStepId",
    "TurnResult",
    "TurnStatus",
    "Visibility",
    "WhileParked",
    "decode_entry",
    "decode_step",
    "decode_while_parked",
    "encode_entry",
    "parse_step_id",
    "resume_entry_id",
]
