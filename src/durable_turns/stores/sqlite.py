"""The embedded store: one SQLite file (stdlib ``sqlite3``, WAL), shared by many processes; a
dialect of the SQL kit (``stores.sql``), which writes its statements, its write path and its
schema.

- Store I/O never *waits* on the event loop. Every statement runs with SQLite's busy handler
  off, so it either finishes at once (a WAL read never waits; an uncontended write takes
  microseconds) or fails with "busy"; a busy call is then run again on the store's own thread
  (writer or reader), which waits there for up to ``busy_timeout``. A write lock held by another
  process therefore stalls only the writes that need it, never the loop, the other sessions'
  reads or their subscribers. Why not every call on a thread: a thread hop costs 70 to 150 µs of
  CPU on a small machine, more than a whole step's commit.
- Statements are serialised (one writer), so the kit's one-statement paths apply: the common
  step (a model reply, a tool result: one log row, nothing else) is one statement, its own
  transaction, fenced in its ``WHERE``; so is the common accept, and a claim of a session this
  store released last (``LocalLeases``).
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
  seconds while anyone subscribes or waits: one cheap call, no table scan. Live events (text
  as a model streams it, never written to the file) reach the other processes' subscribers
  as datagrams (``_sqlite_live``).
- Opening a new file is safe when many processes do it at once (``_sqlite_files``: the WAL
  switch and the migration under an OS lock; a foreign file refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import StoreError
from ..records import SessionKey
from . import StoreCapabilities
from ._feed import Feed
from ._sqlite_files import (
    FileLocks,
    SqliteConnection,
    SqliteTransactions,
    busy,
    connect,
    open_writer,
)
from ._sqlite_live import SocketWire
from ._sqlite_signals import FileSignals
from .kit import StoreThread

# Re-exported: the fewest messages a ``log_transcript`` row holds, the most log rows a
# commit copies into it.
from .sql import TRANSCRIPT_CHUNK as TRANSCRIPT_CHUNK
from .sql import TRANSCRIPT_COPY_ROWS as TRANSCRIPT_COPY_ROWS
from .sql import LocalLeases, SharedLink, SqlStore, Syntax, create_statements

__all__ = [
    "CREATE",
    "SYNTAX",
    "SqliteConnection",
    "SqliteDialect",
    "SqliteStore",
    "SqliteTransactions",
]

T = TypeVar("T")

SYNTAX = Syntax(
    serialised=True,
    lookup_hint=" INDEXED BY log_lookup",  # SQLite plans without statistics
    keyed_suffix=" WITHOUT ROWID",
    columns_query="SELECT m.name, p.name FROM sqlite_master m "
                  "JOIN pragma_table_info(m.name) p WHERE m.type = 'table'",
    indexes_query="SELECT name FROM sqlite_master WHERE type = 'index'",
    user_version=True,
)
"""SQLite's SQL (its transactions are :class:`SqliteTransactions`')."""
CREATE: tuple[str, ...] = tuple(create_statements(SYNTAX))
"""The statements that create a new store's tables and indexes."""
CAPABILITIES = StoreCapabilities(durable=True, shared_by="processes", exactly_once_local=True,
                                 local_off_loop=True, paramstyle="qmark")

CHECKPOINT_EVERY = 256
"""Commits between two WAL checkpoints (run on the writer thread)."""
WAL_RESTART_FRAMES = 4096
"""Frames (pages of 4 KiB) the WAL may hold before a checkpoint holds writes back so the WAL
starts over (:meth:`SqliteDialect._checkpoints`): about 16 MiB."""
LOCAL_LINGER = 0.0005
"""Seconds the loop waits, blocked, for a local tool on the writer thread before it waits on
the loop: most local tools (a few row writes) end sooner, and the step then skips the loop's
wake-up; a longer one delays other sessions by this much at most."""
DETECTOR_LINGER = 2.0
"""Seconds the change detector keeps polling after the last subscriber or watcher left."""


class SqliteDialect(SqliteTransactions):
    """SQLite's dialect of the SQL kit (``Dialect``, ``SharedWriter``); see the module's
    docstring.

    Args: as :class:`SqliteStore`'s.
    """

    syntax = SYNTAX
    capabilities = CAPABILITIES

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "NORMAL",
                 busy_timeout: float = 10.0, poll_interval: float = 0.02,
                 create: bool = False) -> None:
        if str(path) == ":memory:":
            raise StoreError("SqliteStore needs a file; use MemoryStore for an in-memory store")
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"unknown synchronous setting {synchronous!r}")
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        self.path = Path(path)
        self.poll_interval = poll_interval
        self._create = create
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._writer: SqliteConnection | None = None
        self._reader: SqliteConnection | None = None
        self._slow_reader: SqliteConnection | None = None  # the reader thread's own
        self._checkpointer: SqliteConnection | None = None  # the writer thread's own
        self._commits = 0
        self._checkpointing: asyncio.Task[None] | None = None
        self._write_pool: StoreThread | None = None
        self._read_pool: StoreThread | None = None
        self.write_lock = asyncio.Lock()
        """Held by whoever uses the writer connection (it serves every session)."""
        self._locks = FileLocks(self.path, self._check_open)
        self.leases = LocalLeases(self._locks)
        self._feed: Feed | None = None
        self._adopt: Callable[[], None] | None = None  # the store's Cancels.adopt
        self._detector: asyncio.Task[None] | None = None
        self.live = SocketWire(self.path)
        """``Dialect.live``: datagrams to the other processes on this file."""
        self.signals = FileSignals(self.path, self.write_lock)
        """``Dialect.signals``: cancels sent while a step holds the write lock, in
        ``<path>-signals``."""

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def _check_open(self, required: bool) -> bool:
        if required:
            self.writer()
        return self._writer is not None

    def writer(self) -> SqliteConnection:
        """The writer connection.

        Raises:
            StoreError: the store is not open.
        """
        if self._writer is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        return self._writer

    # -- opening ---------------------------------------------------------------------------

    async def open(self, store: SqlStore) -> None:
        """``Dialect.open``."""
        self._feed = store.feed
        cancels, accepts = store.cancels, store.accepts

        def adopt() -> None:  # what another process kept as a signal: cancels, accepts
            cancels.adopt()
            accepts.adopt()

        self._adopt = adopt
        if self._writer is not None:
            return
        # Here, when nothing makes it wait (the schema lock free, the database not busy, no
        # migration to run); else on the writer thread, which may wait and migrate.
        writer = self._open_writer(wait=False)
        if writer is None:
            writer = await self._writer_thread().run(lambda: self._open_writer(wait=True))
        if writer is None:  # waiting, it does not give up
            raise StoreError(f"cannot open {self.path}")
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
            self.listen(self._feed)

    def _writer_thread(self) -> StoreThread:
        """The writer thread (started at its first job)."""
        if self._write_pool is None:
            self._write_pool = StoreThread("durable-turns-sqlite-write")
        return self._write_pool

    def _connect(self) -> SqliteConnection:
        return connect(self.path, self._busy_timeout)

    def _open_writer(self, *, wait: bool) -> SqliteConnection | None:
        return open_writer(self.path, SYNTAX, synchronous=self._synchronous,
                           busy_timeout=self._busy_timeout, wait=wait, create=self._create)

    async def close(self) -> None:
        """``Dialect.close``."""
        if self._checkpointing is not None:
            with contextlib.suppress(Exception):  # a failed checkpoint: the file is whole
                await self._checkpointing  # it ends its jobs with the store open
        if self._detector is not None:
            self._detector.cancel()
            self._detector = None
        self.live.close()
        self.signals.close()
        writer, reader = self._writer, self._reader
        write_pool, read_pool = self._write_pool, self._read_pool
        self._writer = self._reader = None
        self._locks.close()
        self._write_pool = self._read_pool = None
        # Each thread closes its own connections after its queued jobs (a checkpoint, a
        # waiting read) have run: jobs run in order.
        if write_pool is not None:
            async with self.write_lock:
                await write_pool.run(lambda: self._close_writer_thread(writer))
            write_pool.stop()
        elif writer is not None:
            writer.close()
        if read_pool is not None:
            await read_pool.run(self._close_reader_thread)
            read_pool.stop()
        if reader is not None:
            reader.close()

    def _close_writer_thread(self, writer: SqliteConnection | None) -> None:
        if writer is not None:
            writer.close()
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None

    def _close_reader_thread(self) -> None:
        if self._slow_reader is not None:
            self._slow_reader.close()
            self._slow_reader = None

    def unwrap(self) -> sqlite3.Connection:
        """``Dialect.unwrap``."""
        return self.writer()

    # -- the loop and the threads ----------------------------------------------------------

    async def on_writer_thread(self, job: Callable[[sqlite3.Connection], T], *,
                               linger: float = 0.0) -> T:
        """Run ``job(writer connection)`` on the writer thread, where the connection may wait
        for the lock (the caller holds :attr:`write_lock`); ``linger``: see
        :meth:`StoreThread.run`."""
        writer = self.writer()
        pool = self._writer_thread()
        timeout = int(self._busy_timeout * 1000)

        def waiting() -> T:
            writer.execute(f"PRAGMA busy_timeout = {timeout}")
            try:
                return job(writer)
            finally:
                writer.execute("PRAGMA busy_timeout = 0")

        return await pool.run(waiting, linger=linger)

    async def run_write(self, job: Callable[[sqlite3.Connection], T], *, began: bool = False,
                        waiting: Callable[[sqlite3.Connection], T] | None = None) -> T:
        """Run a write job on the writer connection (the caller holds :attr:`write_lock`):
        here if the database's write lock is free, else on the writer thread, which waits for
        it (running ``waiting`` instead of ``job`` when given). A job that ``began`` on the
        thread already holds the lock and cannot be refused.

        Raises:
            StoreError: SQLite failed (what the job raises of its own propagates as it is).
        """
        try:
            try:
                return job(self.writer())
            except sqlite3.OperationalError as e:
                if began or not busy(e):
                    raise
            return await self.on_writer_thread(waiting or job)
        except sqlite3.Error as e:
            raise StoreError(f"write to {self.path} failed: {e}") from e

    async def write(self, job: Callable[[Any], T], *,
                    waiting: Callable[[Any], T] | None = None) -> T:
        """``Dialect.write``."""
        self.writer()
        async with self.write_lock:
            out = await self.run_write(job, waiting=waiting)
        self.committed()
        return out

    def step(self) -> SharedLink:
        """``Dialect.step``."""
        return SharedLink(self)

    def run_local_job(self, job: Callable[[Any], T]) -> Awaitable[T]:
        """``SharedWriter.run_local_job``: on the writer thread, the loop lingering for it."""
        return self.on_writer_thread(job, linger=LOCAL_LINGER)

    def committed(self) -> None:
        """Count a commit; every ``CHECKPOINT_EVERY`` starts a WAL checkpoint, off the loop."""
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
                async with self.write_lock:
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

    async def read(self, job: Callable[[Any], T]) -> T:
        """``Dialect.read``."""
        reader = self._reader
        if reader is None:
            raise StoreError(f"{self!r} is not open; await store.open()")
        try:
            try:
                return job(reader)
            except sqlite3.OperationalError as e:
                if not busy(e):
                    raise
            if self._read_pool is None:
                self._read_pool = StoreThread("durable-turns-sqlite-read")
            return await self._read_pool.run(lambda: job(self._waiting_reader()))
        except sqlite3.Error as e:
            raise StoreError(f"read from {self.path} failed: {e}") from e

    def _waiting_reader(self) -> SqliteConnection:
        """The reader thread's connection, which may wait (made at its first use)."""
        if self._slow_reader is None:
            self._slow_reader = self._connect()
        return self._slow_reader

    def notify(self, c: Any, key: SessionKey, seq: int | None,
               live: Sequence[str] = ()) -> None:
        """``Dialect.notify``."""
        return None  # other processes look (PRAGMA data_version)

    # -- the wake-ups ----------------------------------------------------------------------

    def listen(self, feed: Feed) -> None:
        """``Dialect.listen``."""
        self._feed = feed
        if self._detector is None or self._detector.done():
            self._detector = asyncio.ensure_future(self._detect(feed))

    async def _detect(self, feed: Feed) -> None:
        """Tell the feed when another connection committed, while anyone listens; and take
        other processes' live events meanwhile."""
        seen: int | None = None
        signalled: int | None = None
        looked = False
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        self.live.start()
        try:
            # It lingers a moment after the last listener leaves: turns come and go, and a
            # detector started afresh must wake everyone once (see below).
            while self._writer is not None and (
                feed.active or loop.time() - idle_since < DETECTOR_LINGER
            ):
                if feed.active:
                    idle_since = loop.time()
                # A cancel another process kept as a signal (the write lock was held): not
                # under our write lock, which one of our local tools may hold a long time.
                version = self.signals.version()
                if looked and version != signalled:
                    feed.changed_any()
                    if self._adopt is not None:
                        self._adopt()
                signalled, looked = version, True
                # Asked of the writer connection, whose own commits leave it unchanged: it
                # moves only when another process committed.
                async with self.write_lock:
                    if self._writer is None:
                        return
                    try:
                        version = int(self._writer.execute("PRAGMA data_version")
                                      .fetchone()[0])
                    except sqlite3.Error:
                        version = -1  # look again next time; tell everyone to re-read now
                # The first look only sets the mark: tell everyone once, so a commit made
                # between their own read and this mark is not missed.
                if version != seen:
                    feed.changed_any()
                seen = version
                await asyncio.sleep(self.poll_interval)
        finally:
            self.live.stop()


class SqliteStore(SqlStore):
    """A session store in one SQLite file.

    Args:
        path: the database file; created if missing. A file that is not a durable_turns
            database (another application's, or corrupt) is refused and left untouched:
            nothing is created beside it (no ``-wal``, ``-shm`` or ``-lease`` file). So is
            an empty (0-byte) file, unless ``create``.
        synchronous: SQLite's ``synchronous`` setting. ``NORMAL`` (default) is durable
            against process crashes in WAL mode; ``FULL`` also against power loss.
        busy_timeout: seconds a write waits for another process's write lock.
        poll_interval: seconds between looks for other processes' commits while anyone
            subscribes to a session's events.
        create: make an existing empty file a new store (a missing one always is).

    Raises:
        StoreError: ``path`` is ``:memory:`` (use ``MemoryStore``).
        ValueError: an unknown ``synchronous`` setting, a ``poll_interval`` not positive.
    """

    dialect: SqliteDialect

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "NORMAL",
                 busy_timeout: float = 10.0, poll_interval: float = 0.02,
                 create: bool = False) -> None:
        super().__init__(SqliteDialect(path, synchronous=synchronous,
                                       busy_timeout=busy_timeout, poll_interval=poll_interval,
                                       create=create))
        self.path = self.dialect.path
        self.poll_interval = poll_interval

    def __repr__(self) -> str:
        return repr(self.dialect)

    def unwrap(self) -> sqlite3.Connection:
        """The writer connection, for set-up and inspection outside any step; use it from
        one thread at a time, and never while the runtime drives turns.

        Raises:
            StoreError: the store is not open.
        """
        return self.dialect.writer()
