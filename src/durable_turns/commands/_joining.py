"""A command that joins the running turn (F25): its seam.

A *joining* command (``CommandSpec(accepted="joins")``) is a chain entry like a queued one —
durable once accepted, its arguments kept on its entry — that does not wait for its place
behind the running turn: the session's driver applies it **at that turn's next model-call
boundary** (after the current tool batch, before the model is asked again), through its
record's :meth:`JoiningCommand.join`, in one transaction of the turn's lease. A crash
between its accept and its join loses nothing: the entry is still unfinished, and the
driver that replays the turn joins it at the replayed boundary (the join and the entry's end
commit together, so it joins once).

Where there is no running turn to join when its place in the chain comes (it was accepted
while none ran, or the turn ended with the reply it was too late for), its record's
``apply`` runs at its place, as a queued command's does. While a turn is parked, a joining
entry waits (it joins that turn once it runs again, or applies at its place once it ended).

The joining entry ends with ``data["joined"]`` naming the turn it went into, which
``AgentSession.result`` follows: the joining entry's result is that turn's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..engine._commits import Fill, StepCommits
from ..events import TurnEvent
from ..records import ChainEntry, TurnResult, TurnStatus
from ..stores import Transaction
from ._registry import ChainCommand

__all__ = ["JOINED", "Join", "JoiningCommand", "joined_turn", "joiners"]

JOINED = "joined"
"""The name of a joining entry's data that names the turn it went into."""


def joined_turn(entry: ChainEntry) -> str | None:
    """The turn a joining entry went into (``data["joined"]``), once it ended."""
    found = (entry.data or {}).get(JOINED)
    return found if isinstance(found, str) else None


@dataclass(frozen=True, slots=True)
class Join:
    """A joining command's moment: the running turn at its next model-call boundary."""

    entry: ChainEntry
    """The joining command's own chain entry."""
    turn: ChainEntry
    """The running turn it joins."""
    commits: StepCommits
    """How it commits (fenced by the driver's lease), and the live transcript."""

    async def end(self, fill: Fill) -> TurnResult:
        """Commit the join in one transaction: ``fill`` buffers what the command writes
        into the turn (a message through ``commits.add``, events), and with it the joining
        entry ends ``completed`` with ``data["joined"]`` naming the turn.

        Returns:
            The joining entry's end.
        """
        done = TurnResult(self.entry.turn_id, TurnStatus.COMPLETED)

        async def joined(tx: Transaction) -> list[TurnEvent]:
            events = await fill(tx)
            tx.set_turn(done)
            tx.set_turn_data(done.turn_id, JOINED, self.turn.turn_id)
            return events

        await self.commits.commit(joined)
        return done


class JoiningCommand(ChainCommand, Protocol):
    """A joining command's record: a :class:`~durable_turns.commands.ChainCommand` (its
    ``apply`` runs where there is no turn to join) that also joins a running turn."""

    async def join(self, at: Join) -> TurnResult:
        """Join ``at.turn`` at its model-call boundary: run the check again, then commit
        through :meth:`Join.end` (once: the driver calls it for an unfinished entry only)."""
        ...


def joiners(pending: Sequence[ChainEntry], turn: ChainEntry,
            joins: Callable[[str], bool]) -> list[ChainEntry]:
    """The queued joining entries after ``turn`` in ``pending`` (``joins(kind)`` says which
    kinds join), in chain order: what joins ``turn`` at its boundary."""
    return [e for e in pending if e.ordinal > turn.ordinal and e.status == TurnStatus.QUEUED
            and e.cancel is None and joins(e.kind)]
