"""Retry (F2): re-open a failed turn where it failed; finished steps stay.

Accepted as a chain entry, one per failure (``retry:<turn_id>:<seq of its turn.failed>``),
so asking twice before it runs is one retry. Only the session's latest turn can be re-opened
(a later turn has built on its failure): checked when accepted and again at its place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ..errors import TurnConflictError, UnknownTurnError
from ..messages import Message
from ..records import ChainEntry, NewEntry, SessionKey, TurnResult, TurnStatus
from ._place import Place
from ._registry import Call, CommandSpec, Route, Verb

__all__ = ["SPEC", "Retry", "RetryBody", "latest_turn"]


def latest_turn(transcript: Sequence[Message]) -> str | None:
    """The turn the transcript's last opening message belongs to."""
    return next((m.turn_id for m in reversed(transcript) if m.is_opening), None)


@dataclass(frozen=True, slots=True)
class Retry:
    """Re-open a failed turn where it failed (see the module docstring)."""

    turn_id: str
    failure: int = 0
    """The ``seq`` of the failure it retries."""
    kind: ClassVar[str] = "retry"

    @property
    def entry_id(self) -> str:
        return f"retry:{self.turn_id}:{self.failure}"

    def entry(self) -> NewEntry:
        return NewEntry(self.entry_id, kind=self.kind, args={"turn_id": self.turn_id})

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> Retry:
        return cls(str((entry.args or {}).get("turn_id")))

    def problem(self, target: ChainEntry | None, latest: str | None) -> str | None:
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

    def check(self, key: SessionKey, target: ChainEntry | None, latest: str | None) -> None:
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
                               latest_turn(at.commits.transcript))
        if problem is not None:
            return await at.end(TurnResult(own, TurnStatus.FAILED, error=problem))
        return await at.end(TurnResult(own, TurnStatus.COMPLETED), reopen=self.turn_id)


class RetryBody(BaseModel):
    """``POST /retry``: the failed turn to re-open where it failed (F2)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types, not coerced
    turn_id: str = Field(min_length=1)


async def _http(call: Call) -> Mapping[str, Any]:
    # Accepted once the retry has re-opened the turn; the turn then runs on, and its
    # events follow on the session's stream.
    await call.session.retry(call.body.turn_id)
    return {"turn_id": call.body.turn_id, "retried": True}


SPEC = CommandSpec(
    # A retry runs a failed turn on: what starting a turn may.
    "retry", "re-open a failed turn where it failed", "queued", "turn", Retry,
    route=Route("retry", RetryBody, "re-open a failed turn where it failed", _http,
                answer={"type": "object", "required": ["retried", "turn_id"], "properties": {
                    "turn_id": {"type": "string"}, "retried": {"type": "boolean"}}},
                codes=(409,)),
    verb=Verb("re-open a failed turn where it failed"),
)
"""Retry, as the registry knows it (its CLI verb has a runner of its own: it finds the
turn's session, and may drive it with an app's agent)."""
