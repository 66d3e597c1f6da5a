"""Reset (F8): retire a session's history, keeping its address — every rule of it here.

- **Accepted** as a chain entry (``kind="reset"``) that supersedes: the queued and running
  entries before it are asked to cancel (reason :data:`REASON`) at once, a running turn
  stopping at its next boundary (``accepting.supersede_at_once``). It is accepted while a
  turn is parked, and ``clears`` the park (``NewEntry.while_parked``, kept with the entry and
  applied by the store): a turn sent while it is queued queues behind it.
- **At its place**: the turns parked on subagents have those children's requests withdrawn
  (parent-close policy); the parks left standing are cancelled (reason :data:`REASON`), the
  live generation's messages and steps are archived under its number
  (``Transaction.new_generation``), its entry keeps ``data["reset"] = {"archived":
  generation}``, and the status becomes ``new``.
- **Reading the chain**: the live generation's turns are those after the last reset that ran
  (:func:`live_turns`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from ..events import TurnCancelled, TurnEvent
from ..records import ChainEntry, NewEntry, TurnResult, TurnStatus
from ..stores import Transaction
from ..subagents import reset_children
from ._place import Place
from ._registry import Call, CommandSpec, Route, Verb

__all__ = ["REASON", "RESET", "SPEC", "Reset", "ResetBody", "live_turns"]

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
        return NewEntry(self.entry_id, kind=self.kind, supersede=REASON, while_parked="clears")

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> Reset:
        return cls(entry.turn_id)

    async def apply(self, at: Place) -> TurnResult:
        done = TurnResult(at.entry.turn_id, TurnStatus.COMPLETED)
        cp = at.commits
        parked = [t for t in at.pending if t.status == TurnStatus.SUSPENDED]
        # Parked on subagents: their requests go too (parent-close policy).
        await reset_children(at.sessions, at.entry.turn_id, parked)

        cancelled = [TurnResult(t.turn_id, TurnStatus.CANCELLED, reason=REASON) for t in parked]

        async def fill(tx: Transaction) -> list[TurnEvent]:
            for r in cancelled:  # the parks left standing end with the generation
                tx.set_turn(r)
            tx.set_turn(done)
            tx.set_turn_data(done.turn_id, RESET, {"archived": cp.lease.generation})
            tx.new_generation()
            return [tx.add_event(TurnCancelled(**cp.ids(r.turn_id), reason=REASON))
                    for r in cancelled]

        await cp.commit(fill)
        cp.transcript.clear()
        for r in cancelled:
            at.finished(r)
        return done


def live_turns(chain: Sequence[ChainEntry]) -> list[ChainEntry]:
    """The turns of a chain's live generation: those accepted after the last reset that ran
    (a reset archives the turns before it, F8; one still queued archives nothing yet).

    Args:
        chain: a session's chain entries in order (turns and commands).
    """
    resets = [t.ordinal for t in chain if t.kind == Reset.kind
              and t.status == TurnStatus.COMPLETED]
    live_from = max(resets, default=-1)
    return [t for t in chain if t.kind == "turn" and t.ordinal > live_from]


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
