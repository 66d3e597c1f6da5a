"""A chain command's place: what it sees and commits with when its turn in the chain comes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..context import Sessions
from ..engine._commits import StepCommits
from ..events import TurnEvent
from ..records import Answer, ChainEntry, InputStepId, TurnResult, TurnStatus
from ..stores import Transaction

__all__ = ["Place"]


@dataclass(frozen=True, slots=True)
class Place:
    """A command's place in the chain, when its turn comes: what it sees and commits with."""

    entry: ChainEntry
    """The command's own chain entry."""
    pending: Sequence[ChainEntry]
    """The session's unfinished entries, in chain order (parked turns among them)."""
    commits: StepCommits
    """How it commits (fenced by the driver's lease), and the live transcript."""
    find: Callable[[str], Awaitable[ChainEntry | None]]
    """Reads a chain entry by id."""
    sessions: Sessions
    """The runtime's other sessions (a parked turn's subagents, for a reset)."""
    finished: Callable[[TurnResult], None]
    """Tells the runtime of another entry's end the command committed (a park it ended)."""

    @property
    def parked(self) -> list[ChainEntry]:
        """The turns parked on a standing request."""
        return [t for t in self.pending if t.parked]

    async def end(self, result: TurnResult, *, reopen: str | None = None,
                  answer: tuple[InputStepId, Answer] | None = None,
                  events: Sequence[TurnEvent] = ()) -> TurnResult:
        """Commit the command's outcome, and with it: turn ``reopen`` running again (its
        place in the chain comes next), after storing ``answer`` (a person's) for it, and
        ``events`` (numbered as they are logged)."""
        async def fill(tx: Transaction) -> list[TurnEvent]:
            logged = [tx.add_event(e) for e in events]
            if answer is not None and reopen is not None:
                tx.add_step(answer[0], reopen, answer[1])
            tx.set_turn(result)
            if reopen is not None:
                tx.set_turn(TurnResult(reopen, TurnStatus.RUNNING))
                tx.set_status("running")
            return logged

        await self.commits.commit(fill)
        return result
