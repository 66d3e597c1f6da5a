"""The session store of a Durable Object: its SQLite storage (``ctx.storage``) as a dialect of
the public SQL kit ``durable_turns.stores.sql``, written on the kit's public names only.

- **Statements** go through ``ctx.storage.sql.exec(query, *bindings)``, their values across
  the border as Pyodide hands them (``_values``).
- **Transactions** are the storage's calls, never SQL text (workerd refuses ``BEGIN``):
  ``transactionSync`` for a synchronous job; for a step that runs local tools, one
  ``transaction()`` held across the tools and the step's commit (the kit's
  ``CallbackLink``). With the implicit
  transaction alone a tool's writes would commit at the next await, before the step's, and
  a crash between them would run the tool again on replay.
- **The schema's version** lives in a table (``PRAGMA user_version`` is refused).
- **Values over a row's limit** (workerd refuses a value or row over 4 MiB): a text value
  whose UTF-8 is over :data:`PART_BYTES` is written as parts of ``dt_parts`` rows and its
  column holds a reference to them (``_Connection``), in the statement's own transaction, so
  a commit with one 5 MB tool result stays one commit; a read joins the parts back. A value
  that looks like a reference is stored as parts too, so every reference read is one.
- **One writer**: a Durable Object has one live instance per id, so a session's lease is a
  lock held in this isolate (``ProcessLocks``) and the epoch fences a step an eviction cut
  off; nothing else shares the storage, so there is nothing to tell another process and no
  lease TTL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ..errors import StoreError
from ..records import SessionKey
from ..stores import StoreCapabilities
from ..stores.kit import Feed
from ..stores.sql import CallbackLink, LocalLeases, ProcessLocks, SqlStore, Syntax, upgrade
from ._values import STORAGE_ERRORS, callback, release, to_js
from ._values import rows as py_rows

__all__ = ["DurableObjectStore"]

T = TypeVar("T")

SYNTAX = Syntax(
    serialised=True,  # one instance, one thread: a statement is atomic on its own
    lookup_hint=" INDEXED BY log_lookup",
    keyed_suffix=" WITHOUT ROWID",
    # workerd's own tables (_cf_KV, the alarm's) are not the store's, and not ours to read
    columns_query="SELECT m.name, p.name FROM sqlite_master m "
                  "JOIN pragma_table_info(m.name) p WHERE m.type = 'table' "
                  "AND substr(m.name, 1, 4) != '_cf_'",
    indexes_query="SELECT name FROM sqlite_master WHERE type = 'index'",
    user_version=False,  # PRAGMA user_version is refused: the version lives in a table
)


PART_BYTES = 1 << 20
"""The most UTF-8 bytes of a text value kept in its own column; a longer one is written as
``dt_parts`` rows of at most this many bytes each (a row of the store then stays within
workerd's 4 MiB: none has more than three columns that can be long)."""
_PART_CHARS = PART_BYTES // 4  # a character is at most 4 bytes of UTF-8
_REF = "\x01dt-parts:"  # never the start of JSON, which escapes control characters
PARTS_TABLE = ("CREATE TABLE IF NOT EXISTS dt_parts (id INTEGER NOT NULL, part INTEGER "
               "NOT NULL, data TEXT NOT NULL, PRIMARY KEY (id, part)) WITHOUT ROWID")
"""The table of long values' parts (made at open, beside the kit's schema)."""


class _Connection:
    """The kit's ``Connection`` over ``ctx.storage.sql``; long text values go to parts."""

    def __init__(self, sql: Any) -> None:
        self.sql = sql

    def _exec(self, query: str, params: Sequence[Any]) -> Any:
        return self.sql.exec(query, *[to_js(self._bound(v)) for v in params])

    def _bound(self, value: Any) -> Any:
        """``value``, or a reference to the parts it was written as (see the module)."""
        if not isinstance(value, str) or not (
                (len(value) > _PART_CHARS and len(value.encode()) > PART_BYTES)
                or value.startswith(_REF)):
            return value
        ident = int(py_rows(self.sql.exec(
            "SELECT coalesce(max(id), 0) + 1 FROM dt_parts").raw().toArray())[0][0])
        pieces = [value[i:i + _PART_CHARS] for i in range(0, len(value), _PART_CHARS)]
        for k, piece in enumerate(pieces):
            self.sql.exec("INSERT INTO dt_parts (id, part, data) VALUES (?, ?, ?)",
                          ident, k, piece)
        return f"{_REF}{ident}"

    def _joined(self, found: list[list[Any]]) -> list[list[Any]]:
        for row in found:
            for i, v in enumerate(row):
                if isinstance(v, str) and v.startswith(_REF):
                    row[i] = "".join(str(p[0]) for p in py_rows(self.sql.exec(
                        "SELECT data FROM dt_parts WHERE id = ? ORDER BY part",
                        int(v[len(_REF):])).raw().toArray()))
        return found

    def rows(self, query: str, params: Sequence[Any] = (), /) -> list[Any]:
        return self._joined(py_rows(self._exec(query, params).raw().toArray()))

    def changes(self, query: str, params: Sequence[Any] = (), /) -> int:
        self._exec(query, params)
        return int(py_rows(self.sql.exec("SELECT changes()").raw().toArray())[0][0])


class _Dialect:
    """A Durable Object's SQLite storage as a dialect of the SQL kit."""

    syntax = SYNTAX
    capabilities = StoreCapabilities(durable=True, shared_by="process",
                                     exactly_once_local=True, paramstyle="qmark")
    live = None  # nothing else shares the object's storage
    signals = None  # one isolate: nothing can cancel while a step runs a (synchronous) tool

    def __init__(self, storage: Any) -> None:
        self.storage = storage
        self.conn = _Connection(storage.sql)
        self.leases = LocalLeases(ProcessLocks())  # one live instance per object
        self.write_lock = asyncio.Lock()
        """Held by a step from its first use of the storage to its commit's end, and by
        each write: nobody's statement lands in another's transaction."""

    def run(self, job: Callable[[_Connection], T]) -> T:
        try:
            return job(self.conn)
        except STORAGE_ERRORS as e:
            raise StoreError(f"the Durable Object's storage failed: {e}") from e

    async def open(self, store: SqlStore) -> None:
        def job(c: _Connection) -> None:
            upgrade(c, SYNTAX, "the object's storage")
            c.sql.exec(PARTS_TABLE)

        self.run(lambda c: self.atomic(c, job))

    async def close(self) -> None:
        return None  # the storage is the object's: it stays

    async def read(self, job: Callable[[Any], T]) -> T:
        return self.run(job)

    async def write(self, job: Callable[[Any], T], *,
                    waiting: Callable[[Any], T] | None = None) -> T:
        async with self.write_lock:
            return self.run(job)

    def atomic(self, c: Any, job: Callable[[Any], T]) -> T:
        return self.atomic_call(lambda: job(c))

    def atomic_call(self, fn: Callable[[], T]) -> T:
        """``fn()`` inside ``transactionSync``: undone if it raises."""
        return self.storage.transactionSync(fn)  # type: ignore[no-any-return]

    def writer(self) -> Any:
        return self.storage.sql

    async def transaction(self, job: Callable[[], Awaitable[bool]]) -> None:
        """``storage.transaction()`` held across ``job``'s awaits: rolled back unless it
        returns true (by ``txn.rollback()``: a rejection crossing into JavaScript with no
        reason takes the isolate down)."""
        async def body(txn: Any) -> None:
            if not await job():
                txn.rollback()
        fn = callback(body)
        try:
            await self.storage.transaction(fn)
        except STORAGE_ERRORS as e:
            raise StoreError(f"the Durable Object's storage failed: {e}") from e
        finally:
            release(fn)

    def step(self) -> CallbackLink:
        return CallbackLink(self)

    def notify(self, c: Any, key: SessionKey, seq: int | None,
               live: Sequence[str] = ()) -> None:
        return None  # every commit is this instance's: the store publishes it

    def listen(self, feed: Feed) -> None:
        return None


class DurableObjectStore(SqlStore):
    """A session store in a Durable Object's SQLite storage (one object, one writer).

    It declares ``durable`` and ``exactly_once_local`` (a local tool writes through
    :meth:`unwrap` inside its step's transaction), ``shared_by="process"`` and no lease TTL:
    the object is its sessions' single writer.

    Args:
        storage: the object's ``ctx.storage`` (or
            :class:`durable_turns.cloudflare.testing.DurableObjectStorage`, its fake).
    """

    dialect: _Dialect

    def __init__(self, storage: Any) -> None:
        super().__init__(_Dialect(storage))

    def unwrap(self) -> Any:
        """``ctx.storage.sql``: what local tools write through (``exec(sql, *bindings)``;
        bind ``None`` as ``pyodide.ffi.jsnull`` there)."""
        return self.dialect.storage.sql
