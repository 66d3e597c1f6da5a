"""One transaction per step: how the turn loop, its tool calls and the chain's commands commit.

A :class:`StepCommits` belongs to one drive of a session (one lease). :meth:`~StepCommits.commit`
opens the lease's transaction, lets a *fill* buffer what the step writes — messages (through
:meth:`~StepCommits.add`), its checkpoint, events, the turn's updates — commits, and only then
appends the messages to the transcript and publishes the events: nobody ever sees a step that
was rolled back. Commits made beside the loop's own (a parallel batch's calls, a subagent's
forwarded events) take turns: one transaction of a lease at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .._tracing import TurnTrace
from ..events import EventIds, TurnEvent
from ..messages import Message
from ..stores import Lease, Transaction

Fill = Callable[[Transaction], Awaitable[list[TurnEvent]]]
"""Buffers one step's writes in its transaction; returns the events it logged."""
Publish = Callable[[list[TurnEvent]], None]
"""Receives a step's events once its transaction committed."""
TRACE = "trace"
"""The name tracing keeps a turn's span context under, on the turn's chain entry."""


class StepCommits:
    """The commits of one drive of a session; see the module docstring.

    Args:
        lease: the session's lease; every commit is fenced by its epoch.
        transcript: the live message log, extended after each commit.
        publish: receives each commit's events.
    """

    def __init__(self, lease: Lease, transcript: list[Message], publish: Publish) -> None:
        self.lease = lease
        self.transcript = transcript
        self._publish = publish
        self._staged: list[Message] = []
        self._lock = asyncio.Lock()
        self._prefix: tuple[int, str] = (-1, "")
        self.turn_id: str | None = None
        """The turn the loop drives now (its tracing is written with the first commit)."""
        self.trace: TurnTrace | None = None
        """The spans of that turn's stretch, when tracing is on."""

    def ids(self, turn_id: str) -> EventIds:
        """The fields that say an event is of this session's turn ``turn_id``."""
        return {"agent": self.lease.key.agent, "session": self.lease.key.session,
                "turn_id": turn_id}

    def add(self, tx: Transaction, message: Message) -> int:
        """Append ``message`` in ``tx``; the transcript gets it once ``tx`` committed."""
        self._staged.append(message)
        return tx.add_message(message)

    def key_prefix(self) -> str:
        """What every idempotency key of the live generation starts with (built once)."""
        gen = self.lease.generation
        if self._prefix[0] != gen:
            self._prefix = (gen, f"{self.lease.key}#g{gen}/")
        return self._prefix[1]

    async def commit(self, fill: Fill) -> None:
        """One transaction: ``fill(tx)`` buffers the step's writes; the transcript and the
        observers learn of them after the commit.

        Raises:
            LeaseLostError: the lease was taken over; nothing was written.
            StoreError: the store refused the commit; nothing was written.
        """
        self._staged.clear()
        async with self.lease.transaction() as tx:
            events = await fill(tx)
            trace = self.trace
            if trace is not None and trace.pending and self.turn_id is not None:
                tx.set_turn_data(self.turn_id, TRACE, trace.record())
        self.transcript.extend(self._staged)
        self._staged.clear()
        self._publish(events)

    async def beside(self, fill: Fill, *, shielded: bool) -> None:
        """Commit beside the loop: one transaction of the lease at a time and, ``shielded``,
        never cut short by a cancel of the calling task (an interrupted subagent call).

        A transaction abandoned halfway could have committed in the database without the
        lease learning of it (its event numbers, its message count), and the turn goes on
        under that lease after an interrupt; so a cancel waits for the commit to end, then
        goes on. (Any other cancel ends the drive, and the lease with it.)
        """
        async def locked() -> None:
            async with self._lock:
                await self.commit(fill)

        if not shielded:
            return await locked()
        commit = asyncio.ensure_future(locked())
        interrupted = False
        while True:
            try:
                await asyncio.shield(commit)
                break
            except asyncio.CancelledError:
                if commit.done():
                    raise
                interrupted = True
        if interrupted:
            raise asyncio.CancelledError


__all__ = ["TRACE", "Fill", "Publish", "StepCommits"]
