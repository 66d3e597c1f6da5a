"""Every statement of a SQL store and what it means, written once for every dialect.

:class:`Statements` runs them on the :class:`Connection` the store hands in (two calls: a
statement's rows, a write's count of rows changed); the writes never begin or end a
transaction themselves (the dialect's transaction calls do). Statements use ``?`` placeholders,
rewritten once for drivers that want ``%s``, and portable SQL; where a dialect differs it says
so in its :class:`~durable_turns.stores.sql.schema.Syntax` (row locks, index hints).

A step's commit is the fencing check (a read of the session row), one ``log`` row, and an
``UPDATE turns`` only in the steps that move the chain (a turn's start, end or park): the
session row is written when its status changes, not per step. In a dialect whose statements
are serialised, the common step (one ``log`` row, nothing else) is one statement: the row is
inserted only while the lease's epoch is the session's (:meth:`Statements.append`).

The transcript: reading a long session's messages from ``log`` means stepping over one wide
row per step (its events and checkpoints too). So a commit that moves the chain, once at
least :data:`TRANSCRIPT_CHUNK` messages of the generation are not in ``log_transcript`` yet,
copies their bodies into one ``log_transcript`` row (``n``: the generation's message count
after them; ``seq``: the key of the last ``log`` row they came from), in the same transaction.
A read of the messages takes the ``log_transcript`` rows, then the ``log`` rows after the last
of them: the same messages, from a few narrow rows. A database without ``log_transcript``
rows (one migrated, a short session) reads them all from ``log``, as before.
"""

from __future__ import annotations

import json
from typing import Any

from ...events import TurnEvent
from ...messages import Message, MessageLog, encode_json
from ...records import (
    HOT_STEP_PREFIXES,
    ChainEntry,
    InputRequest,
    NewEntry,
    SessionInfo,
    SessionKey,
    SessionSummary,
    StepRecord,
    TurnStatus,
    Visibility,
    decode_entry,
    decode_while_parked,
    encode_entry,
)
from ..kit import Writes, check_enqueue, supersede_reason, timers_of, updated_request
from ._connection import Connection, first
from ._filters import visible_where
from ._log import LOOKED_UP, events_of, row_of, steps_of
from ._timers import TimerStatements
from .schema import OPEN as _OPEN
from .schema import Syntax

__all__ = [
    "LAST_ROW",
    "NEEDS_DRIVING",
    "TRANSCRIPT_CHUNK",
    "TRANSCRIPT_COPY_BYTES",
    "TRANSCRIPT_COPY_ROWS",
    "Statements",
    "counters",
]


_TURN_COLS = (
    "t.turn_id, t.ordinal, t.status, t.opening, t.event, t.policy, t.request, t.text, "
    "t.error, t.reason, t.cancel, t.kind, t.data, t.deliver"
)
NEEDS_DRIVING = ("(t.status IN ('queued', 'running') "
                 "OR (t.status = 'suspended' AND t.cancel IS NOT NULL))")
"""The chain entries ``t`` a driver has work for: queued or running, or parked with a cancel
to carry out (``ChainEntry.needs_driving``)."""
LAST_ROW = "SELECT seq, gen, n FROM log WHERE sid = {} ORDER BY seq DESC, sub DESC LIMIT 1"
"""The session's last log row (``{}``: the session id): its ``seq`` is the newest event seq,
its ``n`` the message count of generation ``gen``."""


TRANSCRIPT_CHUNK = 32
"""The fewest messages a ``log_transcript`` row holds (unless they are large:
:data:`TRANSCRIPT_COPY_BYTES`): the copy is made when a commit that moves the chain finds this
many not yet copied (so a turn end costs one indexed read, and every few turns a read of the
turn's rows and one insert)."""
TRANSCRIPT_COPY_ROWS = 1000
"""The most ``log`` rows one commit copies: a long history not copied yet (a database of
schema version 3) is copied over the session's next commits, a bounded piece each."""
TRANSCRIPT_COPY_BYTES = 1 << 20
"""The most bytes of messages one ``log_transcript`` row holds (unless one log row's alone
is more): large tool results are copied over several rows, each well within a backend's
bound on a value (a Durable Object's: 4 MiB)."""


def _load(v: str | None) -> Any:
    return None if v is None else json.loads(v)


def _dump(v: Any) -> str | None:
    return None if v is None else encode_json(v)


def _turn(row: Any) -> ChainEntry:
    request = _load(row[6])
    opening, args, data = decode_entry(row[11], row[3], _load(row[12]))
    return ChainEntry(
        turn_id=row[0], ordinal=row[1], status=TurnStatus(row[2]), opening=opening,
        event=_load(row[4]), policy=_load(row[5]),
        request=InputRequest.from_dict(request) if request else None,
        text=row[7], error=row[8], reason=row[9], cancel=row[10], kind=row[11], args=args,
        data=data, deliver=row[13],
    )


class Statements:
    """Every statement of a SQL store, in one dialect's SQL, run on the connection handed in.

    Methods that write must be called inside the store's transaction (or, where they say so,
    may run as a statement of their own); they never begin or end one themselves.

    Args:
        syntax: the dialect's.
    """

    def __init__(self, syntax: Syntax) -> None:
        placeholder = syntax.placeholder

        def q(sql: str) -> str:
            return sql if placeholder == "?" else sql.replace("?", placeholder)

        lock = " FOR UPDATE" if syntax.lock_rows else ""
        self.q = q
        """Rewrites a statement's ``?`` placeholders for the dialect."""
        self.timers = TimerStatements(syntax)
        self._lookup_hint = syntax.lookup_hint
        self._contains = syntax.contains
        self._sid = q("SELECT sid FROM sessions WHERE agent = ? AND session = ?")
        self._sid_for_write = self._sid + lock
        self._insert_session = q("INSERT INTO sessions (agent, session) VALUES (?, ?) "
                                 "ON CONFLICT (agent, session) DO NOTHING RETURNING sid")
        self._claim = q("UPDATE sessions SET epoch = epoch + 1 WHERE sid = ? "
                        "RETURNING epoch, generation")
        self._epoch = q("SELECT epoch FROM sessions WHERE sid = ?" + lock)
        self._last_row = q(LAST_ROW.format("?"))
        cols = "INSERT INTO log (sid, seq, sub, gen, n, turn_id, body, step, memo, events) "
        self.insert_row = q(cols + "VALUES (?, ?, 0, ?, ?, ?, ?, ?, ?, ?)")
        """A row with events: ``sub`` 0 (its ``seq`` is new)."""
        self.insert_quiet_row = q(
            cols + "VALUES (?, ?, (SELECT coalesce(max(sub), 0) + 1 FROM log "
            "WHERE sid = ? AND seq = ?), ?, ?, ?, ?, ?, ?, NULL)")
        """A row without events: after the rows already at its ``seq``."""
        self._append_fenced = q(cols + "SELECT ?, ?, 0, ?, ?, ?, ?, ?, ?, ? FROM sessions "
                                "WHERE sid = ? AND epoch = ?" + lock)
        """The common step in one statement: its row, written only while the epoch is the
        lease's (the fencing check and the write in one: atomic without a transaction where
        statements are serialised, and under the session row's lock where they are not)."""
        self._update_turn = q(
            "UPDATE turns SET status = ?, text = ?, error = ?, reason = ?, request = ? "
            "WHERE sid = ? AND turn_id = ?")
        self._set_status = q("UPDATE sessions SET status = ? WHERE sid = ?")
        self._new_generation = q(
            "UPDATE sessions SET generation = generation + 1, status = 'new' WHERE sid = ?")
        self._find_turn = q(f"SELECT {_TURN_COLS} FROM turns t WHERE sid = ? AND turn_id = ?")
        self._unfinished_rows = q(
            "SELECT turn_id, status, cancel, kind, CASE WHEN kind = 'turn' THEN NULL "
            f"ELSE opening END FROM turns WHERE sid = ? AND status IN {_OPEN} ORDER BY ordinal")
        """The unfinished entries, with a command's body (where its rule while parked is)."""
        self._supersede = q(
            "UPDATE turns SET cancel = ? WHERE sid = ? AND cancel IS NULL "
            "AND status IN ('queued', 'running')")
        self._insert_turn = q(
            "INSERT INTO turns (sid, turn_id, kind, status, opening, event, policy, deliver, "
            "data) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?) RETURNING ordinal")
        self._enqueue_plain = q(
            "INSERT INTO turns (sid, turn_id, kind, status, opening, event, policy, deliver, "
            "data) SELECT s.sid, ?, 'turn', 'queued', ?, ?, ?, ?, ? FROM sessions s "
            "WHERE s.agent = ? AND s.session = ? AND NOT EXISTS (SELECT 1 FROM turns t "
            "WHERE t.sid = s.sid AND t.status = 'suspended' AND t.cancel IS NULL) "
            "ON CONFLICT (sid, turn_id) DO NOTHING RETURNING ordinal")
        self._cancel = q(
            f"UPDATE turns SET cancel = ? WHERE sid = ? AND status IN {_OPEN} "
            "AND cancel IS NULL AND (turn_id = ? OR CAST(? AS text) IS NULL) RETURNING turn_id")
        self._cancel_of = q("SELECT cancel FROM turns WHERE sid = ? AND turn_id = ?")
        self._data_of = q("SELECT data FROM turns WHERE sid = ? AND turn_id = ?")
        self._set_data = q("UPDATE turns SET data = ? WHERE sid = ? AND turn_id = ?")
        self._info = q("SELECT status, generation, owner FROM sessions "
                       "WHERE agent = ? AND session = ?")
        self._own = q("INSERT INTO sessions (agent, session, owner) VALUES (?, ?, ?) "
                      "ON CONFLICT (agent, session) DO NOTHING")
        self._owner = q("SELECT owner FROM sessions WHERE agent = ? AND session = ?")
        self._settle = q(
            "UPDATE turns SET deliver = NULL WHERE turn_id = ? AND deliver IS NOT NULL "
            "AND sid = (SELECT sid FROM sessions WHERE agent = ? AND session = ?)")
        self._owed = q(
            f"SELECT s.agent, s.session, {_TURN_COLS} FROM turns t "
            "JOIN sessions s ON s.sid = t.sid WHERE t.deliver = ? ORDER BY t.ordinal")
        # The session's parked entry joined by its ordinal (the first, should there be two),
        # so a session is one row whatever its chain holds.
        self._summaries = (
            "SELECT s.session, s.status, s.generation, t.request, s.owner FROM sessions s "
            "LEFT JOIN turns t ON t.ordinal = (SELECT min(p.ordinal) FROM turns p "
            "WHERE p.sid = s.sid AND p.status = 'suspended' AND p.cancel IS NULL) "
            "WHERE s.agent = ?")
        def copies(gen: str) -> str:
            return q(
                f"SELECT s.sid, {gen}, x.n, x.body, x.seq FROM sessions s "
                f"LEFT JOIN log_transcript x ON x.sid = s.sid AND x.gen = {gen} "
                "AND x.n >= coalesce((SELECT y.n FROM log_transcript y WHERE y.sid = s.sid "
                f"AND y.gen = {gen} AND y.n <= ? ORDER BY y.n DESC LIMIT 1), 0) "
                "WHERE s.agent = ? AND s.session = ? ORDER BY x.n")

        self._copies_live = copies("s.generation")
        self._copies_of = copies("CAST(? AS INTEGER)")
        """A session's id and generation (live, or the one given: ``?`` three times), and
        its ``log_transcript`` rows from the last one up to message ``n`` on (one row of
        NULLs if none): one statement, one round trip."""
        self._transcript_end = q("SELECT n, seq FROM log_transcript WHERE sid = ? AND gen = ? "
                                 "AND n <= ? ORDER BY n DESC LIMIT 1")
        """The last ``log_transcript`` row of a generation up to message ``n``."""
        self._bodies_after = q("SELECT n, body, seq FROM log WHERE sid = ? AND gen = ? "
                               "AND seq >= ? AND n > ? AND body IS NOT NULL ORDER BY seq, sub")
        """The messages of the ``log`` rows of a generation after message ``n`` (its rows
        from ``seq`` on: a row's ``n`` only grows with its key within a generation)."""
        self._bodies_to_copy = self._bodies_after + f" LIMIT {TRANSCRIPT_COPY_ROWS}"
        self._insert_transcript = q("INSERT INTO log_transcript (sid, gen, n, seq, body) "
                                    "VALUES (?, ?, ?, ?, ?)")

    # -- sessions and leases ---------------------------------------------------------------

    def sid(self, c: Connection, key: SessionKey, *, create: bool) -> int | None:
        """The session's id, its row locked for this transaction's writes (``lock_rows``);
        created (and locked) if missing and ``create``."""
        params = (key.agent, key.session)
        row = first(c.rows(self._sid_for_write, params))
        if row is not None:
            return int(row[0])
        if not create:
            return None
        row = first(c.rows(self._insert_session, params))
        if row is None:  # another transaction created it meanwhile (PostgreSQL): lock it
            row = first(c.rows(self._sid_for_write, params))
        return int(row[0])

    def claim(self, c: Connection, key: SessionKey) -> tuple[int, int, int, int, int]:
        """A new epoch for the session (created if needed), with the lease's counters.

        Returns ``(sid, epoch, generation, newest seq, message count)``.
        """
        sid = self.sid(c, key, create=True)
        assert sid is not None
        epoch, gen = self.bump(c, sid)
        seq, count = self.last_row(c, sid, gen)
        return sid, epoch, gen, seq, count

    def holds(self, c: Connection, sid: int, epoch: int) -> bool:
        """Whether ``epoch`` is still the session's: the fencing check of every commit."""
        row = first(c.rows(self._epoch, (sid,)))
        return row is not None and row[0] == epoch

    @staticmethod
    def one_row(w: Writes) -> bool:
        """Whether a transaction writes one log row with events and nothing else (the common
        step: a model reply, a tool result), which :meth:`append` writes in one statement."""
        return (bool(w.events) and not w.turns and not w.data and w.status is None
                and not w.new_generation)

    def append(self, c: Connection, sid: int, epoch: int, gen: int, first: int,
               w: Writes) -> bool:
        """Write a :meth:`one_row` transaction's row if ``epoch`` is still the session's: the
        fencing check and the write as one statement. False: the lease was lost (nothing
        written)."""
        n, turn_id, body, step, memo, events = row_of(w.messages, w.steps, w.events, first)
        return c.changes(self._append_fenced, (sid, w.events[-1].seq, gen, n, turn_id, body,
                                               step, memo, events, sid, epoch)) == 1

    def flush(self, c: Connection, sid: int, gen: int, first: int, w: Writes, *,
              seq: int, key: SessionKey) -> None:
        """Write a transaction's buffered writes (messages numbered from ``first``; ``seq``:
        the session's newest event seq before them): one log row, the chain's updates, the
        timers a park arms."""
        if w.messages or w.steps or w.events:
            n, turn_id, body, step, memo, events = row_of(w.messages, w.steps, w.events, first)
            if w.events:
                c.changes(self.insert_row, (sid, w.events[-1].seq, gen, n, turn_id, body, step,
                                            memo, events))
            else:
                c.changes(self.insert_quiet_row, (sid, seq, sid, seq, gen, n, turn_id, body,
                                                  step, memo))
        for turn_id, r in w.turns.items():
            c.changes(self._update_turn, (r.status.value, r.text, r.error, r.reason,
                                          _dump(updated_request(r)), sid, turn_id))
            for timer in timers_of(key, r):
                self.timers.arm_new(c, sid, timer)
        for turn_id, name, value in w.data:
            self._merge_data(c, sid, turn_id, name, value, only_new=False)
        if w.turns and not w.new_generation:
            self.copy_transcript(c, sid, gen, first + len(w.messages))
        if w.status is not None:
            c.changes(self._set_status, (w.status, sid))
        if w.new_generation:
            c.changes(self._new_generation, (sid,))

    def copy_transcript(self, c: Connection, sid: int, gen: int, count: int) -> None:
        """Copy the generation's messages not yet in ``log_transcript`` into one row, once there
        are :data:`TRANSCRIPT_CHUNK` of them (``count``: the generation's message count), from
        :data:`TRANSCRIPT_COPY_ROWS` log rows and :data:`TRANSCRIPT_COPY_BYTES` at most (one
        row at least)."""
        if count < TRANSCRIPT_CHUNK:  # too few in all to look
            return
        end = first(c.rows(self._transcript_end, (sid, gen, count)))
        n, seq = (0, 0) if end is None else end
        if count - n < TRANSCRIPT_CHUNK:
            return
        rows = c.rows(self._bodies_to_copy, (sid, gen, seq, n))
        size = 0
        for i, row in enumerate(rows):  # a prefix of them, if their bodies are large
            size += len(row[1].encode())
            if i and size > TRANSCRIPT_COPY_BYTES:
                rows = rows[:i]
                break
        if rows:
            c.changes(self._insert_transcript, (sid, gen, rows[-1][0], rows[-1][2],
                                                "\n".join([r[1] for r in rows])))

    # -- the chain -------------------------------------------------------------------------

    def enqueue(self, c: Connection, key: SessionKey,
                entry: NewEntry) -> tuple[ChainEntry, bool]:
        """``SessionStore.enqueue``, in the caller's transaction (see :func:`check_enqueue`)."""
        sid = self.sid(c, key, create=True)
        row = first(c.rows(self._find_turn, (sid, entry.turn_id)))
        if row is not None:
            return _turn(row), False
        check_enqueue(key, entry.parked_rule, [
            (turn_id, status, cancel, decode_while_parked(kind, body))
            for turn_id, status, cancel, kind, body in c.rows(self._unfinished_rows, (sid,))])
        reason = supersede_reason(entry.kind, entry.supersede)
        if reason is not None:
            c.changes(self._supersede, (reason, sid))
        ordinal = first(c.rows(self._insert_turn, (
            sid, entry.turn_id, entry.kind, encode_entry(entry), _dump(entry.event),
            _dump(entry.policy), entry.deliver, _dump(entry.data),
        )))[0]
        return _accepted(entry, int(ordinal)), True

    def enqueue_plain(self, c: Connection, key: SessionKey,
                      entry: NewEntry) -> ChainEntry | None:
        """The common accept in one statement: a new ``turn`` (no supersede) of a session
        that exists and has no parked turn. None: not that case (a new session, a turn id
        already taken, a park, for which :func:`check_enqueue` decides); nothing was written,
        and :meth:`enqueue` takes it in a transaction. For a backend whose statements are
        serialised (``Syntax.serialised``): the park check and the insert must see the same
        state."""
        rows = c.rows(self._enqueue_plain, (
            entry.turn_id, encode_entry(entry), _dump(entry.event), _dump(entry.policy),
            entry.deliver, _dump(entry.data), key.agent, key.session,
        ))
        if not rows:
            return None
        return _accepted(entry, int(rows[0][0]))

    def bump(self, c: Connection, sid: int) -> tuple[int, int]:
        """A new epoch for a session whose id is known: ``(epoch, generation)``."""
        epoch, gen = c.rows(self._claim, (sid,))[0]
        return int(epoch), int(gen)

    def last_row(self, c: Connection, sid: int, generation: int) -> tuple[int, int]:
        """A lease's ``(newest seq, message count)`` read from the session's last row."""
        return counters(first(c.rows(self._last_row, (sid,))), generation)

    def request_cancel(self, c: Connection, key: SessionKey, turn_id: str | None,
                       reason: str) -> list[str]:
        """``SessionStore.request_cancel``, in the caller's transaction."""
        sid = self.sid(c, key, create=False)
        if sid is None:
            return []
        rows = c.rows(self._cancel, (reason, sid, turn_id, turn_id))
        return [r[0] for r in rows]

    def set_turn_data(self, c: Connection, key: SessionKey, turn_id: str, name: str,
                      value: Any, only_new: bool) -> Any:
        """``SessionStore.set_turn_data``, under the session row's lock (``lock_rows``) or
        the backend's serialising transaction."""
        sid = self.sid(c, key, create=False)
        if sid is None:
            return None
        return self._merge_data(c, sid, turn_id, name, value, only_new=only_new)

    def _merge_data(self, c: Connection, sid: int, turn_id: str, name: str, value: Any, *,
                    only_new: bool) -> Any:
        """Set one name of an entry's ``data``, keeping the others: a read-modify-write in
        the caller's transaction, which holds the session's write lock. ``None`` when the
        entry does not exist."""
        row = first(c.rows(self._data_of, (sid, turn_id)))
        if row is None:
            return None
        data = _load(row[0]) or {}
        if only_new and name in data:
            return data[name]
        data[name] = value
        c.changes(self._set_data, (_dump(data), sid, turn_id))
        return value

    def cancel_of(self, c: Connection, sid: int, turn_id: str) -> str | None:
        """``Lease.cancel_requested``: the cancel asked of an entry, if any."""
        row = first(c.rows(self._cancel_of, (sid, turn_id)))
        return None if row is None else row[0]

    # -- reads -----------------------------------------------------------------------------

    def entries(self, c: Connection, key: SessionKey, turn_id: str | None,
                unfinished: bool) -> list[ChainEntry]:
        """``SessionStore.entries``."""
        where = f" AND status IN {_OPEN}" if unfinished else ""
        if turn_id is not None:
            where += " AND turn_id = ?"
        params: tuple[Any, ...] = (key.agent, key.session)
        if turn_id is not None:
            params = (*params, turn_id)
        rows = c.rows(self.q(
            f"SELECT {_TURN_COLS} FROM turns t WHERE sid = ({self._sid}){where} "
            "ORDER BY ordinal"
        ), params)
        return [_turn(r) for r in rows]

    def session_info(self, c: Connection, key: SessionKey) -> SessionInfo | None:
        """``SessionStore.session_info``."""
        row = first(c.rows(self._info, (key.agent, key.session)))
        return None if row is None else SessionInfo(row[0], row[1], row[2])

    def own_session(self, c: Connection, key: SessionKey, owner: str) -> str | None:
        """``SessionStore.own_session``, in the caller's transaction."""
        c.changes(self._own, (key.agent, key.session, owner))
        owner = first(c.rows(self._owner, (key.agent, key.session)))[0]
        return None if owner is None else str(owner)

    def read_messages(self, c: Connection, key: SessionKey, after: int,
                      generation: int | None) -> list[Message]:
        """The generation's messages after number ``after``: its ``log_transcript`` rows, then
        its ``log`` rows after the last of them (see the module's docstring)."""
        if generation is None:
            copies = c.rows(self._copies_live, (after, key.agent, key.session))
        else:
            copies = c.rows(self._copies_of, (generation, generation, generation, after,
                                              key.agent, key.session))
        if not copies:
            return MessageLog()
        sid, gen = copies[0][0], copies[0][1]
        rows = [(n, body, seq) for _, _, n, body, seq in copies if n is not None]
        n, seq = after, 0
        if rows and rows[0][0] <= after:  # a copy of messages up to ``after``: the log after it
            seq = rows.pop(0)[2]
        if rows:
            n, seq = rows[-1][0], rows[-1][2]
        rows += c.rows(self._bodies_after, (sid, gen, seq, n))
        # A row holds the messages after the one before it (numbered on, with no gap).
        counts: list[tuple[str, int]] = []
        for n, body, _ in rows:
            counts.append((body, n - after))
            after = n
        return MessageLog.joined(counts)  # split and decoded when read

    def _of_generation(self, generation: int | None, hint: str = "") -> str:
        """``FROM`` and ``WHERE`` of the log rows ``l`` of one generation of a session (the
        live one: ``None``), for :meth:`_generation_params`. The live generation is joined
        from the session row, read once (a correlated subquery would be read per row)."""
        if generation is None:
            return (f"sessions s JOIN log l{hint} ON l.sid = s.sid AND l.gen = s.generation "
                    "WHERE s.agent = ? AND s.session = ?")
        return f"log l{hint} WHERE l.sid = ({self._sid}) AND l.gen = ?"

    @staticmethod
    def _generation_params(key: SessionKey, generation: int | None) -> tuple[Any, ...]:
        if generation is None:
            return key.agent, key.session
        return key.agent, key.session, generation

    def read_steps(self, c: Connection, key: SessionKey, generation: int | None,
                   step_id: str | None) -> dict[str, StepRecord]:
        """``SessionStore.read_steps``; a step looked up by id reads the partial index."""
        params = self._generation_params(key, generation)
        where = hint = ""
        if step_id is not None:
            where = " AND (l.step = ? OR l.step IS NULL)"
            params = (*params, step_id)
            if not step_id.startswith(HOT_STEP_PREFIXES):
                where += f" AND {LOOKED_UP}"  # through the partial index log_lookup
                hint = self._lookup_hint
        rows = c.rows(self.q(
            f"SELECT l.turn_id, l.step, l.memo FROM {self._of_generation(generation, hint)} "
            f"AND l.memo IS NOT NULL{where}"
        ), params)
        out: dict[str, StepRecord] = {}
        for turn_id, step, memo in rows:
            for s in steps_of(turn_id, step, memo):
                if step_id is None or s.id == step_id:
                    out[s.id] = s
        return out

    def read_events(self, c: Connection, key: SessionKey, after_seq: int,
                    turn_id: str | None) -> list[TurnEvent]:
        """``SessionStore.read_events``, rebuilt whole from their rows."""
        rows = c.rows(self.q(
            f"SELECT seq, turn_id, body, events FROM log WHERE sid = ({self._sid}) AND seq > ? "
            "AND events IS NOT NULL "
            "AND (turn_id = ? OR turn_id IS NULL OR CAST(? AS text) IS NULL) ORDER BY seq"
        ), (key.agent, key.session, after_seq, turn_id, turn_id))
        out: list[TurnEvent] = []
        for seq, row_turn, body, events in rows:
            for e in events_of(key.agent, key.session, seq, row_turn, body, events):
                if e.seq > after_seq and (turn_id is None or e.turn_id == turn_id):
                    out.append(e)
        return out

    def newest_seq(self, c: Connection, key: SessionKey) -> int:
        """The session's newest event seq, 0 when none (where the feed starts)."""
        row = first(c.rows(self.q(
            f"SELECT coalesce(max(seq), 0) FROM log WHERE sid = ({self._sid})"
        ), (key.agent, key.session)))
        return int(row[0])

    def find_sessions(self, c: Connection, which: str | None,
                      turn_id: str | None) -> list[SessionKey]:
        """Sessions by their turns (see ``SessionStore.find_sessions``)."""
        conditions: list[str] = []
        params: list[Any] = []
        if which == "unfinished":
            conditions.append(NEEDS_DRIVING)
        elif which == "parked":
            conditions.append("t.status = 'suspended' AND t.cancel IS NULL")
        elif which is not None:
            raise ValueError(f"unknown session filter {which!r}: 'unfinished' or 'parked'")
        if turn_id is not None:
            conditions.append("t.turn_id = ? AND t.kind = 'turn'")
            params.append(turn_id)
        where_all = " AND ".join(conditions) or "1 = 1"
        rows = c.rows(self.q(
            "SELECT DISTINCT s.agent, s.session FROM turns t JOIN sessions s ON s.sid = t.sid "
            f"WHERE {where_all} ORDER BY s.agent, s.session"
        ), tuple(params))
        return [SessionKey(a, s) for a, s in rows]

    def list_sessions(self, c: Connection, agent: str) -> list[SessionKey]:
        """``SessionStore.list_sessions``."""
        # sid grows with each new session (sessions are never deleted): newest first.
        rows = c.rows(self.q(
            "SELECT session FROM sessions WHERE agent = ? ORDER BY sid DESC"
        ), (agent,))
        return [SessionKey(agent, r[0]) for r in rows]

    def session_summaries(self, c: Connection, agent: str, parked_only: bool,
                          visible: Visibility | None) -> list[SessionSummary]:
        """``SessionStore.session_summaries``: one statement, the visibility in its ``WHERE``."""
        sql, params = self._summaries, [agent]
        if parked_only:
            sql += " AND t.ordinal IS NOT NULL"
        if visible is not None:
            where, more = visible_where(visible, self._contains)
            sql, params = f"{sql} AND ({where})", [*params, *more]
        rows = c.rows(self.q(sql + " ORDER BY s.sid DESC"), tuple(params))
        out = []
        for session, status, generation, request, owner in rows:
            pending = _load(request)
            out.append(SessionSummary(SessionKey(agent, session), status, int(generation),
                                      InputRequest.from_dict(pending) if pending else None,
                                      owner=owner))
        return out

    def owed_deliveries(self, c: Connection,
                        channel: str) -> list[tuple[SessionKey, ChainEntry]]:
        """``SessionStore.owed_deliveries``: one statement, on the index of owed entries."""
        rows = c.rows(self._owed, (channel,))
        return [(SessionKey(r[0], r[1]), _turn(r[2:])) for r in rows]

    def settle_delivery(self, c: Connection, key: SessionKey, turn_id: str) -> bool:
        """``SessionStore.settle_delivery``: one statement, atomic on its own."""
        return c.changes(self._settle, (turn_id, key.agent, key.session)) == 1


def _accepted(entry: NewEntry, ordinal: int) -> ChainEntry:
    """The record of an entry just accepted."""
    return ChainEntry(entry.turn_id, ordinal, TurnStatus.QUEUED, entry.opening, entry.event,
                      entry.policy, kind=entry.kind, args=entry.args,
                      data=dict(entry.data) if entry.data else None, deliver=entry.deliver)


def counters(last_row: Any, generation: int) -> tuple[int, int]:
    """A lease's ``(newest seq, message count)`` from the session's :data:`LAST_ROW` (None when
    it has no row): a last row of an older generation means the live one has no message."""
    if last_row is None:
        return 0, 0
    seq, gen, n = last_row
    return int(seq), int(n) if gen == generation else 0
