"""Resume (F6): a person's answer to the request a parked turn waits on.

Accepted as a chain entry, one per request (``resume:<turn_id>:<input_id>``), so the same
answer given twice is one answer. At its place the check runs again (a reset queued before
it archived the park; the park changed), then the answer becomes step
``input:<turn_id>:<input_id>`` and the parked turn runs again (its tool asks again and gets
the answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ResumeConflictError
from ..records import (
    Answer,
    ChainEntry,
    InputRequest,
    InputStepId,
    NewEntry,
    SessionKey,
    TurnResult,
    TurnStatus,
    resume_entry_id,
)
from ._place import Place
from ._registry import Call, CommandSpec, Route, Streamed

__all__ = ["SPEC", "Resume", "ResumeBody"]


@dataclass(frozen=True, slots=True)
class Resume:
    """A person's answer to the request a parked turn waits on (see the module docstring)."""

    turn_id: str
    input_id: str
    value: Any = None
    by: str | None = None
    """Who answered: a verified identity."""
    at: float | None = None
    """When it was answered (Unix seconds): a turn's timeline shows the wait."""
    kind: ClassVar[str] = "resume"

    @property
    def entry_id(self) -> str:
        return resume_entry_id(self.turn_id, self.input_id)

    def entry(self) -> NewEntry:
        return NewEntry(self.entry_id, kind=self.kind, args={
            "turn_id": self.turn_id, "input_id": self.input_id, "value": self.value,
            "by": self.by, "at": self.at})

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> Resume:
        args = entry.args or {}
        return cls(str(args.get("turn_id")), str(args.get("input_id")), args.get("value"),
                   args.get("by"), args.get("at"))

    def same_answer(self, other: Resume) -> bool:
        """Whether ``other`` gives the same answer by the same person (a double click)."""
        return (self.value, self.by) == (other.value, other.by)

    def request(self, key: SessionKey, pending: Sequence[ChainEntry], *,
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
            self.request(at.commits.lease.key, at.pending, before=at.entry.ordinal)
        except ResumeConflictError as e:
            return await at.end(TurnResult(own, TurnStatus.FAILED, error=str(e)))
        return await at.end(TurnResult(own, TurnStatus.COMPLETED), reopen=self.turn_id,
                            answer=(InputStepId(self.turn_id, self.input_id),
                                    Answer(self.value, self.by)))


class ResumeBody(BaseModel):
    """``POST /resume``."""

    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types, not coerced
    turn_id: str = Field(min_length=1)
    input_id: str = Field(min_length=1)
    value: Any = None
    by: str | None = None


async def _http(call: Call) -> Streamed:
    body = call.body
    # A policy-restricted request is decided by the agent's authorize_answer, with the
    # principal, inside resume(): one check of a resume, wherever it comes from.
    stream = await call.channel.open_resume(
        body.turn_id, body.input_id, body.value, session=call.session.key.session,
        by=call.by, authorize=True, principal=call.principal)
    return Streamed(stream, body.turn_id)


SPEC = CommandSpec(
    "resume", "answer a parked turn", "queued", "resume", Resume,
    route=Route("resume", ResumeBody, "answer a parked turn", _http, codes=(409, 422, 500)),
)
"""Resume, as the registry knows it (``durable-turns approvals`` answers from a terminal)."""
