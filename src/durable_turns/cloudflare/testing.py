"""A fake of a Durable Object's SQLite storage (``ctx.storage``) for CPython tests, over
``sqlite3``: an agent's Durable Object (:class:`~durable_turns.cloudflare.AgentObject`) and
its store (:class:`~durable_turns.cloudflare.DurableObjectStore`) run on it as on
Cloudflare, and it keeps the rules a store there must live with (as workerd's own source
enforces them), so that what passes here passes on a Durable Object:

- ``sql.exec(query, *bindings)`` runs at once and returns a :class:`Cursor` (iterable rows as
  dicts, ``toArray()``, ``one()``, ``raw()``, ``columnNames``, ``rowsRead``, ``rowsWritten``);
- every statement outside an explicit transaction joins an **implicit transaction that
  commits at the next turn of the event loop** (``loop.call_soon``): a crash before then
  loses it;
- ``transactionSync(fn)``: a savepoint around a synchronous ``fn``; a raise rolls back and
  re-raises; nests. ``transaction(async fn)``: the same across awaits (workerd holds the
  object's input gate meanwhile; the implicit commit waits for it here); ``txn.rollback()``
  undoes it;
- refused, as workerd refuses them (its authorizer): SQL ``BEGIN``, ``COMMIT``, ``ROLLBACK``,
  ``SAVEPOINT``, ``RELEASE``; ``PRAGMA user_version`` and any pragma or function outside an
  allowlist (``sqlite_version()`` is out, ``changes()`` is in); ``ATTACH``; temporary
  objects; names that start ``_cf_``;
- values as Pyodide hands them: numbers are bound as doubles (JavaScript has no other) and
  an integral double comes back as an ``int``; SQL ``NULL`` comes back as JavaScript's
  ``null`` (``pyodide.ffi.jsnull`` there, :data:`JS_NULL` here), not ``None``; a ``None``
  binding is refused (it crosses as ``undefined``, which is no SQL value);
- the limits of a statement: SQL text 100,000 bytes, 100 bindings, a ``LIKE`` pattern 50
  bytes, 100 columns, a value or row 4 MiB;
- one alarm (``setAlarm``, ``getAlarm``, ``deleteAlarm``, times in milliseconds since the
  epoch), kept in the database as workerd keeps it: :meth:`DurableObjectStorage.due` says
  whether it should fire (a test's stand-in for workerd's timer).

Stricter than workerd: one statement per ``exec`` (workerd runs several when the earlier ones
take no bindings). Not modelled: BigInts above 2**53, the output gate (a response waiting
for durability), the KV API.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ._values import JS_NULL, SqlError

__all__ = ["JS_NULL", "Cursor", "DurableObjectState", "DurableObjectStorage", "ObjectNamespace",
           "RawCursor", "SqlError", "SqlStorage", "Transaction"]

T = TypeVar("T")

PRAGMAS = frozenset({"table_info", "table_xinfo", "index_info", "index_list", "index_xinfo",
                     "foreign_key_list", "foreign_keys", "defer_foreign_keys", "quick_check",
                     "integrity_check", "table_list", "optimize"})
"""The pragmas workerd lets through (``user_version`` is not one)."""
FUNCTIONS = frozenset({
    "abs", "avg", "cast", "changes", "char", "coalesce", "count", "date", "datetime",
    "glob", "group_concat", "hex", "ifnull", "iif", "instr", "julianday", "json",
    "json_array", "json_extract", "json_group_array", "json_object", "json_valid", "length",
    "like", "lower", "ltrim", "max", "min", "nullif", "printf", "quote", "random", "replace",
    "round", "rtrim", "strftime", "substr", "substring", "sum", "time", "total", "trim",
    "typeof", "unicode", "upper", "unixepoch",
})
"""The SQL functions the fake lets through (``sqlite_version`` is not one)."""
_TEMP = {sqlite3.SQLITE_CREATE_TEMP_INDEX, sqlite3.SQLITE_CREATE_TEMP_TABLE,
         sqlite3.SQLITE_CREATE_TEMP_TRIGGER, sqlite3.SQLITE_CREATE_TEMP_VIEW}
_NAMED = {sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_CREATE_VIEW,
          sqlite3.SQLITE_CREATE_TRIGGER, sqlite3.SQLITE_DROP_TABLE, sqlite3.SQLITE_DROP_INDEX,
          sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE,
          sqlite3.SQLITE_READ, sqlite3.SQLITE_ALTER_TABLE}
_LIMITS = {sqlite3.SQLITE_LIMIT_SQL_LENGTH: 100_000, sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER: 100,
           sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: 50, sqlite3.SQLITE_LIMIT_COLUMN: 100,
           sqlite3.SQLITE_LIMIT_LENGTH: 4 * 1024 * 1024}


def _js(value: Any) -> Any:
    """A value as it comes back from JavaScript: ``NULL`` is ``null``, an integral double is
    an ``int``."""
    if value is None:
        return JS_NULL
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2 ** 53:
        return int(value)
    return value


def _bound(value: Any) -> Any:
    """A binding as workerd binds it: every number a double, JavaScript's ``null`` as
    ``NULL``.

    Raises:
        SqlError: ``None`` (``undefined`` in JavaScript: no SQL value).
    """
    if value is JS_NULL:
        return None
    if value is None:
        raise SqlError("Wrong type: undefined is not a SQL value (bind null)")
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int):
        return float(value)
    return value


class RawCursor:
    """``cursor.raw()``: the rows as lists."""

    def __init__(self, rows: list[list[Any]]) -> None:
        self._rows = rows

    def __iter__(self) -> Iterator[list[Any]]:
        return iter(self._rows)

    def toArray(self) -> list[list[Any]]:
        """Every row."""
        return list(self._rows)


class Cursor:
    """What ``sql.exec`` returns: the statement has run already."""

    def __init__(self, columns: list[str], rows: list[list[Any]], written: int) -> None:
        self.columnNames = columns
        self._rows = rows
        self.rowsRead = len(rows)
        self.rowsWritten = written

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (dict(zip(self.columnNames, r, strict=True)) for r in self._rows)

    def toArray(self) -> list[dict[str, Any]]:
        """Every row, as an object of its columns (a later column of a name hides an earlier
        one: use :meth:`raw` for rows with repeated names)."""
        return list(self)

    def one(self) -> dict[str, Any]:
        """The one row.

        Raises:
            SqlError: the statement returned no row or more than one.
        """
        if len(self._rows) != 1:
            raise SqlError(f"Expected exactly one result from SQL query, but got "
                           f"{len(self._rows)}.")
        return next(iter(self))

    def raw(self) -> RawCursor:
        """The rows as lists of their columns' values."""
        return RawCursor(self._rows)


class SqlStorage:
    """``ctx.storage.sql``."""

    def __init__(self, storage: DurableObjectStorage) -> None:
        self._storage = storage

    def exec(self, query: str, *bindings: Any) -> Cursor:
        """Run one statement now (in the implicit transaction, unless in an explicit one).

        Raises:
            SqlError: the statement is refused or fails.
        """
        return self._storage.run(query, bindings)


class DurableObjectStorage:
    """``ctx.storage`` of one Durable Object (SQLite-backed), on a file or in memory.

    Args:
        path: the database file (``:memory:``: kept only by this object).
    """

    def __init__(self, path: str = ":memory:") -> None:
        # Statements are not cached, so each is authorised (a cached one would skip it).
        self._conn = sqlite3.connect(path, isolation_level=None, cached_statements=0,
                                     check_same_thread=False)
        for limit, value in _LIMITS.items():
            self._conn.setlimit(limit, value)
        self._refused: str | None = None
        self._internal = False
        self._conn.set_authorizer(self._authorize)
        self._depth = 0  # explicit transactions open (savepoints)
        self._awaiting = 0  # of them, transaction()s open across awaits
        self._implicit = False  # the implicit transaction is open, its commit scheduled
        self.sql = SqlStorage(self)
        """``ctx.storage.sql``."""
        # The alarm lives in the object's database, as workerd keeps it (a restart on the
        # same file finds it); its table's name is one users may not touch.
        self._internal_sql("CREATE TABLE IF NOT EXISTS _cf_alarm (at REAL NOT NULL)")

    # -- the authorizer: what workerd refuses --------------------------------------------

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, db: str | None,
                   trigger: str | None) -> int:
        if self._internal:
            return sqlite3.SQLITE_OK
        refused = None
        if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
            refused = ("To execute a transaction, please use the state.storage.transaction() "
                       "or state.storage.transactionSync() APIs instead of the SQL BEGIN "
                       "TRANSACTION or SAVEPOINT statements.")
        elif action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() not in PRAGMAS:
            refused = f"not authorized to use pragma: {arg1}"
        elif action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in FUNCTIONS:
            refused = f"not authorized to use function: {arg2}"
        elif action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            refused = "not authorized: ATTACH"
        elif action in _TEMP or (db is not None and db == "temp"):
            refused = "not authorized: temporary objects"
        elif action in _NAMED and (arg1 or "").lower().startswith("_cf_"):
            refused = f"not authorized: the name {arg1} is reserved (_cf_)"
        if refused is None:
            return sqlite3.SQLITE_OK
        self._refused = refused
        return sqlite3.SQLITE_DENY

    def _internal_sql(self, sql: str) -> None:
        self._internal = True
        try:
            self._conn.execute(sql)
        finally:
            self._internal = False

    # -- the implicit transaction ---------------------------------------------------------

    def _join(self) -> None:
        """Open the implicit transaction if none is, and schedule its commit for the next
        turn of the event loop."""
        if self._implicit:
            return
        loop = asyncio.get_running_loop()  # a Durable Object always runs on one
        self._internal_sql("BEGIN")
        self._implicit = True
        loop.call_soon(self._commit_implicit)

    def _commit_implicit(self) -> None:
        if not self._implicit:
            return
        if self._awaiting:
            return  # a transaction() holds the gate: its end schedules the commit
        self._implicit = False
        self._internal_sql("COMMIT")

    # -- statements -----------------------------------------------------------------------

    def run(self, query: str, bindings: tuple[Any, ...]) -> Cursor:
        """``sql.exec``.

        Raises:
            SqlError: refused or failed.
        """
        self._join()
        self._refused = None
        before = self._conn.total_changes
        try:
            cur = self._conn.execute(query, tuple(_bound(b) for b in bindings))
            rows = [[_js(v) for v in r] for r in cur.fetchall()]
        except (sqlite3.Error, sqlite3.Warning) as e:
            raise SqlError(self._refused or str(e)) from None
        columns = [d[0] for d in cur.description or ()]
        return Cursor(columns, rows, self._conn.total_changes - before)

    # -- explicit transactions ------------------------------------------------------------

    def transactionSync(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` in a savepoint: its writes undone if it raises (then re-raised);
        nests.

        Raises:
            TypeError: ``fn`` returned an awaitable (it must be synchronous).
        """
        name = self._open()
        try:
            out = fn()
            if isinstance(out, Awaitable):
                if isinstance(out, Coroutine):
                    out.close()
                raise TypeError("transactionSync() needs a synchronous function")
        except BaseException:
            self._close(name, undo=True)
            raise
        self._close(name, undo=False)
        return out

    async def transaction(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        """Run ``await fn(txn)`` in a savepoint held across its awaits (no implicit commit
        meanwhile); a raise, or ``txn.rollback()``, undoes its writes."""
        name = self._open()
        self._awaiting += 1
        txn = Transaction()
        try:
            out = await fn(txn)
        except BaseException:
            self._awaiting -= 1
            self._close(name, undo=True)
            self._reschedule()
            raise
        self._awaiting -= 1
        self._close(name, undo=txn.rolled_back)
        self._reschedule()
        return out

    def _open(self) -> str:
        self._join()
        self._depth += 1
        name = f"_cf_savepoint_{self._depth}"
        self._internal_sql(f"SAVEPOINT {name}")
        return name

    def _close(self, name: str, *, undo: bool) -> None:
        self._depth -= 1
        if undo:
            self._internal_sql(f"ROLLBACK TO {name}")
        self._internal_sql(f"RELEASE {name}")

    def _reschedule(self) -> None:
        if self._implicit and not self._awaiting:
            asyncio.get_running_loop().call_soon(self._commit_implicit)

    # -- the alarm ------------------------------------------------------------------------

    async def getAlarm(self) -> Any:
        """When the alarm fires (milliseconds since the epoch), or ``null``."""
        found = self._alarm()
        return JS_NULL if found is None else _js(found)

    async def setAlarm(self, scheduled: float) -> None:
        """Set the object's one alarm to ``scheduled`` (milliseconds since the epoch),
        replacing any other."""
        self._internal_sql("DELETE FROM _cf_alarm")
        self._internal = True
        try:
            self._conn.execute("INSERT INTO _cf_alarm (at) VALUES (?)", (float(scheduled),))
        finally:
            self._internal = False

    async def deleteAlarm(self) -> None:
        """Remove the alarm, if one is set."""
        self._internal_sql("DELETE FROM _cf_alarm")

    def due(self, now_ms: float) -> bool:
        """Whether the alarm is set for ``now_ms`` or earlier (what workerd's timer decides);
        the test that fires it then calls the object's ``alarm()``, after which the alarm is
        no longer set unless ``alarm()`` set it again (:meth:`fired`)."""
        found = self._alarm()
        return found is not None and found <= now_ms

    def fired(self, at: float) -> None:
        """The alarm set for ``at`` ran to its end: it is removed, unless it was set anew."""
        self._internal = True
        try:
            self._conn.execute("DELETE FROM _cf_alarm WHERE at = ?", (float(at),))
        finally:
            self._internal = False

    def _alarm(self) -> float | None:
        self._internal = True
        try:
            row = self._conn.execute("SELECT at FROM _cf_alarm").fetchone()
        finally:
            self._internal = False
        return None if row is None else float(row[0])

    def close(self) -> None:
        """Close the file (what the process's end does: an open implicit transaction is
        lost)."""
        self._conn.close()


class Transaction:
    """The ``txn`` a :meth:`DurableObjectStorage.transaction` function gets."""

    def __init__(self) -> None:
        self.rolled_back = False

    def rollback(self) -> None:
        """Undo the transaction's writes when the function returns."""
        self.rolled_back = True


class DurableObjectState:
    """An object's ``ctx``: its storage, its id, ``blockConcurrencyWhile`` and ``waitUntil``.

    Args:
        storage: the object's storage.
        name: the name its id was made from.
    """

    def __init__(self, storage: DurableObjectStorage, name: str = "object") -> None:
        self.storage = storage
        self.id = name
        self._kept: set[asyncio.Future[Any]] = set()

    def blockConcurrencyWhile(self, fn: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        """Run ``fn()`` now (the object's requests wait for what it opens)."""
        return self._keep(asyncio.ensure_future(fn()))

    def waitUntil(self, work: Awaitable[Any]) -> None:
        """Keep ``work`` running after the response."""
        self._keep(asyncio.ensure_future(work))

    def _keep(self, future: asyncio.Future[T]) -> asyncio.Future[T]:
        self._kept.add(future)
        future.add_done_callback(self._kept.discard)
        return future


class ObjectNamespace:
    """A Durable Object binding (``env.AGENTS``) in CPython: one live instance per name,
    made on first use from ``make(ctx, env)``, on a storage of its own (a file in
    ``folder``, or in memory) that an eviction keeps.

    Args:
        make: the object class (``AgentObject``'s subclass), or any ``(ctx, env)`` factory.
        env: what the objects get as ``env``.
        folder: where each object's database file lives (``None``: in memory).
    """

    def __init__(self, make: Callable[[DurableObjectState, Any], Any], env: Any = None, *,
                 folder: Path | None = None) -> None:
        self._make = make
        self._env = env
        self._folder = folder
        self._storages: dict[str, DurableObjectStorage] = {}
        self._live: dict[str, Any] = {}

    def idFromName(self, name: str) -> str:
        """The id of the object named ``name`` (here: the name)."""
        return name

    def get(self, object_id: str) -> Any:
        """The object's live instance (made now if it has none)."""
        found = self._live.get(object_id)
        if found is None:
            storage = self._storages.get(object_id)
            if storage is None:
                path = ":memory:" if self._folder is None else str(
                    self._folder / f"{len(self._storages)}.sqlite")
                storage = self._storages[object_id] = DurableObjectStorage(path)
            found = self._live[object_id] = self._make(DurableObjectState(storage, object_id),
                                                       self._env)
        return found

    def storage(self, object_id: str) -> DurableObjectStorage:
        """The object's storage.

        Raises:
            KeyError: no object of that id was made.
        """
        return self._storages[object_id]

    def evict(self, object_id: str) -> None:
        """Forget the live instance (its storage stays): the next request makes a new one.
        The old one's tasks are not stopped (a test that evicts waits for them or closes
        its runtime first)."""
        self._live.pop(object_id, None)
