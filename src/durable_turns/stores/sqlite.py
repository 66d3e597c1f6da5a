"""The embedded store: one SQLite file (stdlib ``sqlite3``, WAL), shared by many processes.

- One connection per store, used from the event loop thread. SQLite calls are short and
  local; a thread hop per call would cost more than the call.
- The lease is an OS lock (Linux open-file-description lock) on one byte of ``<path>-lease``
  chosen by hashing the session key. The kernel drops it when the holder's process dies, so a
  SIGKILLed worker never blocks the replay, and two processes never drive one session at once.
- A local tool runs on :meth:`unwrap`'s ``sqlite3.Connection`` inside ``BEGIN IMMEDIATE`` and a
  savepoint: its writes commit with the step or roll back with its error.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import FatalToolError, StoreError
from ..events import EventRecord, encode_event
from ..messages import Message, decode_message, encode_json, encode_message
from . import SessionInfo, SessionKey, TurnKind, TurnRecord
from ._base import BufferedTransaction, LeaseBase, check_not_parked, poll_until

T = TypeVar("T")

APPLICATION_ID = 0x44545552  # "DTUR": marks a file as ours, so a foreign one is never touched

# Append-only: index + 1 = schema version (PRAGMA user_version).
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        sid INTEGER PRIMARY KEY,
        agent TEXT NOT NULL,
        session TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'new',
        generation INTEGER NOT NULL DEFAULT 0,
        UNIQUE (agent, session)
    );
    CREATE TABLE turns (
        ordinal INTEGER PRIMARY KEY,
        sid INTEGER NOT NULL,
        turn_id TEXT NOT NULL,
        kind TEXT NOT NULL DEFAULT 'turn',
        status TEXT NOT NULL,
        opening TEXT NOT NULL,
        event TEXT, policy TEXT, request TEXT,
        text TEXT, error TEXT, reason TEXT, cancel TEXT,
        UNIQUE (sid, turn_id)
    );
    CREATE INDEX turns_open ON turns (sid) WHERE status IN ('queued', 'running', 'suspended');
    CREATE TABLE messages (
        sid INTEGER NOT NULL, gen INTEGER NOT NULL, idx INTEGER NOT NULL,
        turn_id TEXT, body TEXT NOT NULL,
        PRIMARY KEY (sid, gen, idx)
    ) WITHOUT ROWID;
    CREATE TABLE steps (
        sid INTEGER NOT NULL, gen INTEGER NOT NULL, step_id TEXT NOT NULL,
        turn_id TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (sid, gen, step_id)
    ) WITHOUT ROWID;
    CREATE TABLE events (
        sid INTEGER NOT NULL, seq INTEGER NOT NULL, turn_id TEXT NOT NULL,
        type TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (sid, seq)
    ) WITHOUT ROWID;
    """,
]

_SID = "(SELECT sid FROM sessions WHERE agent = ? AND session = ?)"
_TURN_COLS = (
    "turn_id, ordinal, status, opening, event, policy, request, text, error, reason, cancel, kind"
)
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)


def _lock_byte(fd: int, key: SessionKey) -> bool:
    """Try to take the session's byte of the lease file; ``False`` when someone holds it."""
    digest = hashlib.blake2b(str(key).encode(), digest_size=8).digest()
    offset = int.from_bytes(digest, "big") & ((1 << 62) - 1)
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks), padding
    flock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, flock)
    except OSError:
        return False
    return True


_INSERT_MESSAGE = "INSERT INTO messages (sid, gen, idx, turn_id, body) VALUES (?, ?, ?, ?, ?)"
_INSERT_STEP = "INSERT INTO steps (sid, gen, step_id, turn_id, data) VALUES (?, ?, ?, ?, ?)"
_INSERT_EVENT = "INSERT INTO events (sid, seq, turn_id, type, data) VALUES (?, ?, ?, ?, ?)"


def _insert(c: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    # Most steps write one row per table: execute() costs less than executemany() then.
    if len(rows) == 1:
        c.execute(sql, rows[0])
    else:
        c.executemany(sql, rows)


def _load(v: str | None) -> Any:
    return None if v is None else json.loads(v)


def _dump(v: Any) -> str | None:
    return None if v is None else encode_json(v)


def _turn(row: tuple[Any, ...]) -> TurnRecord:
    return TurnRecord(
        turn_id=row[0], ordinal=row[1], status=row[2], opening=decode_message(row[3]),
        event=_load(row[4]), policy=_load(row[5]), request=_load(row[6]),
        text=row[7], error=row[8], reason=row[9], cancel=row[10], kind=row[11],
    )


class _SqliteTransaction(BufferedTransaction):
    """One step's transaction; its own ``async with`` (cheaper than a generator-based one)."""

    def __init__(self, lease: _SqliteLease) -> None:
        super().__init__(lease)
        self._store = lease.store
        self._conn = lease.store._conn_or_raise()
        self.begun = False

    def unwrap(self) -> sqlite3.Connection:
        return self._conn

    def begin(self) -> None:
        if not self.begun:
            self._conn.execute("BEGIN IMMEDIATE")
            self.begun = True

    async def __aenter__(self) -> _SqliteTransaction:
        # One connection serves every session of this store: keep transactions apart.
        await self._store._write_lock.acquire()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        c = self._conn
        try:
            if exc_type is None:
                try:
                    self.begin()
                    self._store._flush(self.lease, self)  # type: ignore[arg-type]
                    c.execute("COMMIT")
                except BaseException:
                    if c.in_transaction:
                        c.execute("ROLLBACK")
                    raise
                self.committed()
            elif c.in_transaction:
                c.execute("ROLLBACK")
        finally:
            self._store._write_lock.release()

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        c = self._conn
        # Our own rows are buffered until commit, so when the tool is the first to write, a
        # rollback of the whole transaction undoes exactly the tool's writes: no savepoint.
        first = not self.begun
        self.begin()
        if not first:
            c.execute("SAVEPOINT local_tool")
        try:
            out = fn(c)
        except BaseException:
            if not c.in_transaction:
                self.begun = False
            elif first:
                c.execute("ROLLBACK")
                self.begun = False
            else:
                c.execute("ROLLBACK TO local_tool")
                c.execute("RELEASE local_tool")
            raise
        if not c.in_transaction:
            # The tool committed or rolled back the step's own transaction through the raw
            # handle: its writes are no longer tied to the step, which we cannot repair.
            self.begun = False
            raise FatalToolError(
                "a local tool ended the store's transaction (COMMIT/ROLLBACK on the raw "
                "handle); write through ctx.store.unwrap() without managing transactions"
            )
        if not first:
            c.execute("RELEASE local_tool")
        return out


class _SqliteLease(LeaseBase):
    def __init__(self, store: SqliteStore, key: SessionKey, fd: int, sid: int, generation: int,
                 last_seq: int, count: int) -> None:
        super().__init__(key, generation, last_seq, count)
        self.store = store
        self.sid = sid
        self._fd: int | None = fd

    def transaction(self) -> _SqliteTransaction:
        return _SqliteTransaction(self)

    async def cancel_requested(self, turn_id: str) -> str | None:
        row = self.store._conn_or_raise().execute(
            "SELECT cancel FROM turns WHERE sid = ? AND turn_id = ?", (self.sid, turn_id)
        ).fetchone()
        return None if row is None else row[0]

    async def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the OS lock
            self._fd = None


class SqliteStore:
    """A session store in one SQLite file.

    Args:
        path: the database file; created if missing. A file that is not a durable_turns
            database (another application's, or corrupt) is refused and left untouched.
        synchronous: SQLite's ``synchronous`` setting. ``NORMAL`` (default) is durable
            against process crashes in WAL mode; ``FULL`` also against power loss.
        busy_timeout: seconds to wait for another process's write lock.
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "NORMAL",
                 busy_timeout: float = 10.0) -> None:
        if str(path) == ":memory:":
            raise StoreError("SqliteStore needs a file; use MemoryStore for an in-memory store")
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"unknown synchronous setting {synchronous!r}")
        self.path = Path(path)
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._write_lock = asyncio.Lock()

    # -- opening ---------------------------------------------------------------------------

    async def open(self) -> None:
        if self._conn is not None:
            return
        self._check_foreign()
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open {self.path}: {e}") from e
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            self._migrate(conn)
        except sqlite3.Error as e:
            conn.close()
            raise StoreError(f"cannot use {self.path} as a durable_turns store: {e}") from e
        self._conn = conn

    def _check_foreign(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        try:
            probe = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open {self.path}: {e}") from e
        try:
            app_id = probe.execute("PRAGMA application_id").fetchone()[0]
            tables = probe.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            version = probe.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"{self.path} is not a SQLite database or is corrupt ({e}); refusing to use it"
            ) from e
        finally:
            probe.close()
        if app_id != APPLICATION_ID and (app_id != 0 or tables):
            raise StoreError(
                f"{self.path} is a SQLite database of another application "
                f"(application_id={app_id:#x}, {tables} schema objects); refusing to touch it"
            )
        if version > len(MIGRATIONS):
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this durable_turns "
                f"knows ({len(MIGRATIONS)}); upgrade durable_turns"
            )

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for i in range(version, len(MIGRATIONS)):
                for stmt in MIGRATIONS[i].split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _conn_or_raise(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"SqliteStore({str(self.path)!r}) is not open; await store.open()")
        return self._conn

    def unwrap(self) -> sqlite3.Connection:
        return self._conn_or_raise()

    # -- leases and writes -----------------------------------------------------------------

    def _ensure_session(self, c: sqlite3.Connection, key: SessionKey) -> tuple[int, str, int]:
        row = c.execute(
            "SELECT sid, status, generation FROM sessions WHERE agent = ? AND session = ?",
            (key.agent, key.session),
        ).fetchone()
        if row is None:
            cur = c.execute(
                "INSERT INTO sessions (agent, session) VALUES (?, ?)", (key.agent, key.session)
            )
            assert cur.lastrowid is not None
            return cur.lastrowid, "new", 0
        return row[0], row[1], row[2]

    async def acquire(self, key: SessionKey, *, timeout: float | None = None) -> _SqliteLease:
        c = self._conn_or_raise()
        fd = os.open(f"{self.path}-lease", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            await poll_until(lambda: _lock_byte(fd, key), key, timeout)
        except BaseException:
            os.close(fd)
            raise
        try:
            row = c.execute(
                "SELECT sid, generation FROM sessions WHERE agent = ? AND session = ?",
                (key.agent, key.session),
            ).fetchone()
            if row is not None:
                sid, gen = row
            else:
                async with self._write_lock:
                    c.execute("BEGIN IMMEDIATE")
                    try:
                        sid, _status, gen = self._ensure_session(c, key)
                        c.execute("COMMIT")
                    except BaseException:
                        c.execute("ROLLBACK")
                        raise
            seq = c.execute("SELECT max(seq) FROM events WHERE sid = ?", (sid,)).fetchone()[0]
            idx = c.execute(
                "SELECT max(idx) FROM messages WHERE sid = ? AND gen = ?", (sid, gen)
            ).fetchone()[0]
        except BaseException:
            os.close(fd)
            raise
        return _SqliteLease(self, key, fd, sid, gen, seq or 0, 0 if idx is None else idx + 1)

    def _flush(self, lease: _SqliteLease, tx: _SqliteTransaction) -> None:
        c, w, sid, gen = tx._conn, tx.writes, lease.sid, lease.generation
        first = tx.first_index()
        if w.messages:
            _insert(c, _INSERT_MESSAGE, [(sid, gen, first + i, m.turn_id, encode_message(m))
                                         for i, m in enumerate(w.messages)])
        if w.steps:
            _insert(c, _INSERT_STEP, [(sid, gen, s, t, d) for s, t, d in w.steps])
        if w.events:
            _insert(c, _INSERT_EVENT, [(sid, e.seq, e.turn_id, e.type, encode_event(e))
                                       for e in w.events])
        for turn_id, u in w.turns.items():
            c.execute(
                "UPDATE turns SET status = ?, text = coalesce(?, text), "
                "error = coalesce(?, error), reason = coalesce(?, reason), request = ? "
                "WHERE sid = ? AND turn_id = ?",
                (u.status, u.text, u.error, u.reason, _dump(u.request), sid, turn_id),
            )
        if w.status is not None:
            c.execute("UPDATE sessions SET status = ? WHERE sid = ?", (w.status, sid))
        if w.new_generation:
            c.execute(
                "UPDATE sessions SET generation = generation + 1, status = 'new' WHERE sid = ?",
                (sid,),
            )
            c.execute(
                "UPDATE turns SET status = 'cancelled', reason = 'reset', request = NULL "
                "WHERE sid = ? AND status = 'suspended'",
                (sid,),
            )

    async def enqueue_turn(
        self,
        key: SessionKey,
        turn_id: str,
        opening: Message,
        event: dict[str, Any] | None = None,
        policy: dict[str, Any] | None = None,
        *,
        kind: TurnKind = "turn",
        supersede: str | None = None,
    ) -> tuple[TurnRecord, bool]:
        c = self._conn_or_raise()
        async with self._write_lock:
            c.execute("BEGIN IMMEDIATE")
            try:
                sid, _status, _gen = self._ensure_session(c, key)
                row = c.execute(
                    f"SELECT {_TURN_COLS} FROM turns WHERE sid = ? AND turn_id = ?",
                    (sid, turn_id),
                ).fetchone()
                if row is not None:
                    c.execute("COMMIT")
                    return _turn(row), False
                if kind == "turn":
                    check_not_parked(key, c.execute(
                        "SELECT turn_id, status, kind FROM turns WHERE sid = ? "
                        "AND status IN ('queued', 'running', 'suspended') ORDER BY ordinal",
                        (sid,),
                    ))
                reason = "reset" if kind == "reset" else supersede
                if reason is not None:
                    c.execute(
                        "UPDATE turns SET cancel = ? WHERE sid = ? AND cancel IS NULL "
                        "AND status IN ('queued', 'running')",
                        (reason, sid),
                    )
                cur = c.execute(
                    "INSERT INTO turns (sid, turn_id, kind, status, opening, event, policy) "
                    "VALUES (?, ?, ?, 'queued', ?, ?, ?)",
                    (sid, turn_id, kind, encode_message(opening), _dump(event), _dump(policy)),
                )
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        assert cur.lastrowid is not None
        rec = TurnRecord(turn_id, cur.lastrowid, "queued", opening, event, policy, kind=kind)
        return rec, True

    async def request_cancel(
        self, key: SessionKey, turn_id: str | None, reason: str
    ) -> list[str]:
        c = self._conn_or_raise()
        async with self._write_lock:
            rows = c.execute(
                f"UPDATE turns SET cancel = ? WHERE sid = {_SID} "
                "AND status IN ('queued', 'running') AND cancel IS NULL "
                "AND (? IS NULL OR turn_id = ?) RETURNING turn_id",
                (reason, key.agent, key.session, turn_id, turn_id),
            ).fetchall()
        return [r[0] for r in rows]

    # -- reads -----------------------------------------------------------------------------

    async def get_turn(self, key: SessionKey, turn_id: str) -> TurnRecord | None:
        row = self._conn_or_raise().execute(
            f"SELECT {_TURN_COLS} FROM turns WHERE sid = {_SID} AND turn_id = ?",
            (key.agent, key.session, turn_id),
        ).fetchone()
        return None if row is None else _turn(row)

    async def turns(self, key: SessionKey, *, unfinished: bool = False) -> list[TurnRecord]:
        where = " AND status IN ('queued', 'running', 'suspended')" if unfinished else ""
        rows = self._conn_or_raise().execute(
            f"SELECT {_TURN_COLS} FROM turns WHERE sid = {_SID}{where} ORDER BY ordinal",
            (key.agent, key.session),
        ).fetchall()
        return [_turn(r) for r in rows]

    async def session_info(self, key: SessionKey) -> SessionInfo | None:
        row = self._conn_or_raise().execute(
            "SELECT status, generation FROM sessions WHERE agent = ? AND session = ?",
            (key.agent, key.session),
        ).fetchone()
        return None if row is None else SessionInfo(row[0], row[1])

    async def read_messages(
        self, key: SessionKey, *, after: int = 0, generation: int | None = None
    ) -> list[Message]:
        gen = "(SELECT generation FROM sessions WHERE sid = m.sid)" if generation is None else "?"
        params: tuple[Any, ...] = (key.agent, key.session, after)
        if generation is not None:
            params = (*params, generation)
        rows = self._conn_or_raise().execute(
            f"SELECT body FROM messages m WHERE sid = {_SID} AND idx >= ? AND gen = {gen} "
            "ORDER BY idx",
            params,
        ).fetchall()
        return [decode_message(r[0]) for r in rows]

    async def read_step(self, key: SessionKey, step_id: str) -> str | None:
        row = self._conn_or_raise().execute(
            f"SELECT data FROM steps s WHERE sid = {_SID} AND step_id = ? "
            "AND gen = (SELECT generation FROM sessions WHERE sid = s.sid)",
            (key.agent, key.session, step_id),
        ).fetchone()
        return None if row is None else str(row[0])

    async def read_steps(self, key: SessionKey, generation: int) -> dict[str, str]:
        rows = self._conn_or_raise().execute(
            f"SELECT step_id, data FROM steps WHERE sid = {_SID} AND gen = ?",
            (key.agent, key.session, generation),
        ).fetchall()
        return dict(rows)

    async def read_events(
        self, key: SessionKey, *, after_seq: int = 0, turn_id: str | None = None
    ) -> list[EventRecord]:
        rows = self._conn_or_raise().execute(
            f"SELECT seq, turn_id, type, data FROM events WHERE sid = {_SID} AND seq > ? "
            "AND (? IS NULL OR turn_id = ?) ORDER BY seq",
            (key.agent, key.session, after_seq, turn_id, turn_id),
        ).fetchall()
        return [EventRecord(*r) for r in rows]

    async def unfinished_sessions(self) -> list[SessionKey]:
        return self._sessions_where("t.status IN ('queued', 'running')")

    async def parked_sessions(self) -> list[SessionKey]:
        return self._sessions_where("t.status = 'suspended'")

    async def sessions_with_turn(self, turn_id: str) -> list[SessionKey]:
        return self._sessions_where("t.turn_id = ? AND t.kind = 'turn'", (turn_id,))

    def _sessions_where(self, condition: str, params: tuple[Any, ...] = ()) -> list[SessionKey]:
        rows = self._conn_or_raise().execute(
            "SELECT DISTINCT s.agent, s.session FROM turns t JOIN sessions s USING (sid) "
            f"WHERE {condition} ORDER BY s.agent, s.session",
            params,
        ).fetchall()
        return [SessionKey(a, s) for a, s in rows]
