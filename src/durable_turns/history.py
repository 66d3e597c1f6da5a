"""A session's past as data: its checkpoints (every commit), and the plan of a fork.

Every commit of a session is a **checkpoint**: a turn's opening, a model reply, a tool's
result, a park, an answer, a turn's end, a reset. Each keeps what the commit wrote — its
steps (with what they keep) and its events — and where it stands: its position in the
session's log (``seq``, ``sub``: it orders the history, across generations), the generation
it wrote into and the transcript's length after it. A fork copies a session's checkpoints up
to one of them into a new session (:class:`ForkPlan`), so the two timelines share a past
and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .events import InputRequested, TurnEvent, TurnStarted
from .records import (
    ChainEntry,
    SessionKey,
    SessionStatus,
    StepRecord,
    StepResult,
)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One commit of a session: where it stands in the log, and what it wrote."""

    generation: int
    """The generation it wrote into (a reset starts the next one)."""
    seq: int
    """The session's newest event ``seq`` once it committed: with :attr:`sub`, its place."""
    sub: int
    """0 for a commit with events; 1, 2, … for later commits at the same ``seq``."""
    messages: int
    """How many messages the generation's transcript holds after it."""
    turn_id: str | None
    """The turn it belongs to (``None`` when its events are of several turns)."""
    steps: tuple[StepRecord, ...] = ()
    """The steps it checkpointed (a model call, a tool call, an answer, a child), in order."""
    events: tuple[TurnEvent, ...] = ()
    """The events it logged, in order."""

    @property
    def position(self) -> tuple[int, int]:
        """``(seq, sub)``: checkpoints of a session sort by it."""
        return self.seq, self.sub

    @property
    def at(self) -> float | None:
        """When it committed (its last event's time), if it logged an event."""
        return next((e.at for e in reversed(self.events) if e.at is not None), None)

    @property
    def kind(self) -> str:
        """What it is, in a word: ``model``, ``tool``, ``input``, ``child`` (by its first
        step); else ``start``, ``park``, ``end`` or ``events`` (by its events)."""
        if self.steps:
            return self.steps[0].kind
        if any(isinstance(e, TurnStarted) for e in self.events):
            return "start"
        if any(isinstance(e, InputRequested) and e.child is None for e in self.events):
            return "park"
        if any(e.ends_turn for e in self.events):
            return "end"
        return "events"

    @property
    def results(self) -> tuple[StepResult, ...]:
        """What its steps keep, decoded."""
        return tuple(s.result for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        """As JSON values (what hosts answer)."""
        return {"generation": self.generation, "seq": self.seq, "sub": self.sub,
                "kind": self.kind, "turn_id": self.turn_id, "messages": self.messages,
                "at": self.at,
                "steps": [{"id": s.id, "turn_id": s.turn_id, "kind": s.kind,
                           "result": _jsonable(s.result)} for s in self.steps],
                "events": [e.to_dict() for e in self.events]}


def _jsonable(result: StepResult) -> Any:
    return json.loads(result.to_json())


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What a store's ``fork`` writes for one new session: its log up to a checkpoint of
    its source, and its chain (what the engine made of the source's chain at that point).
    """

    src: SessionKey
    dst: SessionKey
    generation: int
    """The source generation the copied checkpoints are of (the fork's is 0)."""
    upto: tuple[int, int] | None
    """The last checkpoint copied, ``(seq, sub)``; ``None``: none (a fork before the source's
    first turn)."""
    chain: tuple[ChainEntry, ...] = ()
    """The fork's chain entries in order: their status, outcome and request as they stood at
    the checkpoint (the ordinals given here are not kept)."""
    status: SessionStatus = "new"
    """The fork's session status."""
    renames: Mapping[str, str] = field(default_factory=dict)
    """Subagent child sessions (by id) and the ids of their forks: every reference the
    copied checkpoints hold to one (a child step's record, a forwarded event, a request
    routed to a child) names the fork instead."""
    owner: str | None = None
    """Who owns the fork (a host's caller), written with it: a fork to a session that another
    owns already is refused (``SessionExistsError``), as one with a chain or a log is."""


__all__ = ["Checkpoint", "ForkPlan"]
