"""Turn events: what a running turn tells its observers (F5).

Every event carries ``type`` (the seed's names, exactly), ``agent``, ``session``, ``turn_id``,
``seq``, a per-session sequence number, and ``at``, the wall-clock time (Unix seconds) it was
made: for a durable event, when its step committed, so a turn's timeline can be read off its
events. Every event but ``message.delta`` is written to the
store in the same transaction as the step that caused it, and only published after that
transaction commits, so an observer never sees an event that was rolled back, and the log can
be replayed (``observe(replay=True)``, ``Last-Event-ID``). Live tokens are never persisted: a
``message.delta`` carries the ``seq`` of the last durable event before it and is not replayed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, Protocol, TypedDict

from .messages import ToolCall
from .records import InputRequest

EventType = Literal[
    "turn.started",
    "message.delta",
    "message.thinking",
    "message.retry",
    "message.completed",
    "message.steered",
    "context.compacted",
    "action.requested",
    "action.retry",
    "action.completed",
    "action.in_doubt",
    "input.requested",
    "input.reminder",
    "input.expired",
    "turn.sleeping",
    "turn.completed",
    "turn.failed",
    "turn.cancelled",
]

class EventIds(TypedDict):
    """The fields that say whose event it is."""

    agent: str
    session: str
    turn_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEvent:
    """Fields every event has."""

    type: ClassVar[EventType]
    durable: ClassVar[bool] = True
    """Stored with its step and replayed from the log; ``False`` for the live-only events
    (``message.delta``, ``message.thinking``, ``message.retry``, ``action.retry``), which
    carry the ``seq`` of the durable event before them."""
    _own_fields: ClassVar[tuple[str, ...]] = ()
    _ends: ClassVar[bool] = False  # in STREAM_ENDS: set once below (read on every event)
    agent: str
    session: str
    turn_id: str
    seq: int = 0
    at: float | None = field(default_factory=time.time, compare=False)
    """Unix seconds when the event was made (its step's commit); ``None`` for an event stored
    before events carried it. Not compared: two events are equal whatever their times."""
    child: dict[str, Any] | None = None
    """Set on a subagent's event forwarded into its parent's stream (F13): the child's
    ``{agent, session, turn_id, seq}`` (``seq``: the child's own); ``agent``, ``session``
    and ``turn_id`` are the parent's."""

    @property
    def ends_turn(self) -> bool:
        """A terminal event of its own turn (not a forwarded subagent's)."""
        return self.child is None and self._ends

    def payload(self) -> dict[str, Any]:
        """The event's own fields as JSON values (without the common ones but ``child``)."""
        out: dict[str, Any] = {}
        if self.child is not None:
            out["child"] = self.child
        for name in self._own_fields:
            value = getattr(self, name)
            if isinstance(value, ToolCall):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = [c.to_dict() if isinstance(c, ToolCall) else c for c in value]
            elif hasattr(value, "to_dict"):
                value = value.to_dict()
            out[name] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        """The whole event as JSON values, ``type`` first."""
        return {
            "type": self.type,
            "agent": self.agent,
            "session": self.session,
            "turn_id": self.turn_id,
            "seq": self.seq,
            "at": self.at,
            **self.payload(),
        }


_COMMON = frozenset({"agent", "session", "turn_id", "seq", "at", "child"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStarted(TurnEvent):
    type: ClassVar[EventType] = "turn.started"
    text: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageDelta(TurnEvent):
    type: ClassVar[EventType] = "message.delta"
    durable: ClassVar[bool] = False
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageThinking(TurnEvent):
    """A piece of the model's reasoning as it streams (a ``ThinkingDelta``), never answer
    text. Live only, like ``message.delta``: never stored (the reply's thinking blocks are
    kept with its message)."""

    type: ClassVar[EventType] = "message.thinking"
    durable: ClassVar[bool] = False
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageRetry(TurnEvent):
    """A model call failed transiently and will be asked again after ``delay`` seconds.

    Live only, like ``message.delta``: never stored. Text streamed by the failed attempt is
    void; the next attempt streams its reply from the start.
    """

    type: ClassVar[EventType] = "message.retry"
    durable: ClassVar[bool] = False
    attempt: int
    """The attempt that failed (1 for the first call)."""
    retries: int
    """How many retries the agent allows (``Agent(model_retries=…)``)."""
    delay: float
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageCompleted(TurnEvent):
    type: ClassVar[EventType] = "message.completed"
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageSteered(TurnEvent):
    """A message sent while the turn ran joined it (``start(…, mode="steer")``, F25): a user
    message of this turn, in its transcript before its next model call."""

    type: ClassVar[EventType] = "message.steered"
    text: str
    entry_id: str
    """The chain entry the message was accepted as (the id ``start()`` returned)."""
    by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextCompacted(TurnEvent):
    """A compaction step committed before a model call (F23): later requests send the
    summary of messages ``[0, covered)`` and clear tool results before ``cleared``."""

    type: ClassVar[EventType] = "context.compacted"
    step: str
    """The compaction's step id, ``compact:<n>``."""
    tokens_before: int
    tokens_after: int
    covered: int
    cleared: int
    summarised: bool
    """A model call summarised the head (else only tool results were cleared)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionRequested(TurnEvent):
    type: ClassVar[EventType] = "action.requested"
    call: ToolCall


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionCompleted(TurnEvent):
    type: ClassVar[EventType] = "action.completed"
    call: ToolCall
    result: Any
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionRetry(TurnEvent):
    """A remote tool's attempt failed (or timed out) and the call is tried again after
    ``delay`` seconds (``Tool(retries=…)``), with the same idempotency key.

    Live only, like ``message.retry``: never stored.
    """

    type: ClassVar[EventType] = "action.retry"
    durable: ClassVar[bool] = False
    call: ToolCall
    attempt: int
    """The attempt that failed (1 for the first)."""
    retries: int
    """How many retries the tool allows (``Tool(retries=…)``)."""
    delay: float
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionInDoubt(TurnEvent):
    """A remote call whose tool is not ``in_doubt="rerun"`` was found begun and not finished
    on a replay (its intent committed, its result did not), and how it was settled (F26).

    ``settled``: ``None`` when it was found (an ``in_doubt="ask"`` call then parks the turn);
    ``"run"`` it runs again (a person said yes, or the reconcile function found it did not
    run); ``"skipped"`` a person said no; ``"reconciled"`` the reconcile function found it
    ran and its result is the call's.
    """

    type: ClassVar[EventType] = "action.in_doubt"
    call: ToolCall
    attempt: int
    """The attempt that was in doubt (its intent's)."""
    settled: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputRequested(TurnEvent):
    type: ClassVar[EventType] = "input.requested"
    request: InputRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class InputReminder(TurnEvent):
    """A request still stands unanswered (``request_input(remind_every=…)``, F24): channels
    ask again (Slack posts its buttons again)."""

    type: ClassVar[EventType] = "input.reminder"
    request: InputRequest
    """The request, as it stands."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InputExpired(TurnEvent):
    """A request's deadline passed unanswered: the turn goes on with its default, answered
    ``by="timeout"`` (F24); an answer that comes later is refused (409)."""

    type: ClassVar[EventType] = "input.expired"
    input_id: str
    default: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnSleeping(TurnEvent):
    """A tool sleeps (``await ctx.sleep(…)``, F24): the turn is suspended until ``until``
    (ISO time, UTC), nothing held in memory; whatever drives turns wakes it then."""

    type: ClassVar[EventType] = "turn.sleeping"
    until: str
    request: InputRequest
    """The sleep's request (``sleep=True``), which only the clock answers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnCompleted(TurnEvent):
    type: ClassVar[EventType] = "turn.completed"
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFailed(TurnEvent):
    type: ClassVar[EventType] = "turn.failed"
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnCancelled(TurnEvent):
    type: ClassVar[EventType] = "turn.cancelled"
    reason: str


TURN_ENDS: tuple[type[TurnEvent], ...] = (TurnCompleted, TurnFailed, TurnCancelled)
"""The events a turn ends on."""
STREAM_ENDS: tuple[type[TurnEvent], ...] = (*TURN_ENDS, InputRequested, TurnSleeping)
"""The events a stream of one turn ends on: its end, or a park (``input.requested``, or
``turn.sleeping``)."""

_BY_TYPE: dict[str, type[TurnEvent]] = {
    cls.type: cls
    for cls in (
        TurnStarted,
        MessageDelta,
        MessageThinking,
        MessageRetry,
        MessageCompleted,
        MessageSteered,
        ContextCompacted,
        ActionRequested,
        ActionRetry,
        ActionCompleted,
        ActionInDoubt,
        InputRequested,
        InputReminder,
        InputExpired,
        TurnSleeping,
        TurnCompleted,
        TurnFailed,
        TurnCancelled,
    )
}
for _cls in _BY_TYPE.values():
    # payload() runs for every event of every step: look the field names up once.
    _cls._own_fields = tuple(f.name for f in fields(_cls) if f.name not in _COMMON)
    _cls._ends = issubclass(_cls, STREAM_ENDS)


def event_from_fields(agent: str, session: str, seq: int, turn_id: str, type: str,
                      data: dict[str, Any]) -> TurnEvent:
    """Rebuild a typed event of ``type`` from its own fields and ``at`` (what a store keeps
    of it, decoded; ``data`` is consumed). Fields already typed (a
    :class:`ToolCall`, a tuple of them) are taken as they are."""
    cls = _BY_TYPE[type]
    data.setdefault("at", None)  # stored before events carried their time
    call = data.get("call")
    if isinstance(call, dict):
        data["call"] = ToolCall.from_dict(call)
    if type in ("input.requested", "input.reminder", "turn.sleeping") and isinstance(
            data.get("request"), dict):
        data["request"] = InputRequest.from_dict(data["request"])
    calls = data.get("tool_calls")
    if calls is not None and not isinstance(calls, tuple):
        data["tool_calls"] = tuple(ToolCall.from_dict(c) for c in calls)
    return cls(agent=agent, session=session, turn_id=turn_id, seq=seq, **data)


class EventSink(Protocol):
    """Receives every event of every turn a runtime drives, after its step committed.

    Called on the event loop, synchronously: it must not block. It must not raise either;
    an exception is logged and the turn goes on.
    """

    def emit(self, event: TurnEvent) -> None: ...


__all__ = [
    "STREAM_ENDS",
    "TURN_ENDS",
    "ActionCompleted",
    "ActionInDoubt",
    "ActionRequested",
    "ActionRetry",
    "ContextCompacted",
    "EventIds",
    "EventSink",
    "EventType",
    "InputExpired",
    "InputReminder",
    "InputRequested",
    "MessageCompleted",
    "MessageDelta",
    "MessageRetry",
    "MessageSteered",
    "MessageThinking",
    "TurnCancelled",
    "TurnCompleted",
    "TurnEvent",
    "TurnFailed",
    "TurnSleeping",
    "TurnStarted",
    "event_from_fields",
]
