"""The SQLite store's signals (``stores._signals``): a small SQLite file of their own,
``<path>-signals``, beside the database.

Why a second file: a local tool's step holds the database's write lock (``BEGIN
IMMEDIATE``) for as long as the tool runs, and no connection of any process can write the
database meanwhile; the signals file has a lock of its own, taken only by other signals for
the microseconds of an insert. It is made at the first signal (a store that never needed one
has none) and read only while it exists; WAL, so a read never waits for a writer.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import StoreError
from ..records import SessionKey

__all__ = ["FileSignals"]

BUSY_MS = 2000
"""How long a signal's insert waits for another process's insert (they take microseconds)."""
_CREATE = ("CREATE TABLE IF NOT EXISTS signals (agent TEXT NOT NULL, session TEXT NOT NULL, "
           "turn_id TEXT NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (agent, session, turn_id))")
_CREATE_ACCEPTS = ("CREATE TABLE IF NOT EXISTS accepts (agent TEXT NOT NULL, session TEXT NOT "
                   "NULL, turn_id TEXT NOT NULL, body TEXT NOT NULL, "
                   "UNIQUE (agent, session, turn_id))")
"""Accepts kept in rowid order: the order they were accepted in."""


def signals_path(path: Path) -> Path:
    """The signals file beside the database."""
    return Path(f"{path}-signals")


class FileSignals:
    """``Signals`` in ``<path>-signals`` (see the module docstring).

    Args:
        path: the database.
        write_lock: the lock this process's steps hold from their first write to their
            commit (another process's lock shows as "busy" when a write tries it).
    """

    def __init__(self, path: Path, write_lock: asyncio.Lock) -> None:
        self.path = signals_path(path)
        self._lock = write_lock
        self._conn: sqlite3.Connection | None = None

    def blocked(self) -> bool:
        return self._lock.locked()

    def _connection(self, *, create: bool) -> sqlite3.Connection | None:
        if self._conn is not None:
            return self._conn
        if not create and not self.path.exists():
            return None
        try:
            c = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                timeout=BUSY_MS / 1000)
            c.execute("PRAGMA journal_mode = WAL")
            c.execute(_CREATE)
            c.execute(_CREATE_ACCEPTS)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open {self.path}: {e}") from e
        self._conn = c
        return c

    def close(self) -> None:
        """Close the connection (the file stays, with any signal not folded yet)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def version(self) -> int | None:
        """``PRAGMA data_version`` of the file (it moves when another process signals);
        ``None`` while there is no file."""
        c = self._connection(create=False)
        if c is None:
            return None
        try:
            return int(c.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            return -1

    async def put(self, key: SessionKey, turn_ids: Sequence[str], reason: str) -> list[str]:
        c = self._connection(create=True)
        assert c is not None
        reached = []
        try:
            c.execute("BEGIN IMMEDIATE")
            try:
                for t in turn_ids:
                    cur = c.execute("INSERT INTO signals (agent, session, turn_id, reason) "
                                    "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                                    (key.agent, key.session, t, reason))
                    if cur.rowcount == 1:
                        reached.append(t)
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise StoreError(f"cannot write {self.path}: {e}") from e
        return reached

    async def of(self, key: SessionKey) -> dict[str, str]:
        c = self._connection(create=False)
        if c is None:
            return {}
        try:
            rows = c.execute("SELECT turn_id, reason FROM signals WHERE agent = ? AND "
                             "session = ?", (key.agent, key.session)).fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"cannot read {self.path}: {e}") from e
        return {t: r for t, r in rows}

    async def pending(self) -> list[tuple[SessionKey, str, str]]:
        c = self._connection(create=False)
        if c is None:
            return []
        try:
            rows = c.execute("SELECT agent, session, turn_id, reason FROM signals").fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"cannot read {self.path}: {e}") from e
        return [(SessionKey(a, s), t, r) for a, s, t, r in rows]

    async def drop(self, key: SessionKey, turn_ids: Iterable[str]) -> None:
        c = self._connection(create=False)
        if c is None:
            return
        try:
            c.executemany("DELETE FROM signals WHERE agent = ? AND session = ? AND turn_id = ?",
                          [(key.agent, key.session, t) for t in turn_ids])
        except sqlite3.Error as e:
            raise StoreError(f"cannot write {self.path}: {e}") from e

    def _run(self, sql: str, args: tuple[Any, ...], *, create: bool = False) -> Any:
        c = self._connection(create=create)
        if c is None:
            return None
        try:
            return c.execute(sql, args)
        except sqlite3.Error as e:
            raise StoreError(f"cannot use {self.path}: {e}") from e

    async def put_entry(self, key: SessionKey, turn_id: str, body: str) -> bool:
        cur = self._run("INSERT INTO accepts (agent, session, turn_id, body) VALUES "
                        "(?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        (key.agent, key.session, turn_id, body), create=True)
        return bool(cur.rowcount == 1)

    async def entries_of(self, key: SessionKey) -> dict[str, str]:
        cur = self._run("SELECT turn_id, body FROM accepts WHERE agent = ? AND session = ? "
                        "ORDER BY rowid", (key.agent, key.session))
        return {} if cur is None else {t: b for t, b in cur.fetchall()}

    async def pending_entries(self) -> list[SessionKey]:
        cur = self._run("SELECT DISTINCT agent, session FROM accepts", ())
        return [] if cur is None else [SessionKey(a, s) for a, s in cur.fetchall()]

    async def drop_entry(self, key: SessionKey, turn_id: str) -> None:
        self._run("DELETE FROM accepts WHERE agent = ? AND session = ? AND turn_id = ?",
                  (key.agent, key.session, turn_id))
