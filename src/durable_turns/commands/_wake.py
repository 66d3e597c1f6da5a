"""Wake-ups (F24): the clock's answer to a request, and a reminder of one. Both are queued
commands the clock loop accepts when their timer is due (``scheduling._wakeups``).

- :class:`Wake` answers a request in place of a person: a sleep's end (``by="clock"``,
  value ``None``), or a deadline's default (``by="timeout"``, event ``input.expired``). Its
  chain entry is the one a person's answer would have (``resume:<turn_id>:<input_id>``), so
  an answer that comes after the deadline fired is a second answer to the same request and
  is refused (409) like any stale answer; the timer firing twice (two workers, a crash) is
  one wake.
- :class:`Remind` logs an ``input.reminder`` event of a request that still stands (entry
  ``remind:<turn_id>:<input_id>:<due>``: once per reminder time), which channels render.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import ResumeConflictError
from ..events import InputExpired, InputReminder
from ..records import (
    Answer,
    ChainEntry,
    InputStepId,
    NewEntry,
    TurnResult,
    TurnStatus,
    resume_entry_id,
)
from ._place import Place
from ._registry import CommandSpec
from ._resume import Resume

__all__ = ["REMIND_SPEC", "WAKE_SPEC", "Remind", "Wake"]

CLOCK = "clock"
"""Who answers a sleep: its end is the clock's answer."""
TIMEOUT = "timeout"
"""Who answers a request whose deadline passed (with its default)."""


@dataclass(frozen=True, slots=True)
class Wake:
    """The clock's answer to a request (see the module docstring)."""

    turn_id: str
    input_id: str
    value: Any = None
    by: str = TIMEOUT
    """``timeout`` (a deadline's default) or ``clock`` (a sleep's end)."""
    at: float | None = None
    """When it fired (Unix seconds)."""
    kind: ClassVar[str] = "wake"

    @property
    def entry_id(self) -> str:
        return resume_entry_id(self.turn_id, self.input_id)

    def entry(self) -> NewEntry:
        # The args of a resume: a person's answer given later reads it as the answer given.
        return NewEntry(self.entry_id, kind=self.kind, args={
            "turn_id": self.turn_id, "input_id": self.input_id, "value": self.value,
            "by": self.by, "at": self.at})

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> Wake:
        args = entry.args or {}
        return cls(str(args.get("turn_id")), str(args.get("input_id")), args.get("value"),
                   str(args.get("by") or TIMEOUT), args.get("at"))

    async def apply(self, at: Place) -> TurnResult:
        own = at.entry.turn_id
        try:
            Resume(self.turn_id, self.input_id).request(
                at.commits.lease.key, at.pending, before=at.entry.ordinal)
        except ResumeConflictError as e:
            return await at.end(TurnResult(own, TurnStatus.FAILED, error=str(e)))
        ids = at.commits.ids(self.turn_id)
        events = [] if self.by == CLOCK else [
            InputExpired(**ids, input_id=self.input_id, default=self.value)]
        return await at.end(TurnResult(own, TurnStatus.COMPLETED), reopen=self.turn_id,
                            answer=(InputStepId(self.turn_id, self.input_id),
                                    Answer(self.value, self.by)), events=events)


@dataclass(frozen=True, slots=True)
class Remind:
    """A reminder of a request that stands unanswered (see the module docstring)."""

    turn_id: str
    input_id: str
    due: str
    """The reminder's time (ISO, UTC): one entry per reminder."""
    kind: ClassVar[str] = "remind"

    @property
    def entry_id(self) -> str:
        return f"remind:{self.turn_id}:{self.input_id}:{self.due}"

    def entry(self) -> NewEntry:
        return NewEntry(self.entry_id, kind=self.kind, args={
            "turn_id": self.turn_id, "input_id": self.input_id, "due": self.due})

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> Remind:
        args = entry.args or {}
        return cls(str(args.get("turn_id")), str(args.get("input_id")), str(args.get("due")))

    async def apply(self, at: Place) -> TurnResult:
        own = at.entry.turn_id
        try:
            request = Resume(self.turn_id, self.input_id).request(
                at.commits.lease.key, at.pending, before=at.entry.ordinal)
        except ResumeConflictError as e:  # answered meanwhile: nothing to remind of
            return await at.end(TurnResult(own, TurnStatus.COMPLETED, text=str(e)))
        event = InputReminder(**at.commits.ids(self.turn_id), request=request)
        return await at.end(TurnResult(own, TurnStatus.COMPLETED), events=[event])


WAKE_SPEC = CommandSpec("wake", "the clock answers a parked request (a sleep's end, a "
                        "deadline's default)", "queued", "wake", Wake)
"""Wake, as the registry knows it: no route or verb (only the clock loop accepts it)."""
REMIND_SPEC = CommandSpec("remind", "remind of a request that stands unanswered", "queued",
                          "remind", Remind)
"""Remind, as the registry knows it (only the clock loop accepts it)."""
