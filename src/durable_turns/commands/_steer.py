"""Steer (F25): a message sent while a turn runs joins that turn — a joining command.

- **Accepted** (``AgentSession.start(…, mode="steer")``) as a chain entry of kind ``steer``
  holding the message (its text, its sender, the inbound event), durable once accepted; with
  no turn unfinished it is a plain turn instead, and a parked turn refuses it
  (``SessionBusyError``: nobody would read it until an answer came).
- **At the running turn's next model-call boundary** (``commands._joining``): the message
  becomes a ``user`` message of that turn, with event ``message.steered``, and the entry ends
  naming the turn (``data["joined"]``), in one transaction.
- **At its place, with no turn to join** (the turn ended with the reply it came too late
  for): it opens a turn of its own (``<entry id>:turn``), which the entry names instead;
  a steer accepted with ``deliver=`` (a channel's) opens it with the same ``deliver``. A
  replace or a reset that superseded it before it joined ends it ``cancelled``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import SessionBusyError
from ..events import MessageSteered, TurnEvent
from ..inbound import InboundEvent
from ..messages import Message
from ..records import ChainEntry, NewEntry, SessionKey, TurnResult, TurnStatus
from ..stores import SessionStore, Transaction
from ._joining import JOINED, Join, joined_turn
from ._place import Place
from ._registry import Arg, CommandSpec, Verb

__all__ = ["SPEC", "Steer", "check_steer", "steer_entry"]


def check_steer(key: SessionKey, pending: list[ChainEntry]) -> str | None:
    """The turn a steer of the session joins: its first unfinished turn (``None``: none, the
    steer opens a turn).

    Args:
        pending: the session's unfinished chain entries.

    Raises:
        SessionBusyError: a turn is parked on a standing request.
    """
    for t in pending:
        if t.parked:
            raise SessionBusyError(str(key), t.turn_id)
    return next((t.turn_id for t in pending if t.kind == "turn"), None)


@dataclass(frozen=True, slots=True)
class Steer:
    """A message that joins the running turn (see the module docstring)."""

    text: str
    by: str | None = None
    """Who sent it (the inbound event's user)."""
    event: Mapping[str, Any] | None = None
    """The inbound event it came as (``InboundEvent.to_dict``), for a turn of its own."""
    entry_id: str = field(default_factory=lambda: f"steer:{uuid.uuid4().hex}")
    deliver: str | None = None
    """The channel that owes a turn of its own a delivery (``start(deliver=…)``): a Slack
    thread's steer that came too late is replied to like any message of the thread."""
    kind: ClassVar[str] = "steer"

    def entry(self) -> NewEntry:
        args: dict[str, Any] = {"text": self.text, "by": self.by,
                                "event": dict(self.event) if self.event is not None else None}
        if self.deliver is not None:
            args["deliver"] = self.deliver
        return NewEntry(self.entry_id, kind=self.kind, args=args)

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> Steer:
        args = entry.args or {}
        deliver = args.get("deliver")
        return cls(str(args.get("text", "")), args.get("by"), args.get("event"),
                   entry.turn_id, deliver if isinstance(deliver, str) else None)

    @property
    def own_turn(self) -> str:
        """The id of the turn it opens where there is none to join."""
        return f"{self.entry_id}:turn"

    async def join(self, at: Join) -> TurnResult:
        cp = at.commits
        turn_id = at.turn.turn_id
        message = Message("user", self.text, turn_id=turn_id, by=self.by)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            cp.add(tx, message)
            return [tx.add_event(MessageSteered(**cp.ids(turn_id), text=self.text,
                                                entry_id=self.entry_id, by=self.by))]

        return await at.end(fill)

    async def apply(self, at: Place) -> TurnResult:
        cancel = at.entry.cancel
        if cancel is not None:
            return await at.end(TurnResult(self.entry_id, TurnStatus.CANCELLED, reason=cancel))
        event = InboundEvent.from_dict(dict(self.event)) if self.event is not None else None
        # A redelivery of the same turn id after a crash is a no-op: the turn opens once.
        await at.sessions.start(at.commits.lease.key, self.text, turn_id=self.own_turn,
                                event=event, deliver=self.deliver)
        done = TurnResult(self.entry_id, TurnStatus.COMPLETED)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.set_turn(done)
            tx.set_turn_data(done.turn_id, JOINED, self.own_turn)
            return []

        await at.commits.commit(fill)
        return done


async def _cli(session: Any, args: Any) -> str:
    started = await session.start(args.text, mode="steer")
    return f"steered {started.turn_id} into {session.key}"


SPEC = CommandSpec(
    "steer", "send a message that joins the running turn", "joins", "turn", Steer,
    verb=Verb("send a message that joins the session's running turn (else starts one)",
              (Arg(("text",), {"help": "the message"}),), _cli),
)
"""Steer, as the registry knows it (its HTTP form is ``POST …/turn?mode=steer``)."""


async def steer_entry(store: SessionStore, key: SessionKey,
                      entry: NewEntry) -> tuple[NewEntry, str | None]:
    """What ``start(…, mode="steer")`` accepts for turn ``entry``: a :class:`Steer` of its
    text while a turn of the session is unfinished, else the turn itself (a redelivered id
    keeps the kind it was accepted as); and the turn the steer joins (``None``: the turn).

    Raises:
        SessionBusyError: a turn is parked on a standing request.
    """
    assert entry.opening is not None
    steer = Steer(entry.opening.text, entry.opening.by, entry.event, entry.turn_id,
                  entry.deliver)
    as_steer = dataclasses.replace(steer.entry(), data=entry.data)  # (an HTTP key's print)
    found = await store.entries(key, turn_id=entry.turn_id)
    if found and found[0].kind != Steer.kind:
        return entry, None
    pending = await store.entries(key, unfinished=True)
    if found:
        return as_steer, joined_turn(found[0]) or next(
            (t.turn_id for t in pending if t.kind == "turn"), None)
    into = check_steer(key, pending)
    return (entry, None) if into is None else (as_steer, into)
