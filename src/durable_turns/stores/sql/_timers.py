"""The timers' statements (F24): arming a wake-up with the park that needs it, the next due,
claiming the due ones (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, one worker each) and
dropping a fired one. Times are kept as milliseconds since the epoch (``kit.millis``)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import cast

from ...records import SessionKey
from .. import Timer, TimerKind
from ..kit import from_millis, millis
from ._connection import Connection, first
from .schema import Syntax

__all__ = ["TimerStatements"]

_COLS = "t.sid, t.id, t.due, t.kind, t.turn_id, t.input_id"


class TimerStatements:
    """The timers' statements in one dialect's SQL (run inside the store's transactions).

    Args:
        syntax: the dialect's.
    """

    def __init__(self, syntax: Syntax) -> None:
        ph = syntax.placeholder

        def q(sql: str) -> str:
            return sql if ph == "?" else sql.replace("?", ph)

        self._q = q
        self._skip_locked = " FOR UPDATE OF t SKIP LOCKED" if syntax.lock_rows else ""
        self._arm_new = q(
            "INSERT INTO timers (sid, id, due, kind, turn_id, input_id) VALUES (?, ?, ?, ?, "
            "?, ?) ON CONFLICT (sid, id) DO NOTHING")
        self._arm = q(
            "INSERT INTO timers (sid, id, due, kind, turn_id, input_id) SELECT sid, ?, ?, ?, "
            "?, ? FROM sessions WHERE agent = ? AND session = ? ON CONFLICT (sid, id) DO "
            "UPDATE SET due = excluded.due, claimed_until = NULL")
        self._claim_one = q("UPDATE timers SET claimed_until = ? WHERE sid = ? AND id = ?")
        self._drop = q(
            "DELETE FROM timers WHERE id = ? AND due = ? AND sid = (SELECT sid FROM sessions "
            "WHERE agent = ? AND session = ?)")

    def _agents(self, agents: Collection[str]) -> str:
        return self._q(f"s.agent IN ({', '.join('?' for _ in agents)})")

    def arm_new(self, c: Connection, sid: int, timer: Timer) -> None:
        """Keep a timer a park arms, unless the session has one of its id (inside the park's
        commit)."""
        c.changes(self._arm_new, (sid, timer.id, millis(timer.due), timer.kind, timer.turn_id,
                                  timer.input_id))

    def arm(self, c: Connection, timer: Timer) -> None:
        """``TurnStore.arm_timer``."""
        c.changes(self._arm, (timer.id, millis(timer.due), timer.kind, timer.turn_id,
                              timer.input_id, timer.key.agent, timer.key.session))

    def next_due(self, c: Connection, agents: Collection[str],
                 key: SessionKey | None = None) -> datetime | None:
        """``TurnStore.next_timer``."""
        if not agents:
            return None
        one = "" if key is None else self._q(" AND s.agent = ? AND s.session = ?")
        row = first(c.rows(
            "SELECT min(coalesce(t.claimed_until, t.due)) FROM timers t JOIN sessions s "
            f"ON s.sid = t.sid WHERE {self._agents(agents)}{one}",
            (*agents, *(() if key is None else (key.agent, key.session)))))
        return None if row is None or row[0] is None else from_millis(int(row[0]))

    def claim(self, c: Connection, agents: Collection[str], now: datetime, limit: int,
              hold: float) -> list[Timer]:
        """``TurnStore.claim_timers``, inside a write transaction."""
        if not agents or limit <= 0:
            return []
        at = millis(now)
        rows = c.rows(
            f"SELECT {_COLS}, s.agent, s.session FROM timers t JOIN sessions s ON s.sid = t.sid "
            f"WHERE {self._agents(agents)} AND coalesce(t.claimed_until, t.due) <= "
            f"{self._q('?')} ORDER BY t.due LIMIT {int(limit)}{self._skip_locked}",
            (*agents, at))
        until = at + int(hold * 1000)
        out = []
        for sid, id_, due, kind, turn_id, input_id, agent, session in rows:
            c.changes(self._claim_one, (until, sid, id_))
            out.append(Timer(SessionKey(agent, session), id_, from_millis(int(due)),
                             cast(TimerKind, kind), turn_id, input_id))
        return out

    def drop(self, c: Connection, timer: Timer) -> None:
        """``TurnStore.drop_timer``."""
        c.changes(self._drop, (timer.id, millis(timer.due), timer.key.agent,
                               timer.key.session))
