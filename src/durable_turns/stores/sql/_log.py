"""The session log of the SQL stores: one append-only row per step, each payload encoded once.

A step's commit appends one row to ``log``, keyed ``(sid, seq, sub)``::

    seq      the session's newest event seq once the step committed (its last event's)
    sub      0 for a row with events; a row without events gets the next number after the
             rows already at its ``seq`` (1, 2, …), so the key only ever grows
    gen      the generation the step wrote into
    n        the generation's message count after the step (what a new lease counts from)
    turn_id  the turn of the row's events (else of its step, else of its message); NULL
             when its events belong to several turns (each then names its own)
    body     the step's messages (:func:`~durable_turns.messages.encode_message`), joined
             by a newline (which their JSON never holds raw); NULL when none
    step     the step id of the row's one checkpoint, ``memo`` its data; several
             checkpoints (or one of another turn): ``step`` NULL and ``memo`` a JSON list
             ``[[step_id, turn_id, data], …]``
    events   a JSON list ``[[type, fields], …]``: each event's own fields and ``at``, its
             ``seq`` being implied (they are consecutive and end at the row's ``seq``)

An event never repeats what the row's messages hold: ``"@": k`` names the row's k-th message,
and the fields it gives are left out (``turn.started``, ``turn.completed``: ``text``;
``message.completed``: ``text``, ``tool_calls``, ``usage``; ``action.requested``: ``call``,
the message's call ``"c"``; ``action.completed``: ``result``). The event read back is equal
to the one written: a field is left out only when the message holds an equal value.

Why one row: a commit then dirties one B-tree page per session instead of one per table
(messages, steps, events), and every read of the seam stays one range of the primary key:
events after a seq, the newest seq, the lease's counters (the session's last row).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...events import (
    ActionCompleted,
    ActionRequested,
    MessageCompleted,
    TurnCompleted,
    TurnEvent,
    TurnStarted,
    event_from_fields,
)
from ...messages import Message, decode_message, encode_json, encode_message
from ...records import HOT_STEP_PREFIXES, StepRecord

Row = tuple[int, str | None, str | None, str | None, str | None, str | None]
"""``(n, turn_id, body, step, memo, events)`` of a new row (the key and ``gen`` aside)."""

LOOKED_UP = ("memo IS NOT NULL AND (step IS NULL OR ("
             + " AND ".join(f"substr(step, 1, {len(p)}) <> '{p}'" for p in HOT_STEP_PREFIXES)
             + "))")
"""The rows whose checkpoints are looked up by id on the hot path (a person's answer, a
subagent's record) and rows of several checkpoints: the partial index ``log_lookup`` holds
only them, so a model or tool step (the common row) writes no index entry. A query names
this condition word for word so the database may use the index (no ``%`` in it: psycopg
would read it as a placeholder)."""

LEGACY_TO_LOG: list[str] = [
    # Rows of schema version 2 (one table each for messages, steps and events) become log
    # rows: messages then checkpoints at seq 0 in their order, each event at its own seq
    # (stored whole: nothing to derive it from), and one last row per session carrying its
    # counters (newest seq, the live generation's message count).
    """INSERT INTO log (sid, seq, sub, gen, n, turn_id, body)
    SELECT sid, 0, row_number() OVER (PARTITION BY sid ORDER BY gen, idx), gen, idx + 1,
           turn_id, body FROM messages""",
    """INSERT INTO log (sid, seq, sub, gen, n, turn_id, step, memo)
    SELECT sid, 0, (SELECT count(*) FROM messages m WHERE m.sid = s.sid)
           + row_number() OVER (PARTITION BY sid ORDER BY gen, step_id), gen, 0, turn_id,
           step_id, data FROM steps s""",
    """INSERT INTO log (sid, seq, sub, gen, n, turn_id, events)
    SELECT sid, seq, 0, 0, 0, turn_id, '[["' || type || '",' || data || ']]' FROM events""",
    """INSERT INTO log (sid, seq, sub, gen, n)
    SELECT s.sid, coalesce((SELECT max(seq) FROM events e WHERE e.sid = s.sid), 0),
           (SELECT count(*) FROM messages m WHERE m.sid = s.sid)
           + (SELECT count(*) FROM steps t WHERE t.sid = s.sid) + 1,
           s.generation,
           (SELECT coalesce(max(idx) + 1, 0) FROM messages m
            WHERE m.sid = s.sid AND m.gen = s.generation)
    FROM sessions s""",
    "DROP TABLE messages",
    "DROP TABLE steps",
    "DROP TABLE events",
]
"""The statements that move a version-2 database's rows into ``log`` (run by migration 3 of
``schema``, in the open's transaction, after it created ``log``)."""


def row_of(messages: list[Message], steps: list[tuple[str, str, str]],
           events: list[TurnEvent], first: int) -> Row:
    """A step's row: its messages (numbered from ``first``), checkpoints and events."""
    turn_id: str | None = None
    if events:
        turn_id = events[0].turn_id
        for e in events:
            if e.turn_id != turn_id:
                turn_id = None
                break
    elif steps:
        turn_id = steps[0][1]
    elif messages:
        turn_id = messages[0].turn_id
    body = "\n".join([encode_message(m) for m in messages]) if messages else None
    step = memo = None
    if len(steps) == 1 and steps[0][1] == turn_id:
        step, memo = steps[0][0], steps[0][2]
    elif steps:
        memo = encode_json([list(s) for s in steps])
    stored = None
    if events:
        stored = encode_json([[e.type, _fields(e, messages, turn_id)] for e in events])
    return first + len(messages), turn_id, body, step, memo, stored


def _fields(e: TurnEvent, messages: list[Message], turn_id: str | None) -> dict[str, Any]:
    """What a row keeps of an event: what its messages do not hold already."""
    out = _derived(e, messages) if messages and e.child is None else None
    if out is None:
        out = e.payload()
    out["at"] = e.at
    if e.turn_id != turn_id:
        out["turn_id"] = e.turn_id
    return out


def _derived(e: TurnEvent, messages: list[Message]) -> dict[str, Any] | None:
    # Identity first: the engine hands the same objects to the message and the event.
    if isinstance(e, ActionCompleted):
        for k, m in enumerate(messages):
            if m.call_id == e.call.id and (m.result is e.result or m.result == e.result):
                out: dict[str, Any] = {"@": k, "call": e.call.to_dict()}
                if e.error is not None:
                    out["error"] = e.error
                return out
    elif isinstance(e, MessageCompleted):
        for k, m in enumerate(messages):
            if m.role == "assistant" and m.text == e.text and m.tool_calls == e.tool_calls \
                    and m.usage == e.usage:
                return {"@": k, "stop_reason": e.stop_reason}
    elif isinstance(e, ActionRequested):
        for k, m in enumerate(messages):
            for j, c in enumerate(m.tool_calls):
                if c is e.call or c == e.call:
                    return {"@": k, "c": j}
    elif isinstance(e, TurnStarted):
        for k, m in enumerate(messages):
            if m.is_opening and m.text == e.text:
                return {"@": k}
    elif isinstance(e, TurnCompleted):
        for k, m in enumerate(messages):
            if m.role == "assistant" and m.text == e.text:
                return {"@": k}
    return None


def steps_of(turn_id: str | None, step: str | None, memo: str) -> list[StepRecord]:
    """A row's checkpoints."""
    if step is not None:
        return [StepRecord(step, turn_id or "", memo)]
    return [StepRecord(s, t, d) for s, t, d in json.loads(memo)]


def events_of(agent: str, session: str, seq: int, turn_id: str | None, body: str | None,
              stored: str) -> list[TurnEvent]:
    """A row's events, rebuilt whole (what the messages hold filled in)."""
    items = json.loads(stored)
    first = seq - len(items) + 1
    messages: list[Message] | None = None
    out: list[TurnEvent] = []
    for i, (etype, data) in enumerate(items):
        tid = data.pop("turn_id", turn_id)
        k = data.pop("@", None)
        if k is not None:
            if messages is None:
                messages = [decode_message(b) for b in (body or "").split("\n")]
            m = messages[k]
            if etype == "action.completed":
                data["result"] = m.result
            elif etype == "message.completed":
                data.update(text=m.text, tool_calls=m.tool_calls, usage=m.usage)
            elif etype == "action.requested":
                data["call"] = m.tool_calls[data.pop("c")]
            elif etype in ("turn.started", "turn.completed"):
                data["text"] = m.text
        out.append(event_from_fields(agent, session, first + i, tid, etype, data))
    return out


def renamed(step: str | None, memo: str | None, events: str | None,
            renames: Mapping[str, str]) -> tuple[str | None, str | None]:
    """A row's ``memo`` and ``events`` with every reference to a renamed subagent child
    session (a child step's record, a forwarded event's ``child``, a request routed to a
    child) naming its new id; rewritten as JSON, never as text."""
    if not renames:
        return memo, events
    if memo is not None:
        if step is not None:
            if step.startswith("child:"):
                memo = _renamed_memo(memo, renames)
        else:
            memo = encode_json([[s, t, _renamed_memo(d, renames) if s.startswith("child:")
                                 else d] for s, t, d in json.loads(memo)])
    if events is not None:
        items = json.loads(events)
        for _etype, data in items:
            _rename_child(data.get("child"), renames)
            request = data.get("request")
            for r in [request, *(request or {}).get("more", ())] if request else ():
                _rename_child(r.get("child"), renames)
        events = encode_json(items)
    return memo, events


def _renamed_memo(memo: str, renames: Mapping[str, str]) -> str:
    data = json.loads(memo)
    _rename_child(data, renames)
    return encode_json(data)


def _rename_child(ref: Any, renames: Mapping[str, str]) -> None:
    if isinstance(ref, dict) and ref.get("session") in renames:
        ref["session"] = renames[ref["session"]]


__all__ = ["LEGACY_TO_LOG", "LOOKED_UP", "Row", "events_of", "renamed", "row_of", "steps_of"]
