"""The embedded store: one SQLite file (stdlib ``sqlite3``, WAL), shared by many processes.

- Store I/O never *waits* on the event loop. Every statement runs with SQLite's busy handler
  off, so it either finishes at once (a WAL read never waits; an uncontended write takes
  microseconds) or fails with "busy"; a busy call is then run again on the store's own thread
  (writer or reader), which waits there for up to ``busy_timeout``. A write lock held by another
  process therefore stalls only the writes that need it, never the loop, the other sessions'
  reads or their subscribers. Why not every call on a thread: a thread hop costs 70 to 150 µs of
  CPU on a small machine, more than a whole step's commit.
- The common step (a model reply, a tool result: one log row, nothing else) is one statement,
  its own transaction, fenced in its ``WHERE`` (``SqlRules.append``); so is the common accept,
  and a claim of a session this store released last (its counters are kept, and trusted when
  the new epoch directly follows the released one).
- Work of unknown length runs on the writer thread always: local tools (inside their step's
  transaction) and WAL checkpoints (``wal_autocheckpoint`` is off on our connection; the store
  checkpoints every few hundred commits, off the loop; once the WAL holds
  ``WAL_RESTART_FRAMES``, the store's writes wait for one more checkpoint of the frames
  written meanwhile, so the next write starts the WAL over and it stays bounded). For a
  local tool the loop waits, blocked, up to ``LOCAL_LINGER`` (0.5 ms) before it goes back to
  its other work: a tool that writes a few rows is done by then, and its step skips a
  wake-up of the loop.
- The lease is an OS lock (Linux open-file-description lock) on one byte of ``<path>-lease``
  chosen by hashing the session key. The kernel drops it when the holder's process dies, so a
  SIGKILLed worker never blocks the replay. Each claim also raises the session's epoch, and
  every commit checks it, so a released (or taken-over) lease can never write.
- The event feed learns of other processes' commits from ``PRAGMA data_version`` of the
  writer connection (its own commits leave it unchanged), read every ``poll_interval``
  seconds while anyone subscribes or waits: one cheap call, no table scan.
- Opening a new file is safe when many processes do it at once: the WAL switch and the schema
  migration run under an exclusive OS lock on the lease file (SQLite may answer "busy" to a
  WAL switch without waiting, whatever the busy timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import sqlite3
import struct
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from ..errors import FatalToolError, LeaseLostError, StoreError
from ..records import NewEntry, SessionKey, TurnRecord
from ._base import BufferedTransaction, LeaseBase, claim_found, poll_until
from ._feed import Feed, FeedStore
from ._log import LEGACY_TO_LOG, LOOKUP_INDEX

# Re-exported: the fewest messages a ``log_transcript`` row holds, the most log rows a
# commit copies into it.
from ._sql import TRANSCRIPT_CHUNK as TRANSCRIPT_CHUNK
from ._sql import TRANSCRIPT_COPY_ROWS as TRANSCRIPT_COPY_ROWS
from ._sql import SqlReads, SqlRules
from ._thread import Worker

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
    """
    ALTER TABLE sessions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE turns ADD COLUMN data TEXT;
    """,
    # 3: one append-only row per step (stores/_log.py); the rows of the three tables before
    # it are moved into it.
    """
    CREATE TABLE log (
        sid INTEGER NOT NULL, seq INTEGER NOT NULL, sub INTEGER NOT NULL,
        gen INTEGER NOT NULL, n INTEGER NOT NULL, turn_id TEXT,
        body TEXT, step TEXT, memo TEXT, events TEXT,
        PRIMARY KEY (sid, seq, sub)
    ) WITHOUT ROWID;
    """ + LOOKUP_INDEX + ";" + ";".join(LEGACY_TO_LOG),
    # 4: the log's messages again, many per row, read instead of the log's rows they copy
    # (stores/_sql.py); filled from the next commit that moves a session's chain.
    """
    CREATE TABLE log_transcript (
        sid INTEGER NOT NULL, gen INTEGER NOT NULL, n INTEGER NOT NULL, seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (sid, gen, n)
    ) WITHOUT ROWID;
    """,
]

_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
_F_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)
_SCHEMA_BYTE = 1 << 62  # outside the range session bytes hash to
_RULES = SqlRules(lookup_hint=" INDEXED BY log_lookup")
CHECKPOINT_EVERY = 256
"""Commits between two WAL checkpoints (run on the writer thread)."""
WAL_RESTART_FRAMES = 4096
"""Frames (pages of 4 KiB) the WAL may hold before a checkpoint holds writes back so the WAL
starts over (:meth:`SqliteStore._checkpoints`): about 16 MiB."""
LOCAL_LINGER = 0.0005
"""Seconds the loop waits, blocked, for a local tool on the writer thread before it waits on
the loop: most local tools (a few row writes) end sooner, and the step then skips the loop's
wake-up; a longer one delays other sessions by this much at most."""
SPARE_LOCK_FILES = 64
"""Open descriptions of the lock file a store keeps for its next claims."""
RELEASED_KEPT = 4096
"""Sessions whose counters a store keeps after its lease ends, for its next claim of them."""
DETECTOR_LINGER = 2.0
"""Seconds the change detector keeps polling after the last subscriber or watcher left."""


def _busy(e: BaseException) -> bool:
    """Whether SQLite refused to wait (our busy handler is off on the loop)."""
    code = getattr(e, "sqlite_errorcode", 0) & 0xFF
    return isinstance(e, sqlite3.OperationalError) and code in (sqlite3.SQLITE_BUSY,
                                                                 sqlite3.SQLITE_LOCKED)


def _in_transaction(c: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    c.execute("BEGIN IMMEDIATE")
    try:
        out = fn(c)
        c.execute("COMMIT")
    except BaseException:
        if c.in_transaction:
            c.execute("ROLLBACK")
        raise
    return out


def _flock(fd: int, offset: int, *, wait: bool, unlock: bool = False) -> bool:
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks), padding
    kind = fcntl.F_UNLCK if unlock else fcntl.F_WRLCK
    flock = struct.pack("hhqqi4x", kind, os.SEEK_SET, offset, 1, 0)
    try:
        fcntl.fcntl(fd, _F_OFD_SETLKW if wait else _F_OFD_SETLK, flock)
    except OSError:
        return False
    return True


def _session_byte(key: SessionKey) -> int:
    digest = hashlib.blake2b(str(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 62) - 1)


class _SqliteTransaction(BufferedTransaction):
    """One step's transaction. The write lock is taken at the first ``run_local`` or at
    commit and held until the commit ends: the writer connection serves every session."""

    lease: _SqliteLease

    def __init__(self, lease: _SqliteLease) -> None:
        super().__init__(lease)
        self._store = lease.store
        self._conn = lease.store._writer_conn()
        self._begun = False
        self._locked = False

    def unwrap(self) -> sqlite3.Connection:
        return self._conn

    async def _lock(self) -> None:
        if not self._locked:
            await self._store._write_lock.acquire()
            self._locked = True

    async def __aenter__(self) -> _SqliteTransaction:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        store = self._store
        try:
            if exc_type is None:
                await self._lock()
                if not self._begun and _RULES.one_row(self.writes):
                    # One fenced statement, its own transaction; where it must wait for the
                    # lock, the writer thread runs the whole transaction instead.
                    await store._write(self._commit_one, waiting=self._commit)
                else:
                    await store._write(self._commit, began=self._begun)
                self.committed()
                store._committed()
                store._feed.published(self.lease.key, self.writes.events)
            elif self._begun:
                self._rollback()
        finally:
            if self._locked:
                self._locked = False
                store._write_lock.release()

    def _commit(self) -> None:
        c, lease = self._conn, self.lease
        try:
            if not self._begun:
                c.execute("BEGIN IMMEDIATE")
                self._begun = True
            if not self._write_fenced(c):
                raise LeaseLostError(str(lease.key), lease.epoch)
            c.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        self._begun = False

    def _commit_one(self) -> None:
        """A :meth:`SqlRules.one_row` step outside any transaction: one statement."""
        if not self._write_fenced(self._conn):
            raise LeaseLostError(str(self.lease.key), self.lease.epoch)

    def _write_fenced(self, c: sqlite3.Connection) -> bool:
        """The buffered writes if the lease's epoch is still the session's (else False)."""
        lease, w = self.lease, self.writes
        if _RULES.one_row(w):
            return _RULES.append(c, lease.sid, lease.epoch, lease.generation,
                                 self.first_index(), w)
        if not _RULES.holds(c, lease.sid, lease.epoch):
            return False
        _RULES.flush(c, lease.sid, lease.generation, self.first_index(), w, seq=lease.last_seq)
        return True

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")
        self._begun = False

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        await self._lock()
        return await self._store._on_writer_thread(lambda: self._run_local(fn),
                                                   linger=LOCAL_LINGER)

    def _run_local(self, fn: Callable[[Any], T]) -> T:
        c = self._conn
        # Our own rows are buffered until commit, so when the tool is the first to write, a
        # rollback of the whole transaction undoes exactly the tool's writes: no savepoint.
        first = not self._begun
        if first:
            c.execute("BEGIN IMMEDIATE")
            self._begun = True
        else:
            c.execute("SAVEPOINT local_tool")
        try:
            out = fn(c)
        except BaseException:
            if not c.in_transaction:
                self._begun = False
            elif first:
                c.execute("ROLLBACK")
                self._begun = False
            else:
                c.execute("ROLLBACK TO local_tool")
                c.execute("RELEASE local_tool")
            raise
        if not c.in_transaction:
            # The tool committed or rolled back the step's own transaction through the raw
            # handle: its writes are no longer tied to the step, which we cannot repair.
            self._begun = False
            raise FatalToolError(
                "a local tool ended the store's transaction (COMMIT/ROLLBACK on the raw "
                "handle); write through ctx.store.unwrap() without managing transactions"
            )
        if not first:
            c.execute("RELEASE local_tool")
        return out


class _SqliteLease(LeaseBase):
    def __init__(self, store: SqliteStore, key: SessionKey, fd: int, offset: int, sid: int,
                 epoch: int, generation: int, last_seq: int, count: int) -> None:
        super().__init__(key, epoch, generation, last_seq, count)
        self.store = store
        self.sid = sid
        self._fd: int | None = fd
        self._offset = offset

    def transaction(self) -> _SqliteTransaction:
        return _SqliteTransaction(self)

    async def cancel_requested(self, turn_id: str) -> str | None:
        store, sid = self.store, self.sid
        return await store._read(lambda c: _RULES.cancel_of(c, sid, turn_id))

    async def release(self) -> None:
        if self._fd is not None:
            self.store._release(self)
            self.store._give_back(self._fd, self._offset)
            self._fd = None


class SqliteStore(SqlReads, FeedStore):
    """A session store in one SQLite file.

    Args:
        path: the database file; created if missing. A file that is not a durable_turns
            database (another application's, or corrupt) is refused and left untouched.
        synchronous: SQLite's ``synchronous`` setting. ``NORMAL`` (default) is durable
            against process crashes in WAL mode; ``FULL`` also against power loss.
        busy_timeout: seconds a write waits for another process's write lock.
        poll_interval: seconds between looks for other processes' commits while anyone
            subscribes to a session's events.
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "NORMAL",
                 busy_timeout: float = 10.0, poll_interval: float = 0.02) -> None:
        if str(path) == ":memory:":
            raise StoreError("SqliteStore needs a file; use MemoryStore for an in-memory store")
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"unknown synchronous setting {synchronous!r}")
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        self.path = Path(path)
        self.poll_interval = poll_interval
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._slow_reader: sqlite3.Connection | None = None  # the reader thread's own
        self._checkpointer: sqlite3.Connection | None = None  # the writer thread's own
        self._commits = 0
        self._checkpointing: asyncio.Task[None] | None = None
        self._write_pool: Worker | None = None
        self._read_pool: Worker | None = None
        self._write_lock = asyncio.Lock()
        self._spare_fds: list[int] = []
        self._released: dict[SessionKey, tuple[int, int, int, int, int]] = {}
        """Counters of the leases this store released last: ``(sid, epoch, generation, newest
        seq, message count)``."""
        self._feed = Feed(self.events_after, self.newest_seq, on_active=self._start_detector)
        self._detector: asyncio.Task[None] | None = None

    # -- opening ---------------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        if not Path(f"{self.path}-lease").exists():
            # Nothing is created beside a file that is not ours. (Once the lock file exists
            # the file was ours, or is being made ours: the writer looks again under it.)
            self._check_foreign()
        # Here, when nothing makes it wait (the schema lock free, the database not busy, no
        # migration to run); else on the writer thread, which may wait and migrate.
        writer = self._connect_writer(wait=False)
        if writer is None:
            writer = await self._writer_thread().run(self._connect_writer_waiting)
        try:
            reader = self._connect()  # connecting takes no lock
        except BaseException:
            writer.close()
            raise
        # The loop's connections never wait: a busy call goes to a thread that may. The
        # threads (a writer that may wait, a reader that may) and their own connections (a
        # waiting reader, the checkpointer) are made when first needed.
        writer.execute("PRAGMA busy_timeout = 0")
        reader.execute("PRAGMA busy_timeout = 0")
        self._writer, self._reader = writer, reader
        if self._feed.active:
            # Someone subscribed before the open: the detector their subscription started
            # found no connection and ended (an open waits whenever it migrates), and the
            # feed starts one only when it gets its first listener.
            self._start_detector()

    def _writer_thread(self) -> Worker:
        """The writer thread (started at its first job)."""
        if self._write_pool is None:
            self._write_pool = Worker("durable-turns-sqlite-write")
        return self._write_pool

    def _connect(self, *, busy_timeout: float | None = None) -> sqlite3.Connection:
        timeout = self._busy_timeout if busy_timeout is None else busy_timeout
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        except sqlite3.Error as e:
            raise StoreError(f"cannot open {self.path}: {e}") from e
        return conn

    def _connect_writer(self, *, wait: bool) -> sqlite3.Connection | None:
        """The writer connection, the database in WAL mode and migrated, under the schema lock.
        Without ``wait``: None where it would wait for a lock or migrate."""
        fd = os.open(f"{self.path}-lease", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _flock(fd, _SCHEMA_BYTE, wait=wait) and not wait:
                os.close(fd)
                return None
            conn = self._connect(busy_timeout=None if wait else 0)
        except BaseException:
            os.close(fd)
            raise
        try:
            # Again (or first), under the lock: another process may have been half-way
            # through creating the file when this one looked.
            self._refuse_foreign(conn)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # checkpoints run off the loop
            if not wait and not self._current(conn):
                conn.close()
                return None
            self._migrate(conn)
        except sqlite3.Error as e:
            conn.close()
            if not wait and _busy(e):
                return None
            raise StoreError(f"cannot use {self.path} as a durable_turns store: {e}") from e
        except BaseException:
            conn.close()
            raise
        finally:
            os.close(fd)  # drops the schema lock
        return conn

    def _connect_writer_waiting(self) -> sqlite3.Connection:
        conn = self._connect_writer(wait=True)
        if conn is None:  # waiting, it does not give up
            raise StoreError(f"cannot open {self.path}")
        return conn

    def _check_foreign(self) -> None:
        """Refuse a file that is not a durable_turns store, looking at it read-only."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        try:
            probe = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open {self.path}: {e}") from e
        try:
            self._refuse_foreign(probe)
        finally:
            probe.close()

    def _refuse_foreign(self, conn: sqlite3.Connection) -> None:
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as e:
            if _busy(e):
                raise  # busy, not foreign: the caller waits or goes to a thread that may
            raise StoreError(
                f"{self.path} is not a SQLite database or is corrupt ({e}); refusing to use it"
            ) from e
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

    @staticmethod
    def _current(conn: sqlite3.Connection) -> bool:
        """Whether the database needs no migration."""
        return bool(conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) and
                    conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # A current store needs no write: opening it commits nothing (the schema lock is held,
        # so nobody migrates it meanwhile).
        if self._current(conn):
            return
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
        if self._checkpointing is not None:
            with contextlib.suppress(Exception):  # a failed checkpoint: the file is whole
                await self._checkpointing  # it ends its jobs with the store open
        self._feed.close()
        if self._detector is not None:
            self._detector.cancel()
            self._detector = None
        writer, reader = self._writer, self._reader
        write_pool, read_pool = self._write_pool, self._read_pool
        self._writer = self._reader = None
        while self._spare_fds:
            os.close(self._spare_fds.pop())
        self._write_pool = self._read_pool = None
        # Each thread closes its own connections after its queued jobs (a checkpoint, a
        # waiting read) have run: jobs run in order.
        if write_pool is not None:
            async with self._write_lock:
                await write_pool.run(lambda: self._close_writer_thread(writer))
            write_pool.stop()
        elif writer is not None:
            writer.close()
        if read_pool is not None:
            await read_pool.run(self._close_reader_thread)
            read_pool.stop()
        if reader is not None:
            reader.close()

    def _close_writer_thread(self, writer: sqlite3.Connection | None) -> None:
        if writer is not None:
            writer.close()
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None

    def _close_reader_thread(self) -> None:
        if self._slow_reader is not None:
            self._slow_reader.close()
            self._slow_reader = None

    def _writer_conn(self) -> sqlite3.Connection:
        if self._writer is None:
            raise StoreError(f"SqliteStore({str(self.path)!r}) is not open; await store.open()")
        return self._writer

    def unwrap(self) -> sqlite3.Connection:
        """The writer connection, for set-up and inspection outside any step; use it from
        one thread at a time, and never while the runtime drives turns."""
        return self._writer_conn()

    # -- the loop and the threads ----------------------------------------------------------

    async def _on_writer_thread(self, fn: Callable[[], T], *, linger: float = 0.0) -> T:
        """Run ``fn`` on the writer thread, where the writer connection may wait for the lock
        (the caller holds ``_write_lock``); ``linger``: see :meth:`Worker.run`."""
        writer = self._writer
        if writer is None:
            raise StoreError(f"SqliteStore({str(self.path)!r}) is not open; await store.open()")
        pool = self._writer_thread()
        timeout = int(self._busy_timeout * 1000)

        def waiting() -> T:
            writer.execute(f"PRAGMA busy_timeout = {timeout}")
            try:
                return fn()
            finally:
                writer.execute("PRAGMA busy_timeout = 0")

        return await pool.run(waiting, linger=linger)

    async def _write(self, fn: Callable[[], T], *, began: bool = False,
                     waiting: Callable[[], T] | None = None) -> T:
        """Run a write job (the caller holds ``_write_lock``): here if the database's write lock
        is free, else on the writer thread, which waits for it (running ``waiting`` instead
        of ``fn`` when given). A job that ``began`` on the thread already holds the lock and
        cannot be refused.

        Raises:
            StoreError: SQLite failed (what the job raises of its own propagates as it is).
        """
        try:
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if began or not _busy(e):
                    raise
            return await self._on_writer_thread(waiting or fn)
        except sqlite3.Error as e:
            raise StoreError(f"write to {self.path} failed: {e}") from e

    async def _write_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one ``BEGIN IMMEDIATE`` transaction of its own."""
        c = self._writer_conn()
        async with self._write_lock:
            out = await self._write(lambda: _in_transaction(c, fn))
        self._committed()
        return out

    async def _write_statement(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn``, one writing statement, as its own transaction; where it must wait for
        the lock, the writer thread runs it inside ``BEGIN IMMEDIATE`` (a lone statement
        that read before it wrote could be refused there without waiting)."""
        c = self._writer_conn()
        async with self._write_lock:
            return await self._write(lambda: fn(c), waiting=lambda: _in_transaction(c, fn))

    def _committed(self) -> None:
        self._commits += 1
        if self._commits % CHECKPOINT_EVERY == 0 and self._writer is not None \
                and self._checkpointing is None:
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoints())

    async def _checkpoints(self) -> None:
        """A WAL checkpoint on the writer thread while the loop goes on writing. The WAL
        starts over only at a write that finds it wholly checkpointed, which under writes
        without a pause never happens; so once it holds ``WAL_RESTART_FRAMES`` frames, a
        second checkpoint (of the few frames written meanwhile) runs with this store's
        writes held back, and the next write starts the WAL over."""
        try:
            frames = await self._writer_thread().run(self._checkpoint)
            if frames >= WAL_RESTART_FRAMES:
                async with self._write_lock:
                    if self._writer is not None:
                        await self._writer_thread().run(self._checkpoint)
        finally:
            self._checkpointing = None

    def _checkpoint(self) -> int:
        """A passive WAL checkpoint, on the writer thread, by that thread's own connection;
        returns the frames the WAL holds (0 when it failed)."""
        with contextlib.suppress(sqlite3.Error):  # the next one catches up
            if self._checkpointer is None:
                self._checkpointer = self._connect()
            row = self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            return int(row[1]) if row is not None and row[1] > 0 else 0
        return 0

    _rules = _RULES

    async def _query(self, fn: Callable[[Any], Any]) -> Any:
        return await self._read(fn)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        reader = self._reader
        if reader is None:
            raise StoreError(f"SqliteStore({str(self.path)!r}) is not open; await store.open()")
        try:
            try:
                return fn(reader)
            except sqlite3.OperationalError as e:
                if not _busy(e):
                    raise
            if self._read_pool is None:
                self._read_pool = Worker("durable-turns-sqlite-read")
            return await self._read_pool.run(lambda: fn(self._waiting_reader()))
        except sqlite3.Error as e:
            raise StoreError(f"read from {self.path} failed: {e}") from e

    def _waiting_reader(self) -> sqlite3.Connection:
        """The reader thread's connection, which may wait (made at its first use)."""
        if self._slow_reader is None:
            self._slow_reader = self._connect()
        return self._slow_reader

    # -- leases and writes -----------------------------------------------------------------

    async def claim(self, key: SessionKey, *, timeout: float | None = None) -> _SqliteLease:
        self._writer_conn()
        fd = self._lock_file()
        offset = _session_byte(key)
        try:
            await poll_until(lambda: _flock(fd, offset, wait=False), key, timeout)
            sid, epoch, gen, seq, count = await self._new_epoch(key)
        except BaseException:
            self._give_back(fd, offset)
            raise
        return _SqliteLease(self, key, fd, offset, sid, epoch, gen, seq, count)

    async def _new_epoch(self, key: SessionKey) -> tuple[int, int, int, int, int]:
        """Raise the session's epoch (the OS lock is held): ``(sid, epoch, generation, newest
        seq, message count)``. A session this process released last is one statement: when
        the new epoch follows the one it released, nobody wrote in between, so the counters
        it kept are the session's."""
        known = self._released.pop(key, None)
        if known is None:
            return await self._write_tx(lambda c: _RULES.claim(c, key))
        sid, released, generation, seq, count = known
        epoch, gen = await self._write_statement(lambda c: _RULES.bump(c, sid))
        self._committed()
        if epoch != released + 1 or gen != generation:
            seq, count = await self._read(lambda c: _RULES.last_row(c, sid, gen))
        return sid, epoch, gen, seq, count

    def _release(self, lease: _SqliteLease) -> None:
        """A lease ends: keep its counters for this process's next claim of the session."""
        if len(self._released) >= RELEASED_KEPT:
            self._released.pop(next(iter(self._released)))
        self._released[lease.key] = (lease.sid, lease.epoch, lease.generation, lease.last_seq,
                                     lease.message_count)

    def _lock_file(self) -> int:
        """An open file description of the lock file that holds no lock: a spare one (opening
        the file costs more than a step's commit on a small machine) or a new one."""
        if self._spare_fds:
            return self._spare_fds.pop()
        return os.open(f"{self.path}-lease", os.O_RDWR | os.O_CREAT, 0o644)

    def _give_back(self, fd: int, offset: int) -> None:
        """Drop the lock on ``offset`` and keep the description for the next claim (each
        lease has a description of its own: an OFD lock belongs to its description)."""
        if self._writer is None or len(self._spare_fds) >= SPARE_LOCK_FILES or \
                not _flock(fd, offset, wait=False, unlock=True):
            os.close(fd)  # closing the description drops its locks
            return
        self._spare_fds.append(fd)

    async def enqueue(self, key: SessionKey, entry: NewEntry) -> tuple[TurnRecord, bool]:
        if entry.kind == "turn" and entry.supersede is None:  # the common accept: one statement
            record = await self._write_statement(lambda c: _RULES.enqueue_plain(c, key, entry))
            if record is not None:
                self._committed()
                return record, True
        return await self._write_tx(lambda c: _RULES.enqueue(c, key, entry))

    async def request_cancel(
        self, key: SessionKey, turn_id: str | None, reason: str
    ) -> list[str]:
        ids = await self._write_tx(lambda c: _RULES.request_cancel(c, key, turn_id, reason))
        if ids:
            self._feed.changed(key)
        return ids

    async def set_turn_data(self, key: SessionKey, turn_id: str, name: str, value: Any, *,
                            only_new: bool = False) -> Any:
        return await self._write_tx(
            lambda c: _RULES.set_turn_data(c, key, turn_id, name, value, only_new))

    # -- reads -----------------------------------------------------------------------------

    async def claim_ready(self, agents: Collection[str], limit: int = 100) -> list[_SqliteLease]:
        return await claim_found(self.find_claimable, lambda k: self.claim(k, timeout=0),
                                 agents, limit)

    async def find_claimable(self, limit: int = 100) -> list[SessionKey]:
        keys = await self.find_sessions("unfinished")
        self._writer_conn()
        fd = os.open(f"{self.path}-lease", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            free: list[SessionKey] = []
            for key in keys:
                if len(free) >= limit:
                    break
                offset = _session_byte(key)
                if _flock(fd, offset, wait=False):  # free: let go at once
                    _flock(fd, offset, wait=False, unlock=True)
                    free.append(key)
        finally:
            os.close(fd)
        return free

    # -- the event feed (subscribe and watch come from FeedStore) ---------------------------

    def _start_detector(self) -> None:
        if self._detector is None or self._detector.done():
            self._detector = asyncio.ensure_future(self._detect())

    async def _detect(self) -> None:
        """Tell the feed when another connection committed, while anyone listens."""
        seen: int | None = None
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        try:
            # It lingers a moment after the last listener leaves: turns come and go, and a
            # detector started afresh must wake everyone once (see below).
            while self._writer is not None and (
                self._feed.active or loop.time() - idle_since < DETECTOR_LINGER
            ):
                if self._feed.active:
                    idle_since = loop.time()
                # Asked of the writer connection, whose own commits leave it unchanged: it
                # moves only when another process committed.
                async with self._write_lock:
                    if self._writer is None:
                        return
                    try:
                        version = int(
                            self._writer.execute("PRAGMA data_version").fetchone()[0])
                    except sqlite3.Error:
                        version = -1  # look again next time; tell everyone to re-read now
                # The first look only sets the mark: tell everyone once, so a commit made
                # between their own read and this mark is not missed.
                if version != seen:
                    self._feed.changed_any()
                seen = version
                await asyncio.sleep(self.poll_interval)
        except StoreError:
            return  # closed under us
