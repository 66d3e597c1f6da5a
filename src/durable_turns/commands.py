"""Commands: what is asked of a session besides a turn — reset it, answer its parked turn,
retry a failed turn, cancel turns (F2, F6, F7, F8).

Each command has one home here: what it is, how it is checked, and what it does. The check
is written once and run twice: when the command is accepted, and again when its place in
the chain comes, since the session may have changed in between (a reset may come first).
:class:`Reset`, :class:`Resume` and :class:`Retry` are chain entries: accepted with their
own arguments, they keep their place among the turns and the session's driver applies them.
:class:`Cancel` is not: it takes effect at once, at the next checkpoint boundary of the turns
it reaches, and a parked turn it reaches ends in its place in the chain.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .checkpoints import Checkpoints
from .errors import ResumeConflictError, TurnConflictError, UnknownTurnError
from .events import TurnCancelled, TurnEvent
from .messages import Message
from .records import (
    Answer,
    EntryKind,
    InputRequest,
    InputStepId,
    NewEntry,
    SessionKey,
    TurnRecord,
    TurnResult,
    TurnStatus,
    resume_entry_id,
)
from .stores import Transaction

RESET = "reset"
"""The name a reset keeps its outcome under (``{"archived": generation}``), on its entry."""


@dataclass(frozen=True, slots=True)
class Place:
    """A command's place in the chain, when its turn comes: what it sees and commits with."""

    entry: TurnRecord
    """The command's own chain entry."""
    pending: Sequence[TurnRecord]
    """The session's unfinished entries, in chain order (parked turns among them)."""
    checkpoints: Checkpoints
    """How it commits (fenced by the driver's lease), and the live transcript."""
    find: Callable[[str], Awaitable[TurnRecord | None]]
    """Reads a chain entry by id."""

    @property
    def parked(self) -> list[TurnRecord]:
        """The turns parked on a standing request."""
        return [t for t in self.pending if t.parked]

    async def end(self, result: TurnResult, *, reopen: str | None = None,
                  answer: tuple[InputStepId, Answer] | None = None) -> TurnResult:
        """Commit the command's outcome, and with it: turn ``reopen`` running again (its
        place in the chain comes next), after storing ``answer`` (a person's) for it."""
        async def fill(tx: Transaction) -> list[TurnEvent]:
            if answer is not None and reopen is not None:
                tx.add_step(answer[0], reopen, answer[1])
            tx.set_turn(result)
            if reopen is not None:
                tx.set_turn(TurnResult(reopen, TurnStatus.RUNNING))
                tx.set_status("running")
            return []

        await self.checkpoints.commit(fill)
        return result


@dataclass(frozen=True, slots=True)
class Reset:
    """Retire the session's history, keeping its address (F8).

    At its place: the live generation's messages and steps are archived under its number,
    the turns parked on a request are cancelled (reason ``reset``), the status becomes
    ``new``; its entry keeps ``data["reset"] = {"archived": generation}``. When accepted, the
    turns queued or running before it are asked to cancel (reason ``reset``).
    """

    entry_id: str = field(default_factory=lambda: f"reset:{uuid.uuid4().hex}")
    kind: ClassVar[EntryKind] = "reset"

    def entry(self) -> NewEntry:
        return NewEntry(self.entry_id, kind=self.kind)

    @classmethod
    def from_entry(cls, entry: TurnRecord) -> Reset:
        return cls(entry.turn_id)

    async def apply(self, at: Place) -> TurnResult:
        done = TurnResult(at.entry.turn_id, TurnStatus.COMPLETED)
        cp = at.checkpoints
        parked = [t for t in at.pending if t.status == TurnStatus.SUSPENDED]

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.set_turn(done)
            tx.set_turn_data(done.turn_id, RESET, {"archived": cp.lease.generation})
            tx.new_generation()
            return [tx.add_event(TurnCancelled(**cp.ids(t.turn_id), reason="reset"))
                    for t in parked]

        await cp.commit(fill)
        cp.transcript.clear()
        return done


@dataclass(frozen=True, slots=True)
class Resume:
    """A person's answer to the request a parked turn waits on (F6).

    At its place: the answer becomes step ``input:<turn_id>:<input_id>`` and the parked turn
    runs again (its tool asks again and gets the answer). One entry per request
    (``resume:<turn_id>:<input_id>``), so the same answer given twice is one answer.
    """

    turn_id: str
    input_id: str
    value: Any = None
    by: str | None = None
    """Who answered: a verified identity."""
    at: float | None = None
    """When it was answered (Unix seconds): a turn's timeline shows the wait."""
    kind: ClassVar[EntryKind] = "resume"

    @property
    def entry_id(self) -> str:
        return resume_entry_id(self.turn_id, self.input_id)

    def entry(self) -> NewEntry:
        return NewEntry(self.entry_id, kind=self.kind, args={
            "turn_id": self.turn_id, "input_id": self.input_id, "value": self.value,
            "by": self.by, "at": self.at})

    @classmethod
    def from_entry(cls, entry: TurnRecord) -> Resume:
        args = entry.args or {}
        return cls(str(args.get("turn_id")), str(args.get("input_id")), args.get("value"),
                   args.get("by"), args.get("at"))

    def same_answer(self, other: Resume) -> bool:
        """Whether ``other`` gives the same answer by the same person (a double click)."""
        return (self.value, self.by) == (other.value, other.by)

    def request(self, key: SessionKey, pending: Sequence[TurnRecord], *,
                before: int | None = None) -> InputRequest:
        """The request this answers: the check of every resume, when accepted and at its
        place.

        Args:
            key: the session (for the error).
            pending: its unfinished entries.
            before: the resume's own place: only resets queued before it count (``None``:
                all of them, for one not accepted yet).

        Raises:
            ResumeConflictError: a reset is pending before it, the session is not parked, or
                not on this turn or input.
        """
        ids = {"session": str(key), "turn_id": self.turn_id, "input_id": self.input_id}
        if any(t.kind == "reset" and (before is None or t.ordinal < before) for t in pending):
            raise ResumeConflictError(
                f"a reset of session {key} is pending; its park is being archived", **ids)
        parked = next((t for t in pending if t.parked), None)
        if parked is None or parked.request is None:
            raise ResumeConflictError(f"session {key} is not waiting for input", **ids)
        if parked.turn_id != self.turn_id:
            raise ResumeConflictError(
                f"session {key} is parked on turn {parked.turn_id!r}, not {self.turn_id!r}",
                **ids)
        found = next((r for r in parked.request.all if r.id == self.input_id), None)
        if found is None:
            waits = [r.id for r in parked.request.all]
            raise ResumeConflictError(
                f"turn {self.turn_id!r} waits for input {' or '.join(map(repr, waits))}, not "
                f"{self.input_id!r}", **ids)
        return found

    async def apply(self, at: Place) -> TurnResult:
        own = at.entry.turn_id
        try:
            self.request(at.checkpoints.lease.key, at.pending, before=at.entry.ordinal)
        except ResumeConflictError as e:
            return await at.end(TurnResult(own, TurnStatus.FAILED, error=str(e)))
        return await at.end(TurnResult(own, TurnStatus.COMPLETED), reopen=self.turn_id,
                            answer=(InputStepId(self.turn_id, self.input_id),
                                    Answer(self.value, self.by)))


@dataclass(frozen=True, slots=True)
class Retry:
    """Re-open a failed turn where it failed; finished steps stay (F2).

    Only the session's latest turn can be re-opened (a later turn has built on its
    failure). One entry per failure (``retry:<turn_id>:<seq of its turn.failed>``), so asking
    twice before it runs is one retry.
    """

    turn_id: str
    failure: int = 0
    """The ``seq`` of the failure it retries."""
    kind: ClassVar[EntryKind] = "retry"

    @property
    def entry_id(self) -> str:
        return f"retry:{self.turn_id}:{self.failure}"

    def entry(self) -> NewEntry:
        return NewEntry(self.entry_id, kind=self.kind, args={"turn_id": self.turn_id})

    @classmethod
    def from_entry(cls, entry: TurnRecord) -> Retry:
        return cls(str((entry.args or {}).get("turn_id")))

    def problem(self, target: TurnRecord | None, latest: str | None) -> str | None:
        """Why the turn cannot be re-opened (``None``: it can): the check of every retry,
        when accepted and at its place. ``latest``: the turn the transcript's last opening
        message belongs to."""
        if target is None or target.kind != "turn":
            return f"the session has no turn {self.turn_id!r}"
        if target.status != TurnStatus.FAILED:
            return f"turn {self.turn_id!r} is {target.status}, not failed"
        if latest != self.turn_id:
            return (f"turn {self.turn_id!r} is not the session's latest turn ({latest!r} ran "
                    "after it); start a new turn instead")
        return None

    def check(self, key: SessionKey, target: TurnRecord | None, latest: str | None) -> None:
        """:meth:`problem` as the exception a caller gets.

        Raises:
            UnknownTurnError: the session has no such turn.
            TurnConflictError: it did not fail, or a later turn ran after it.
        """
        problem = self.problem(target, latest)
        if problem is None:
            return
        if target is None or target.kind != "turn":
            raise UnknownTurnError(str(key), self.turn_id)
        raise TurnConflictError(problem, session=str(key), turn_id=self.turn_id)

    async def apply(self, at: Place) -> TurnResult:
        own = at.entry.turn_id
        problem = self.problem(await at.find(self.turn_id),
                               latest_turn(at.checkpoints.transcript))
        if problem is not None:
            return await at.end(TurnResult(own, TurnStatus.FAILED, error=problem))
        return await at.end(TurnResult(own, TurnStatus.COMPLETED), reopen=self.turn_id)


@dataclass(frozen=True, slots=True)
class Cancel:
    """Ask a turn (or every unfinished turn) of a session to cancel (F7).

    Durable and at once: a running turn stops at its next checkpoint boundary (a model stream
    is closed), a queued one before it opens, and a parked one has its request withdrawn and
    ends in its place in the chain, its owed calls answered ``{"cancelled": true}``.
    """

    turn_id: str | None = None
    reason: str = "cancelled by request"

    def check(self, key: SessionKey, target: TurnRecord | None) -> None:
        """Raises UnknownTurnError when ``turn_id`` names no turn of the session."""
        if self.turn_id is not None and target is None:
            raise UnknownTurnError(str(key), self.turn_id)


Command = Reset | Resume | Retry
"""The commands that are chain entries."""
COMMANDS: dict[str, type[Command]] = {c.kind: c for c in (Reset, Resume, Retry)}
"""Each chain command by its entry's ``kind``: how the driver reads one back."""


def command_of(entry: TurnRecord) -> Command:
    """The command a chain entry holds.

    Raises:
        ValueError: the entry is a turn (or of a kind this version does not know).
    """
    found = COMMANDS.get(entry.kind)
    if found is None:
        raise ValueError(f"chain entry {entry.turn_id!r} is a {entry.kind}, not a command")
    return found.from_entry(entry)


def latest_turn(transcript: Sequence[Message]) -> str | None:
    """The turn the transcript's last opening message belongs to."""
    return next((m.turn_id for m in reversed(transcript) if m.is_opening), None)


__all__ = [
    "COMMANDS",
    "RESET",
    "Cancel",
    "Command",
    "Place",
    "Reset",
    "Resume",
    "Retry",
    "command_of",
    "latest_turn",
]
