"""An outsider's joining command (F25's seam): a hint put into the running turn before its
next model call — one module and its registration, ``COMMANDS.with_(SPEC)``, nothing else.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from durable_turns.commands import COMMANDS, CommandSpec, Join, Place
from durable_turns.events import TurnEvent
from durable_turns.messages import Message
from durable_turns.records import ChainEntry, NewEntry, TurnResult, TurnStatus
from durable_turns.stores import Transaction


@dataclass(frozen=True)
class Hint:
    """A hint for the model: a user message ``(hint) <text>`` of the running turn."""

    text: str
    entry_id: str = field(default_factory=lambda: f"hint:{uuid.uuid4().hex}")
    kind: ClassVar[str] = "hint"

    def entry(self) -> NewEntry:
        return NewEntry(self.entry_id, kind=self.kind, args={"text": self.text})

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> Hint:
        return cls(str((entry.args or {})["text"]), entry.turn_id)

    async def join(self, at: Join) -> TurnResult:
        hint = Message("user", f"(hint) {self.text}", turn_id=at.turn.turn_id)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            at.commits.add(tx, hint)
            return []

        return await at.end(fill)

    async def apply(self, at: Place) -> TurnResult:
        """No turn to join: the hint ends unused."""
        return await at.end(TurnResult(self.entry_id, TurnStatus.COMPLETED, "unused"))


SPEC = CommandSpec("hint", "hint the running turn", "joins", "hint", Hint)
REGISTRY = COMMANDS.with_(SPEC)
