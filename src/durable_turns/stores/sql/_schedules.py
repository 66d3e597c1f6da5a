"""The statements of the ``schedules`` table (F24), written once for every dialect.

A row is a schedule: its name (the key), its agent, its definition and where it stands (the
JSON of :meth:`Schedule.to_dict <durable_turns.schedules.Schedule.to_dict>`), its next fire
time (``next_fire``, milliseconds since the epoch, UTC; ``NULL``: it fires no more) and a
claim: the worker that fires its due time holds it until ``claimed_until``. A claim is one
statement: the due rows nobody holds, oldest first, each taken by one worker (PostgreSQL:
``FOR UPDATE SKIP LOCKED``, so workers claiming at once take different rows; SQLite's
statements are serialised). A claim that its worker did not give back (it died) is taken
again once it runs out; the fire's turn id is derived from the schedule and its time, so a
second fire of one time starts no second turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Protocol, TypeVar, cast

from ...messages import encode_json
from ...schedules import Schedule
from ._connection import Connection
from .schema import Syntax

__all__ = ["KeepsSchedules", "ScheduleStatements", "SqlScheduleBook", "millis"]

T = TypeVar("T")


def millis(t: datetime | None) -> int | None:
    """``t`` as milliseconds since the epoch (``None`` stays ``None``)."""
    return None if t is None else int(t.timestamp() * 1000)


def _schedule(body: str, next_ms: int | None) -> Schedule:
    data = json.loads(body)
    data["next_fire"] = None if next_ms is None else datetime.fromtimestamp(
        next_ms / 1000, UTC).isoformat()
    return Schedule.from_dict(data)


class ScheduleStatements:
    """The ``schedules`` statements in one dialect's SQL.

    Args:
        syntax: the dialect's.
    """

    def __init__(self, syntax: Syntax) -> None:
        placeholder = syntax.placeholder

        def q(sql: str) -> str:
            return sql if placeholder == "?" else sql.replace("?", placeholder)

        skip_locked = " FOR UPDATE SKIP LOCKED" if syntax.lock_rows else ""
        self._put = q(
            "INSERT INTO schedules (name, agent, next_fire, body) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET agent = excluded.agent, "
            "next_fire = excluded.next_fire, body = excluded.body, claimed_until = NULL, "
            "claimed_by = NULL")
        self._get = q("SELECT body, next_fire FROM schedules WHERE name = ?")
        self._delete = q("DELETE FROM schedules WHERE name = ?")
        self._all = "SELECT body, next_fire FROM schedules ORDER BY name"
        self._of_agent = q(
            "SELECT body, next_fire FROM schedules WHERE agent = ? ORDER BY name")
        claim = ("UPDATE schedules SET claimed_until = ?, claimed_by = ? WHERE name IN ("
                 "SELECT name FROM schedules WHERE next_fire IS NOT NULL AND next_fire <= ? "
                 "AND (claimed_until IS NULL OR claimed_until < ?){agents} "
                 f"ORDER BY next_fire LIMIT ?{skip_locked}) RETURNING body, next_fire")
        self._claim = q(claim.format(agents=""))

        def claim_of(n: int) -> str:
            return q(claim.format(agents=f" AND agent IN ({', '.join('?' * n)})"))

        self._claim_of = claim_of
        self._advance = q(
            "UPDATE schedules SET next_fire = ?, body = ?, claimed_until = NULL, "
            "claimed_by = NULL WHERE name = ? AND next_fire = ?")
        self._release = q(
            "UPDATE schedules SET claimed_until = NULL, claimed_by = NULL "
            "WHERE name = ? AND claimed_by = ?")
        nxt = ("SELECT MIN(CASE WHEN claimed_until > next_fire THEN claimed_until "
               "ELSE next_fire END) FROM schedules WHERE next_fire IS NOT NULL{agents}")
        self._next = nxt.format(agents="")

        def next_of(n: int) -> str:
            return q(nxt.format(agents=f" AND agent IN ({', '.join('?' * n)})"))

        self._next_of = next_of

    def put(self, c: Connection, s: Schedule) -> None:
        """Store ``s`` under its name, replacing one of that name (and its claim)."""
        c.changes(self._put, (s.name, s.agent, millis(s.next_fire), encode_json(s.to_dict())))

    def get(self, c: Connection, name: str) -> Schedule | None:
        """The schedule of that name."""
        rows = c.rows(self._get, (name,))
        return _schedule(rows[0][0], rows[0][1]) if rows else None

    def delete(self, c: Connection, name: str) -> bool:
        """Delete the schedule of that name; whether there was one."""
        return c.changes(self._delete, (name,)) > 0

    def all(self, c: Connection, agent: str | None) -> list[Schedule]:
        """Every schedule (of ``agent``), by name."""
        rows = c.rows(self._all) if agent is None else c.rows(self._of_agent, (agent,))
        return [_schedule(body, nxt) for body, nxt in rows]

    def claim(self, c: Connection, now: datetime, until: datetime, owner: str,
              limit: int, agents: Sequence[str] | None = None) -> list[Schedule]:
        """Claim up to ``limit`` schedules (of ``agents``) due at ``now`` that nobody holds,
        until ``until``, for ``owner``; oldest due first."""
        now_ms = millis(now)
        if agents is not None and not agents:
            return []
        sql = self._claim if agents is None else self._claim_of(len(agents))
        rows = c.rows(sql, (millis(until), owner, now_ms, now_ms, *(agents or ()), limit))
        out = [_schedule(body, nxt) for body, nxt in rows]
        out.sort(key=lambda s: (s.next_fire or now, s.name))
        return out

    def advance(self, c: Connection, s: Schedule, claimed: datetime) -> bool:
        """Store where ``s`` stands after its fire of ``claimed`` (its next time, its last
        fire) and give its claim back, unless someone already moved it past ``claimed``."""
        return c.changes(self._advance, (millis(s.next_fire), encode_json(s.to_dict()),
                                         s.name, millis(claimed))) > 0

    def release(self, c: Connection, name: str, owner: str) -> bool:
        """Give ``owner``'s claim of the schedule back without moving it."""
        return c.changes(self._release, (name, owner)) > 0

    def next_due(self, c: Connection, agents: Sequence[str] | None = None) -> datetime | None:
        """The earliest time a schedule (of ``agents``) can be claimed: its next fire, or
        when the claim someone holds of it runs out."""
        if agents is not None and not agents:
            return None
        rows: list[Any] = (c.rows(self._next) if agents is None
                           else c.rows(self._next_of(len(agents)), tuple(agents)))
        ms = rows[0][0] if rows else None
        return None if ms is None else datetime.fromtimestamp(int(ms) / 1000, UTC)


class _Runs(Protocol):
    async def read(self, job: Callable[[Any], T]) -> T: ...

    async def transact(self, job: Callable[[Any], T]) -> T: ...

    async def statement(self, job: Callable[[Any], T]) -> T: ...


class SqlScheduleBook:
    """``ScheduleBook`` (:mod:`durable_turns.schedules`) over a SQL store's jobs.

    Args:
        store: runs the jobs (the :class:`~durable_turns.stores.sql.SqlStore`).
        syntax: its dialect's.
    """

    def __init__(self, store: _Runs, syntax: Syntax) -> None:
        self._store = store
        self._st = ScheduleStatements(syntax)
        self._watchers: list[Callable[[], None]] = []

    def watch(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` after each schedule this process puts or deletes; returns the undo."""
        self._watchers.append(fn)

        def undo() -> None:
            if fn in self._watchers:
                self._watchers.remove(fn)
        return undo

    def _changed(self) -> None:
        for fn in list(self._watchers):
            fn()

    async def put(self, schedule: Schedule) -> None:
        """``ScheduleBook.put``."""
        await self._store.statement(lambda c: self._st.put(c, schedule))
        self._changed()

    async def get(self, name: str) -> Schedule | None:
        """``ScheduleBook.get``."""
        return await self._store.read(lambda c: self._st.get(c, name))

    async def delete(self, name: str) -> bool:
        """``ScheduleBook.delete``."""
        gone = await self._store.statement(lambda c: self._st.delete(c, name))
        self._changed()
        return gone

    async def all(self, agent: str | None = None) -> list[Schedule]:
        """``ScheduleBook.all``."""
        return await self._store.read(lambda c: self._st.all(c, agent))

    async def claim(self, now: datetime, until: datetime, owner: str, limit: int = 100, *,
                    agents: Sequence[str] | None = None) -> list[Schedule]:
        """``ScheduleBook.claim``."""
        return await self._store.transact(
            lambda c: self._st.claim(c, now, until, owner, limit, agents))

    async def advance(self, schedule: Schedule, claimed: datetime) -> bool:
        """``ScheduleBook.advance``."""
        return await self._store.statement(lambda c: self._st.advance(c, schedule, claimed))

    async def release(self, name: str, owner: str) -> bool:
        """``ScheduleBook.release``."""
        return await self._store.statement(lambda c: self._st.release(c, name, owner))

    async def next_due(self, agents: Sequence[str] | None = None) -> datetime | None:
        """``ScheduleBook.next_due``."""
        return await self._store.read(lambda c: self._st.next_due(c, agents))


class KeepsSchedules:
    """What a SQL store has of schedules (``SqlStore`` is one): :attr:`schedules`."""

    @cached_property
    def schedules(self) -> SqlScheduleBook:
        """Its schedules (``SessionQueries.schedules``, F24), in its ``schedules`` table."""
        syntax: Syntax = cast(Any, self).dialect.syntax
        return SqlScheduleBook(cast(_Runs, self), syntax)
