"""A session's history and its forks, on the SQL store: read every checkpoint (log row) in
order; copy a session's rows up to one of them into new sessions, in one transaction.

A fork's rows are its source's, byte for byte but for two things: they move to generation 0
of the new session, and references to renamed subagent children are rewritten (as JSON:
``log.renamed``). Its ``log_transcript`` copies come along up to the fork's point, so a long
session's fork reads as fast as its source. The fork's chain is what the engine planned
(:class:`~durable_turns.history.ForkPlan`): its turns as they stood at the checkpoint.
"""

from __future__ import annotations

from typing import Any

from ...errors import SessionExistsError
from ...history import Checkpoint, ForkPlan
from ...messages import encode_json, encode_message
from ...records import ChainEntry, InputRequest, SessionKey
from ._connection import Connection
from ._log import events_of, renamed, steps_of
from ._statements import Statements

__all__ = ["checkpoints", "fork"]

_ROWS = ("SELECT gen, seq, sub, n, turn_id, body, step, memo, events FROM log "
         "WHERE sid = ?{gen} ORDER BY seq, sub")
_ROWS_UPTO = ("SELECT seq, sub, n, turn_id, body, step, memo, events FROM log "
              "WHERE sid = ? AND gen = ? AND (seq < ? OR (seq = ? AND sub <= ?)) "
              "ORDER BY seq, sub")
_INSERT_ROW = ("INSERT INTO log (sid, seq, sub, gen, n, turn_id, body, step, memo, events) "
               "VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?, ?)")
_COPIES_UPTO = ("SELECT n, seq, body FROM log_transcript WHERE sid = ? AND gen = ? "
                "AND (seq < ? OR (seq = ? AND n <= ?)) ORDER BY n")
_INSERT_COPY = "INSERT INTO log_transcript (sid, gen, n, seq, body) VALUES (?, 0, ?, ?, ?)"
_INSERT_ENTRY = ("INSERT INTO turns (sid, turn_id, kind, status, opening, event, policy, "
                 "request, text, error, reason) VALUES (?, ?, 'turn', ?, ?, ?, ?, ?, ?, ?, ?)")
_SET_STATUS = "UPDATE sessions SET status = ? WHERE sid = ?"
_HAS_CHAIN = "SELECT 1 FROM turns WHERE sid = ? LIMIT 1"
_HAS_ROWS = "SELECT 1 FROM log WHERE sid = ? LIMIT 1"


def checkpoints(st: Statements, c: Connection, key: SessionKey,
                generation: int | None) -> list[Checkpoint]:
    """``SessionQueries.checkpoints``: every log row of the session (of one generation),
    in order, its steps and events rebuilt."""
    sid = _sid(st, c, key)
    if sid is None:
        return []
    params: tuple[Any, ...] = (sid,) if generation is None else (sid, generation)
    sql = st.q(_ROWS.format(gen="" if generation is None else " AND gen = ?"))
    out: list[Checkpoint] = []
    for gen, seq, sub, n, turn_id, body, step, memo, events in c.rows(sql, params):
        out.append(Checkpoint(
            int(gen), int(seq), int(sub), int(n), turn_id,
            tuple(steps_of(turn_id, step, memo)) if memo is not None else (),
            tuple(events_of(key.agent, key.session, int(seq), turn_id, body, events))
            if events is not None else ()))
    return out


def _sid(st: Statements, c: Connection, key: SessionKey) -> int | None:
    rows = c.rows(st.q("SELECT sid FROM sessions WHERE agent = ? AND session = ?"),
                  (key.agent, key.session))
    return int(rows[0][0]) if rows else None


def fork(st: Statements, c: Connection, plan: ForkPlan) -> None:
    """Write one fork (inside the caller's transaction).

    Raises:
        SessionExistsError: the new session has a chain or a log already, or another owner.
    """
    src = _sid(st, c, plan.src)
    # The owner first: it makes the session's row with its owner, or names whose it is.
    if plan.owner is not None and st.own_session(c, plan.dst, plan.owner) != plan.owner:
        raise SessionExistsError(str(plan.dst))  # another's: the transaction writes nothing
    dst = st.sid(c, plan.dst, create=True)
    assert dst is not None
    if c.rows(st.q(_HAS_CHAIN), (dst,)) or c.rows(st.q(_HAS_ROWS), (dst,)):
        raise SessionExistsError(str(plan.dst))
    if src is not None and plan.upto is not None:
        seq, sub = plan.upto
        rows = c.rows(st.q(_ROWS_UPTO),
                         (src, plan.generation, seq, seq, sub))
        last_n = 0
        for r_seq, r_sub, n, turn_id, body, step, memo, events in rows:
            memo, events = renamed(step, memo, events, plan.renames)
            c.changes(st.q(_INSERT_ROW), (dst, r_seq, r_sub, n, turn_id, body, step, memo,
                                          events))
            last_n = int(n)
        for n, copy_seq, body in c.rows(st.q(_COPIES_UPTO),
                                           (src, plan.generation, seq, seq, last_n)):
            c.changes(st.q(_INSERT_COPY), (dst, n, copy_seq, body))
    for t in plan.chain:
        c.changes(st.q(_INSERT_ENTRY), _entry_row(dst, t))
    c.changes(st.q(_SET_STATUS), (plan.status, dst))


def _json(value: Any) -> str | None:
    return None if value is None else encode_json(value)


def _entry_row(sid: int, t: ChainEntry) -> tuple[Any, ...]:
    if t.opening is None:
        raise ValueError(f"a fork's chain holds turns only, not the {t.kind} {t.turn_id!r}")
    request: InputRequest | None = t.request
    return (sid, t.turn_id, t.status.value, encode_message(t.opening), _json(t.event),
            _json(t.policy), _json(request.to_dict() if request else None), t.text, t.error,
            t.reason)
