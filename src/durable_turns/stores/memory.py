"""The in-memory store: SQLite in this process's memory (``:memory:``), a third dialect of the
SQL kit, so it keeps no second copy of the rules.

Why SQLite and not dicts: every rule of the chain, the fencing and the feed is written once,
in the kit's statements, and the reference store runs those same statements, so a test on
MemoryStore tests the rules SqliteStore and PostgresStore run. A copy of the rules on dicts
(the store before this one: 280 lines that repeated the cancel, reset, find and turn-data
rules) drifted from the SQL (it applied a step's turn data that SQLite's one-statement step
dropped). The cost, measured with ``bench/memory.py`` (a zero-latency model, 21 steps a
turn, 4,200 steps; medians of 5 processes, the 2-core machine of this change): 28.7 µs of
CPU per step on the dicts, 50.6 µs here, since each step's row is encoded and written as on
the file stores. The test suite, where this store serves most tests, did not notice: 214 s
for 789 tests before, 221 s for 827 after (see the README's "Performance").

What it is: one connection, used on the event loop (an in-memory database never waits for
a lock, so no statement goes to a thread); leases are a set of held sessions in this
process (:class:`~durable_turns.stores.sql.LocalLeases`), the feed hears only of this
process's commits, which are all there are. ``unwrap()`` is the ``sqlite3.Connection``: a
local tool's writes through it commit with its step and roll back with it (exactly once, as
on the file stores). A local tool runs on a thread of the store's (where threads can be
started; else on the loop), so the loop goes on meanwhile: a cancel sent while it runs is
kept as a signal (``stores._signals``) and folded once the step let the connection go.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import StoreError
from ..records import SessionKey
from . import StoreCapabilities
from ._feed import Feed
from ._signals import ProcessSignals
from ._thread import StoreThread
from .sql import LocalLeases, ProcessLocks, SharedLink, SqlStore, upgrade
from .sqlite import SYNTAX, SqliteConnection, SqliteTransactions

__all__ = ["MemoryStore"]

T = TypeVar("T")

LOCAL_LINGER = 0.0005
"""Seconds the loop waits, blocked, for a local tool on the store's thread before it waits
on the loop (as ``SqliteStore``'s writer thread: a tool that writes a few rows is done by
then, and its step skips a wake-up of the loop)."""


def _run(job: Callable[[sqlite3.Connection], T], c: sqlite3.Connection) -> T:
    try:
        return job(c)
    except sqlite3.Error as e:
        raise StoreError(f"the memory store failed: {e}") from e


class MemoryDialect(SqliteTransactions):
    """SQLite in memory, as a dialect of the SQL kit (``Dialect``, ``SharedWriter``; its
    transactions SQLite's); see the module docstring."""

    syntax = SYNTAX
    capabilities = StoreCapabilities(durable=False, shared_by="process",
                                     exactly_once_local=True, local_off_loop=True,
                                     paramstyle="qmark")

    def __init__(self) -> None:
        # Made here, not at open: a memory store is usable at once, and a closed one keeps
        # its sessions (opening it again finds them), as the store on dicts did.
        self.conn: SqliteConnection = sqlite3.connect(
            ":memory:", isolation_level=None, check_same_thread=False, factory=SqliteConnection)
        self.atomic(self.conn, lambda c: upgrade(c, SYNTAX, "the memory store"))
        self.write_lock = asyncio.Lock()
        """Held by whoever uses the connection for a write (it serves every session)."""
        self.leases = LocalLeases(ProcessLocks())
        self.signals = ProcessSignals(self.write_lock)
        """``Dialect.signals``: cancels sent while a step holds the connection."""
        self._local: StoreThread | None = None
        self._no_threads = False

    async def open(self, store: SqlStore) -> None:
        """``Dialect.open``."""
        return None

    async def close(self) -> None:
        """``Dialect.close``."""
        local, self._local = self._local, None
        if local is not None:
            local.stop()

    def unwrap(self) -> sqlite3.Connection:
        """``Dialect.unwrap``."""
        return self.conn

    async def read(self, job: Callable[[Any], T]) -> T:
        """``Dialect.read``."""
        return _run(job, self.conn)

    async def write(self, job: Callable[[Any], T], *,
                    waiting: Callable[[Any], T] | None = None) -> T:
        """``Dialect.write``."""
        async with self.write_lock:
            return await self.run_write(job)

    def step(self) -> SharedLink:
        """``Dialect.step``."""
        return SharedLink(self)

    def writer(self) -> SqliteConnection:
        """``SharedWriter.writer``."""
        return self.conn

    async def run_local_job(self, job: Callable[[Any], T]) -> T:
        """``SharedWriter.run_local_job``: on the store's thread, so the loop goes on while
        the tool runs (the step holds the write lock, so nothing else writes meanwhile; the
        loop's reads see only committed rows of ours, as ours are written at commit)."""
        if self._local is None and not self._no_threads:
            try:
                self._local = StoreThread("durable-turns-memory-local")
            except RuntimeError:  # no threads here (Pyodide): the tool runs on the loop
                self._no_threads = True
        if self._local is None:
            return job(self.conn)
        conn = self.conn
        return await self._local.run(lambda: job(conn), linger=LOCAL_LINGER)

    async def run_write(self, job: Callable[[Any], T], *, began: bool = False,
                        waiting: Callable[[Any], T] | None = None) -> T:
        """``SharedWriter.run_write``: at once (nothing else writes to this database)."""
        return _run(job, self.conn)

    def committed(self) -> None:
        """``SharedWriter.committed``: nothing to keep up."""

    def notify(self, c: Any, key: SessionKey, seq: int | None,
               live: Sequence[str] = ()) -> None:
        """``Dialect.notify``."""
        return None  # nobody else to tell

    def listen(self, feed: Feed) -> None:
        """``Dialect.listen``."""
        return None  # every commit is this process's: the store publishes it

    live = None
    """``Dialect.live``: no other process shares the storage."""


class MemoryStore(SqlStore):
    """Keeps everything in this process's memory (SQLite ``:memory:``). For tests and
    throwaway runs: nothing outlives the store object, and one process uses it.

    ``unwrap()`` is the ``sqlite3.Connection``; a local tool's writes through it commit with
    its step (see the module's docstring).
    """

    dialect: MemoryDialect

    def __init__(self) -> None:
        super().__init__(MemoryDialect())

    def __repr__(self) -> str:
        return "MemoryStore()"

    def unwrap(self) -> sqlite3.Connection:
        """The connection, for set-up and inspection outside any step."""
        return self.dialect.conn
