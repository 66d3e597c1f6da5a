"""The SQLite store's files: opening the database (WAL, the schema lock, the migration, a
foreign file refused) and the OS locks on bytes of its lock file ``<path>-lease``.

Opening a new file is safe when many processes do it at once: the WAL switch and the schema
migration run under an exclusive OS lock on the lock file (SQLite may answer "busy" to a WAL
switch without waiting, whatever the busy timeout). The schema version is ``PRAGMA
user_version``; ``PRAGMA application_id`` marks the file as ours, so a foreign one is never
touched.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import StoreError
from ..records import SessionKey
from .sql import SCHEMA_VERSION, Syntax, check_version, upgrade

T = TypeVar("T")

APPLICATION_ID = 0x44545552  # "DTUR": marks a file as ours, so a foreign one is never touched
SPARE_LOCK_FILES = 64
"""Open descriptions of the lock file a store keeps for its next claims."""

_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
_F_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)
_SCHEMA_BYTE = 1 << 62  # outside the range session bytes hash to


def busy(e: BaseException) -> bool:
    """Whether SQLite refused to wait (our busy handler is off on the loop)."""
    code = getattr(e, "sqlite_errorcode", 0) & 0xFF
    return isinstance(e, sqlite3.OperationalError) and code in (sqlite3.SQLITE_BUSY,
                                                                 sqlite3.SQLITE_LOCKED)


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


def lock_path(path: Path) -> str:
    """The lock file beside the database."""
    return f"{path}-lease"


class FileLocks:
    """Session locks (the SQL kit's ``Locks``): an OFD lock on one byte of the lock file each,
    chosen by hashing the session key; the kernel drops it when the holder's process dies.
    Each lease has an open description of its own (an OFD lock belongs to its description);
    spare ones are kept, since opening the file costs more than a step's commit on a small
    machine.

    Args:
        path: the database.
        check_open: raises ``StoreError`` while the store is not open (a store not open
            creates no lock file); returns whether it is.
    """

    def __init__(self, path: Path, check_open: Callable[[bool], bool]) -> None:
        self._path = lock_path(path)
        self._check_open = check_open
        self._spare: list[int] = []

    def _open(self) -> int:
        return os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)

    def take(self, key: SessionKey) -> tuple[int, int] | None:
        """``Locks.take``."""
        self._check_open(True)
        fd = self._spare.pop() if self._spare else self._open()
        offset = _session_byte(key)
        if _flock(fd, offset, wait=False):
            return fd, offset
        self._spare.append(fd)  # it holds no lock
        return None

    def give_back(self, token: tuple[int, int]) -> None:
        """``Locks.give_back``."""
        fd, offset = token
        if not self._check_open(False) or len(self._spare) >= SPARE_LOCK_FILES or \
                not _flock(fd, offset, wait=False, unlock=True):
            os.close(fd)  # closing the description drops its locks
            return
        self._spare.append(fd)

    def free(self, keys: Iterable[SessionKey], limit: int) -> list[SessionKey]:
        """``Locks.free``."""
        self._check_open(True)
        fd = self._open()
        try:
            out: list[SessionKey] = []
            for key in keys:
                if len(out) >= limit:
                    break
                offset = _session_byte(key)
                if _flock(fd, offset, wait=False):  # free: let go at once
                    _flock(fd, offset, wait=False, unlock=True)
                    out.append(key)
            return out
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the spare descriptions."""
        while self._spare:
            os.close(self._spare.pop())


class SqliteConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` that is also the kit's ``Connection`` (``rows``,
    ``changes``): what local tools get as the raw handle and what the kit's jobs run on."""

    def rows(self, sql: str, params: Sequence[Any] = (), /) -> list[Any]:
        """``Connection.rows``."""
        return self.execute(sql, params).fetchall()

    def changes(self, sql: str, params: Sequence[Any] = (), /) -> int:
        """``Connection.changes``."""
        return self.execute(sql, params).rowcount


class SqliteTransactions:
    """How SQLite's dialects (the file's, memory's) begin, nest and end a transaction: its
    SQL, on the connection (``Dialect.atomic`` and ``SharedWriter``'s calls)."""

    def begin(self, c: sqlite3.Connection) -> None:
        """``SharedWriter.begin``: the write lock at once (``IMMEDIATE``), so a transaction
        never upgrades from reading and fails."""
        c.execute("BEGIN IMMEDIATE")

    def commit(self, c: sqlite3.Connection) -> None:
        """``SharedWriter.commit``."""
        c.execute("COMMIT")

    def rollback(self, c: sqlite3.Connection) -> None:
        """``SharedWriter.rollback``."""
        if c.in_transaction:
            c.execute("ROLLBACK")

    def in_transaction(self, c: sqlite3.Connection) -> bool:
        """``SharedWriter.in_transaction``."""
        return c.in_transaction

    def atomic(self, c: sqlite3.Connection, job: Callable[[Any], T]) -> T:
        """``Dialect.atomic``: ``BEGIN IMMEDIATE`` … ``COMMIT``, or a savepoint inside an
        open transaction. A job that ended the transaction itself (a local tool's
        ``COMMIT``) leaves nothing to release: the caller finds out."""
        if not c.in_transaction:
            c.execute("BEGIN IMMEDIATE")
            try:
                out = job(c)
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
            return out
        c.execute("SAVEPOINT dt_atomic")
        try:
            out = job(c)
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK TO dt_atomic")
                c.execute("RELEASE dt_atomic")
            raise
        if c.in_transaction:
            c.execute("RELEASE dt_atomic")
        return out


def connect(path: Path, busy_timeout: float) -> SqliteConnection:
    """A connection (autocommit, usable from any thread) that waits ``busy_timeout``
    seconds for a lock.

    Raises:
        StoreError: SQLite cannot open the file.
    """
    try:
        conn: SqliteConnection = sqlite3.connect(path, isolation_level=None,
                                                 check_same_thread=False,
                                                 factory=SqliteConnection)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    except sqlite3.Error as e:
        raise StoreError(f"cannot open {path}: {e}") from e
    return conn


def open_writer(path: Path, syntax: Syntax, *, synchronous: str, busy_timeout: float,
                wait: bool, create: bool = False) -> SqliteConnection | None:
    """The writer connection, the database in WAL mode and migrated, under the schema lock.

    Args:
        wait: wait for the schema lock, a busy database and a migration; without it, return
            ``None`` where any of them would make it wait.
        create: make an existing empty (0-byte) file a new store; without it such a file is
            refused (a missing file is always created).

    Raises:
        StoreError: the file is not ours, empty (without ``create``), of a newer schema, or
            SQLite failed.
    """
    if not Path(lock_path(path)).exists():
        # Nothing is created beside a file that is not ours. (Once the lock file exists the
        # file was ours, or is being made ours: the writer looks again under it.)
        try:
            _check_foreign(path, create=create)
        except StoreError:
            # A writer makes the lock file before the database: if the lock file appeared
            # while this looked, the empty or half-made file is another process creating
            # the store, and the look under the lock decides.
            if not Path(lock_path(path)).exists():
                raise
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _flock(fd, _SCHEMA_BYTE, wait=wait) and not wait:
            os.close(fd)
            return None
        # Under the schema lock nobody is half-way through creating the file: an empty one
        # was left so (truncated, made by hand), not being made.
        _check_empty(path, create=create)
        conn = connect(path, busy_timeout if wait else 0)
    except BaseException:
        os.close(fd)
        raise
    try:
        # Again (or first), under the lock: another process may have been half-way through
        # creating the file when this one looked.
        _refuse_foreign(path, conn)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA wal_autocheckpoint = 0")  # checkpoints run off the loop
        if not wait and not _current(conn):
            conn.close()
            return None
        _migrate(path, syntax, conn)
    except sqlite3.Error as e:
        conn.close()
        if not wait and busy(e):
            return None
        raise StoreError(f"cannot use {path} as a durable_turns store: {e}") from e
    except BaseException:
        conn.close()
        raise
    finally:
        os.close(fd)  # drops the schema lock
    return conn


def _check_foreign(path: Path, *, create: bool) -> None:
    """Refuse a file that is not a durable_turns store (or an empty one, unless ``create``),
    looking at it without writing anything, beside it either: ``immutable`` makes SQLite
    take no lock and open no ``-wal`` or ``-shm`` file, even for a database in WAL mode. (It
    reads the main file only: enough for the header and the schema of a database that is
    not ours, which is all this looks at.)"""
    _check_empty(path, create=create)
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        probe = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as e:
        raise StoreError(f"cannot open {path}: {e}") from e
    try:
        _refuse_foreign(path, probe)
    finally:
        probe.close()


def _check_empty(path: Path, *, create: bool) -> None:
    """Refuse an existing empty file unless asked to create a store in it.

    Raises:
        StoreError: it is empty and ``create`` is false.
    """
    if not create and path.exists() and path.is_file() and path.stat().st_size == 0:
        raise StoreError(
            f"{path} is an empty file, not a durable_turns store (a database truncated to "
            "nothing would start over empty): remove it to start a new store there, or open "
            "it with SqliteStore(path, create=True)")


def _refuse_foreign(path: Path, conn: sqlite3.Connection) -> None:
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError as e:
        if busy(e):
            raise  # busy, not foreign: the caller waits or goes to a thread that may
        raise StoreError(
            f"{path} is not a SQLite database or is corrupt ({e}); refusing to use it"
        ) from e
    if app_id != APPLICATION_ID and (app_id != 0 or tables):
        raise StoreError(
            f"{path} is a SQLite database of another application "
            f"(application_id={app_id:#x}, {tables} schema objects); refusing to touch it"
        )
    check_version(version, str(path))


def _current(conn: sqlite3.Connection) -> bool:
    """Whether the database needs no migration."""
    return bool(conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION and
                conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID)


def _migrate(path: Path, syntax: Syntax, conn: SqliteConnection) -> None:
    # A current store needs no write: opening it commits nothing (the schema lock is held, so
    # nobody migrates it meanwhile).
    if _current(conn):
        return
    def job(c: SqliteConnection) -> None:
        upgrade(c, syntax, str(path))  # the version in PRAGMA user_version (Syntax)
        c.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    SqliteTransactions().atomic(conn, job)
