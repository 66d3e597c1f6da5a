"""An outsider's command, in one module: ``note`` writes a line on a session's chain.

Queued like a reset: it waits behind the turns before it, and at its place it keeps its text
and how many messages the transcript had then (what the turns before it said) on its own
entry. Its check (a note has text) runs before it is accepted and again at its place. While
a turn is parked a note is refused, as a turn is (its entry declares ``while_parked=
"refused"``; the store applies it): a line written while a person is asked would stand for
what the turns before it said. It is reached over HTTP (``POST …/note``), in
``durable-turns sessions note``, and is authorized as ``note``. Registered with one line:
``COMMANDS.with_(SPEC)``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from durable_turns.commands import COMMANDS, Arg, Call, CommandSpec, Place, Route, Verb
from durable_turns.events import TurnEvent
from durable_turns.records import ChainEntry, NewEntry, TurnResult, TurnStatus
from durable_turns.stores import Transaction


@dataclass(frozen=True, slots=True)
class Note:
    """A line on the chain, kept at its place."""

    text: str
    entry_id: str = field(default_factory=lambda: f"note:{uuid.uuid4().hex}")
    kind: ClassVar[str] = "note"

    def check(self) -> None:
        """Raises ValueError for a note without text."""
        if not self.text.strip():
            raise ValueError("a note needs text")

    def entry(self) -> NewEntry:
        return NewEntry(self.entry_id, kind=self.kind, args={"text": self.text},
                        while_parked="refused")

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> Note:
        return cls(str((entry.args or {}).get("text", "")), entry.turn_id)

    async def apply(self, at: Place) -> TurnResult:
        own = at.entry.turn_id
        try:
            self.check()
        except ValueError as e:
            return await at.end(TurnResult(own, TurnStatus.FAILED, error=str(e)))
        done = TurnResult(own, TurnStatus.COMPLETED, self.text)
        seen = len(at.commits.transcript)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.set_turn(done)
            tx.set_turn_data(own, "note", {"text": self.text, "after": seen})
            return []

        await at.commits.commit(fill)
        return done


class NoteBody(BaseModel):
    """``POST /note``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: str = Field(min_length=1)


async def _http(call: Call) -> Mapping[str, Any]:
    note = Note(call.body.text)
    note.check()
    await call.session.send(note)
    return {"note": note.entry_id}


async def _cli(session: Any, args: Any) -> str:
    note = Note(args.text)
    note.check()
    await session.send(note)
    return f"noted as {note.entry_id}"


SPEC = CommandSpec(
    "note", "write a line on the session's chain", "queued", "note", Note,
    route=Route("note", NoteBody, "write a line on the session's chain", _http,
                answer={"type": "object", "required": ["note"],
                        "properties": {"note": {"type": "string"}}}),
    verb=Verb("write a line on a session's chain",
              (Arg(("--text",), {"required": True, "help": "the line"}),), _cli),
)

REGISTRY = COMMANDS.with_(SPEC)
"""The one registration: the built-in commands and ``note``."""
