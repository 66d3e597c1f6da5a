"""Reset (F8): retire a session's history, keeping its address — every rule of it here.

- **Accepted** as a chain entry (``kind="reset"``) that supersedes: the queued and running
  entries before it are asked to cancel (reason ``reset``) at once, a running turn stopping
  at its next boundary (``accepting.supersede_at_once``); a turn sent while a turn is parked
  queues behind a queued reset (the store's ``check_enqueue``).
- **At its place**: the turns parked on subagents have those children's requests withdrawn
  (parent-close policy), the live generation's messages and steps are archived under its
  number (``Transaction.new_generation``, which also cancels a park left standing, reason
  ``reset``), its entry keeps ``data["reset"] = {"archived": generation}``, and the status
  becomes ``new``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from ..events import TurnCancelled, TurnEvent
from ..records import ChainEntry, NewEntry, TurnResult, TurnStatus
from ..stores import Transaction
from ..subagents import reset_children
from ._place import Place
from ._registry import Call, CommandSpec, Route, Verb

__all__ = ["REASON", "RESET", "SPEC", "Reset", "ResetBody"]

RESET = "reset"
"""The name a reset keeps its outcome under (``{"archived": generation}``), on its entry."""
REASON = "reset"
"""The cancel reason a reset gives the turns before it, and the parks it ends."""


@dataclass(frozen=True, slots=True)
class Reset:
    """Retire the session's history, keeping its address (see the module docstring)."""

    entry_id: str = field(default_factory=lambda: f"reset:{uuid.uuid4().hex}")
    kind: ClassVar[str] = "reset"

    def entry(self) -> NewEntry:
        return NewEntry(self.entry_id, kind=self.kind, supersede=REASON)

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> Reset:
        return cls(entry.turn_id)

    async def apply(self, at: Place) -> TurnResult:
        done = TurnResult(at.entry.turn_id, TurnStatus.COMPLETED)
        cp = at.commits
        parked = [t for t in at.pending if t.status == TurnStatus.SUSPENDED]
        # Parked on subagents: their requests go too (parent-close policy).
        await reset_children(at.sessions, at.entry.turn_id, parked)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.set_turn(done)
            tx.set_turn_data(done.turn_id, RESET, {"archived": cp.lease.generation})
            tx.new_generation()
            return [tx.add_event(TurnCancelled(**cp.ids(t.turn_id), reason=REASON))
                    for t in parked]

        await cp.commit(fill)
        cp.transcript.clear()
        for t in parked:
            at.finished(TurnResult(t.turn_id, TurnStatus.CANCELLED, reason=REASON))
        return done


class ResetBody(BaseModel):
    """``POST /reset`` (no fields)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types, not coerced


async def _http(call: Call) -> Mapping[str, Any]:
    done = await call.session.reset()
    return {"previous_session": done.previous_session, "generation": done.generation}


async def _cli(session: Any, args: Any) -> str:
    done = await session.reset()
    return (f"{session.key} reset: history archived as {done.previous_session}, "
            f"generation {done.generation}")


SPEC = CommandSpec(
    "reset", "archive the session's history", "queued", "reset", Reset,
    route=Route("reset", ResetBody, "archive the session's history", _http,
                answer={"type": "object", "required": ["generation", "previous_session"],
                        "properties": {"previous_session": {"type": "string"},
                                       "generation": {"type": "integer"}}},
                required=False, claims=True),
    verb=Verb("archive a session's history and start it over (F8)", (), _cli),
)
"""Reset, as the registry knows it."""
