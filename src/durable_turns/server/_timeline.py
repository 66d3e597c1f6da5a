"""A session's turns as timelines: each step a row with its times and status (F12).

Read off the session's durable events, whose ``at`` is the time their step committed, so it
holds whichever process drove the turn and after a restart. Steps of a turn run one after
another, so a step starts when the step before it ended: a model row runs from the previous
commit to its ``message.completed``; a tool row to its ``action.completed`` (or to the
``input.requested`` it parked on); an input row from the park to the person's answer (the time
the answer was accepted); a tool that parked runs again, from the answer, as a row of its own;
a compaction (F23) is a row of its own before the model row it made room for.

:func:`timeline` is pure (records in, JSON values out); :func:`read_timeline` reads what it
needs through the session's :class:`~durable_turns.AgentSession`. The snapshot carries
``seq``, the newest event it saw: a client that follows the session's
``/events?after=<seq>`` misses nothing and sees nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..commands import live_turns
from ..events import (
    ActionCompleted,
    ActionInDoubt,
    ActionRequested,
    ContextCompacted,
    InputRequested,
    MessageCompleted,
    MessageSteered,
    TurnCancelled,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
    TurnStarted,
)
from ..messages import Message
from ..records import (
    ChainEntry,
    InputStepId,
    ModelStepId,
    ToolStepId,
    TurnStatus,
)
from ..sessions import AgentSession

Row = dict[str, Any]


def _duration(row: Row) -> None:
    start, end = row.get("started_at"), row.get("ended_at")
    row["duration"] = round(end - start, 6) if start is not None and end is not None else None


def _thinking(m: Message | None) -> list[str]:
    if m is None:
        return []
    out = []
    for block in m.content:
        if block.get("type") == "thinking":
            out.append(str(block.get("thinking", "")))
        elif block.get("type") == "redacted_thinking":
            out.append("[redacted thinking]")
    return out


def _tool_status(e: ActionCompleted) -> str:
    if e.error is not None:
        return "failed" if e.error.startswith("turn failed:") else "error"
    if e.result == {"cancelled": True}:
        return "cancelled"
    return "done"


class _Turn:
    """The fold of one turn's events into rows."""

    def __init__(self, record: ChainEntry, assistant: list[tuple[int, Message]],
                 answers: dict[str, ChainEntry]) -> None:
        self.record = record
        self.assistant = assistant
        self.answers = answers
        self.rows: list[Row] = []
        self.open: dict[str, Row] = {}
        self.cursor: float | None = None
        self.status: str | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.usage: dict[str, int] = {}
        self.models = 0
        self.n: int | None = None
        """The transcript index of the latest model reply (its calls' steps are keyed on it)."""
        self.blamed = False
        """Whether the latest event failed an owed call (the turn's failure is the call's)."""
        self.text: str | None = None
        self.error: str | None = None
        self.reason: str | None = None
        self.doubts: dict[str, dict[str, Any]] = {}
        """The latest ``action.in_doubt`` of each call: ``{attempt, settled}`` (F26)."""

    def apply(self, e: TurnEvent) -> None:
        at = e.at
        if isinstance(e, TurnStarted):
            self.on_turn_started(e)
        elif isinstance(e, MessageCompleted):
            self.on_message_completed(e)
        elif isinstance(e, ActionRequested):
            self.on_action_requested(e)
        elif isinstance(e, ActionCompleted):
            self.on_action_completed(e)
        elif isinstance(e, ActionInDoubt):
            self.on_action_in_doubt(e)
        elif isinstance(e, InputRequested):
            at = self.on_input_requested(e) or at
        elif isinstance(e, ContextCompacted):  # where the session was compacted (F23)
            self.rows.append({"kind": "compact", "id": e.step, "status": "done",
                              "started_at": self.cursor, "ended_at": e.at,
                              "tokens_before": e.tokens_before, "tokens_after": e.tokens_after,
                              "covered": e.covered, "cleared": e.cleared,
                              "summarised": e.summarised, "summary": e.summary,
                              "summary_calls": e.summary_calls})
        elif isinstance(e, MessageSteered):  # a message that joined the turn (F25)
            self.rows.append({"kind": "steered", "id": None, "status": "done",
                              "started_at": e.at, "ended_at": e.at, "text": e.text,
                              "by": e.by, "entry_id": e.entry_id})
        elif isinstance(e, TurnCompleted):
            self.on_turn_completed(e)
        elif isinstance(e, TurnFailed):
            self.on_turn_failed(e)
        elif isinstance(e, TurnCancelled):
            self.on_turn_cancelled(e)
        self.blamed = isinstance(e, ActionCompleted) and _tool_status(e) == "failed"
        if at is not None and (self.cursor is None or at > self.cursor):
            self.cursor = at

    def on_turn_started(self, e: TurnStarted) -> None:
        self.started_at, self.status = e.at, "running"

    def on_message_completed(self, e: MessageCompleted) -> None:
        n, m = self.assistant[self.models] if self.models < len(self.assistant) else (None, None)
        self.models += 1
        for k, v in e.usage.items():
            if isinstance(v, int):
                self.usage[k] = self.usage.get(k, 0) + v
        self.n = n
        row = {"kind": "model", "id": str(ModelStepId(n)) if n is not None else None,
               "status": "done", "started_at": self.cursor, "ended_at": e.at,
               "text": e.text, "tool_calls": [c.to_dict() for c in e.tool_calls],
               "stop_reason": e.stop_reason, "usage": dict(e.usage), "thinking": _thinking(m)}
        self.rows.append(row)

    def on_action_requested(self, e: ActionRequested) -> None:
        n = self.n
        row = {"kind": "tool", "id": str(ToolStepId(n, e.call.id)) if n is not None else None,
               "name": e.call.name, "call_id": e.call.id, "input": e.call.input,
               "status": "queued", "started_at": None, "ended_at": None, "result": None,
               "error": None, "resumed": False, "in_doubt": None}
        self.rows.append(row)
        self.open[e.call.id] = row

    def on_action_completed(self, e: ActionCompleted) -> None:
        row = self.open.pop(e.call.id, None)
        if row is None:  # it parked before: the run after the answer is a row of its own
            parked = next((r for r in self.rows if r.get("call_id") == e.call.id), None)
            row = {"kind": "tool", "id": parked["id"] if parked else None, "name": e.call.name,
                   "call_id": e.call.id, "input": e.call.input, "resumed": True,
                   "in_doubt": self.doubts.get(e.call.id)}
            self._insert_after(row, lambda r: r["kind"] == "input"
                               and r.get("call_id") == e.call.id)
        row.update(status=_tool_status(e), started_at=self.cursor, ended_at=e.at,
                   result=e.result, error=e.error)

    def on_action_in_doubt(self, e: ActionInDoubt) -> None:
        """A call found in doubt on a replay, or how it was settled: its rows say so."""
        doubt = {"attempt": e.attempt, "settled": e.settled}
        self.doubts[e.call.id] = doubt
        for row in self.rows:
            if row["kind"] == "tool" and row.get("call_id") == e.call.id:
                row["in_doubt"] = doubt

    def on_input_requested(self, e: InputRequested) -> float | None:
        request = e.request
        tool = self.open.pop(request.call_id, None)
        if tool is not None:
            tool.update(status="parked", started_at=self.cursor, ended_at=e.at)
        row: Row = {"kind": "input", "id": str(InputStepId(self.record.turn_id, request.id)),
                    "call_id": request.call_id, "status": "waiting", "started_at": e.at,
                    "ended_at": None, "prompt": request.prompt, "schema": request.schema,
                    "answerers": request.answerers, "value": None, "by": None}
        self._insert_after(row, lambda r: r is tool)
        self.status = "suspended"
        answer = self.answers.get(request.id)
        if answer is None or answer.status != TurnStatus.COMPLETED:
            return None
        data = answer.args or {}
        at = data.get("at")
        row.update(status="answered", ended_at=at, value=data.get("value"), by=data.get("by"))
        self.status = "running"
        return at if isinstance(at, int | float) else None

    def on_turn_completed(self, e: TurnCompleted) -> None:
        self.status, self.ended_at, self.text = "completed", e.at, e.text

    def on_turn_failed(self, e: TurnFailed) -> None:
        self.status, self.ended_at, self.error = "failed", e.at, e.error
        if not self.blamed:
            # No owed call took the blame: the model step was what failed.
            self.rows.append({"kind": "model", "id": None, "status": "failed",
                              "started_at": self.cursor, "ended_at": e.at, "error": e.error})

    def on_turn_cancelled(self, e: TurnCancelled) -> None:
        self.status, self.ended_at, self.reason = "cancelled", e.at, e.reason

    def _insert_after(self, row: Row, where: Any) -> None:
        for i in range(len(self.rows) - 1, -1, -1):
            if where(self.rows[i]):
                self.rows.insert(i + 1, row)
                return
        self.rows.append(row)

    def result(self) -> dict[str, Any]:
        status = self.status or str(self.record.status)
        if status == "running":
            waiting = [r for r in self.rows if r["status"] == "queued"]
            if waiting:
                waiting[0].update(status="running", started_at=self.cursor)
            elif not self.rows or self.rows[-1]["kind"] != "input":
                self.rows.append({"kind": "model", "id": None, "status": "running",
                                  "started_at": self.cursor, "ended_at": None})
        for row in self.rows:
            _duration(row)
        opening = self.record.opening
        out = {"turn_id": self.record.turn_id, "status": status,
               "role": opening.role if opening else None, "by": opening.by if opening else None,
               "text": opening.text if opening else "", "started_at": self.started_at,
               "ended_at": self.ended_at, "usage": self.usage, "result": self.text,
               "error": self.error, "reason": self.reason, "steps": self.rows}
        _duration(out)
        return out


def timeline(chain: Sequence[ChainEntry], events: Sequence[TurnEvent],
             transcript: Sequence[Message], *, since: int | None = None) -> dict[str, Any]:
    """The live generation's turns, each with its rows, and ``seq``, the newest event seen.

    Args:
        chain: the session's chain entries in order (turns and commands), read after
            ``events`` (so it has every turn those events belong to).
        events: the session's stored events in order: all of them, or (with ``since``) every
            one from the first event of the turn at ordinal ``since`` on.
        transcript: the live message log, read after ``events`` (so it holds every message
            those events announce).
        since: leave out the turns before this ordinal; ``earlier`` counts them.
    """
    seq = max((e.seq for e in events), default=0)
    live = live_turns(chain)
    shown = [t for t in live if since is None or t.ordinal >= since]
    answers: dict[str, dict[str, ChainEntry]] = {}
    for t in chain:
        if t.kind == "resume" and t.args:
            answers.setdefault(str(t.args.get("turn_id")), {})[str(t.args.get("input_id"))] = t
    assistant: dict[str, list[tuple[int, Message]]] = {}
    for i, m in enumerate(transcript):
        if m.role == "assistant" and m.turn_id is not None:
            assistant.setdefault(m.turn_id, []).append((i, m))
    turns = {t.turn_id: _Turn(t, assistant.get(t.turn_id, []), answers.get(t.turn_id, {}))
             for t in shown}
    for e in events:
        turn = turns.get(e.turn_id)
        if turn is not None:
            turn.apply(e)
    return {"seq": seq, "earlier": len(live) - len(shown),
            "turns": [t.result() for t in turns.values()]}


async def read_timeline(session: AgentSession, *, last: int | None = None) -> dict[str, Any]:
    """:func:`timeline` of a session (its ``last`` turns only, if given), read in the order
    it needs.

    With ``last``, only the events from the first of those turns on are kept: a console
    showing the end of a long session is sent only that.
    """
    since = None
    events: list[TurnEvent] | None = None
    if last is not None:
        live = live_turns(await session.chain())
        if len(live) > last:
            first = live[len(live) - last]
            since = first.ordinal
            head = await session.events(turn_id=first.turn_id)
            if head:  # one read from there on: no event between two reads goes missing
                events = await session.events(head[0].seq - 1)
    if events is None:
        events = await session.events()
    # Read after the events: a turn accepted meanwhile is in the chain with its events.
    chain = await session.chain()
    transcript = await session.transcript()
    return timeline(chain, events, transcript, since=since)


async def last_activity(session: AgentSession) -> float | None:
    """When the session last did something: its latest turn's newest event, or the latest
    answer to a park, whichever is later (``None`` if neither has a time)."""
    chain = await session.chain()
    times: list[float] = []
    latest = next((t for t in reversed(chain) if t.kind == "turn"), None)
    if latest is not None:
        times += [e.at for e in await session.events(turn_id=latest.turn_id)
                  if e.at is not None]
    answer = next((t for t in reversed(chain) if t.kind == "resume"), None)
    if answer is not None and isinstance((answer.args or {}).get("at"), int | float):
        times.append(float((answer.args or {})["at"]))
    return max(times, default=None)


__all__ = ["Row", "last_activity", "read_timeline", "timeline"]
