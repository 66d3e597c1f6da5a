"""The session store of a Durable Object: its SQLite storage (``ctx.storage``) as a dialect of
the public SQL kit ``durable_turns.stores.sql``, written on the kit's public names only.

- **Statements** go through ``ctx.storage.sql.exec(query, *bindings)``, their values across
  the border as Pyodide hands them (``_values``).
- **Transactions** are the storage's calls, never SQL text (workerd refuses ``BEGIN``):
  ``transactionSync`` for a synchronous job; for a step that runs local tools, one
  ``transaction()`` held across the tools and the step's commit. With the implicit
  transaction alone a tool's writes would commit at the next await, before the step's, and
  a crash between them would run the tool again on replay.
- **The schema's version** lives in a table (``PRAGMA user_version`` is refused).
- **One writer**: a Durable Object has one live instance per id, so a session's lease is a
  lock held in this isolate (``ProcessLocks``) and the epoch fences a step an eviction cut
  off; nothing else shares the storage, so there is nothing to tell another process and no
  lease TTL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import StoreError
from ..records import SessionKey
from ..stores import StoreCapabilities
from ..stores.kit import Feed
from ..stores.sql import LocalLeases, ProcessLocks, SqlStore, Syntax, upgrade
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


class _Connection:
    """The kit's ``Connection`` over ``ctx.storage.sql``."""

    def __init__(self, sql: Any) -> None:
        self.sql = sql

    def rows(self, query: str, params: Sequence[Any] = (), /) -> list[Any]:
        return py_rows(self.sql.exec(query, *map(to_js, params)).raw().toArray())

    def changes(self, query: str, params: Sequence[Any] = (), /) -> int:
        self.sql.exec(query, *map(to_js, params))
        return int(py_rows(self.sql.exec("SELECT changes()").raw().toArray())[0][0])


class _Span:
    """One ``storage.transaction()`` held open across awaits, on a task of its own, whose
    function waits until the step ends it."""

    def __init__(self, storage: Any) -> None:
        loop = asyncio.get_running_loop()
        self._entered: asyncio.Future[None] = loop.create_future()
        self._outcome: asyncio.Future[bool] = loop.create_future()  # True: commit
        self._task = asyncio.ensure_future(self._hold(storage))

    async def _hold(self, storage: Any) -> None:
        body = callback(self._body)
        try:
            await storage.transaction(body)
        finally:
            release(body)

    async def _body(self, txn: Any) -> None:
        self._entered.set_result(None)
        if not await self._outcome:
            txn.rollback()

    async def entered(self) -> None:
        # The task may fail before the body runs (the storage refused the transaction).
        await asyncio.wait([self._task, self._entered], return_when=asyncio.FIRST_COMPLETED)
        if not self._entered.done():
            self._task.result()

    async def end(self, *, commit: bool) -> None:
        if not self._outcome.done():
            self._outcome.set_result(commit)
        await self._task


class _Link:
    """A step's ``StepLink``: the store's write lock from the step's first use to its end,
    and, from its first local tool, one transaction across the tools and the commit."""

    def __init__(self, dialect: _Dialect) -> None:
        self._d = dialect
        self._held = False
        self._span: _Span | None = None

    def connection(self) -> Any:
        return self._d.storage.sql

    async def _hold(self) -> None:
        if not self._held:
            await self._d.write_lock.acquire()
            self._held = True

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        await self._hold()
        if self._span is None:
            self._span = _Span(self._d.storage)
            try:
                await self._span.entered()
            except STORAGE_ERRORS as e:
                self._span = None
                raise StoreError(f"the Durable Object's storage failed: {e}") from e
        storage = self._d.storage
        return self._d.atomic_call(lambda: fn(storage.sql))

    async def commit(self, job: Callable[[Any], None], *,
                     alone: Callable[[Any], None] | None = None) -> None:
        try:
            await self._hold()
            d = self._d
            if self._span is None:
                d.run(alone if alone is not None else lambda c: d.atomic(c, job))
            else:
                span, self._span = self._span, None
                try:
                    d.run(lambda c: d.atomic(c, job))
                except BaseException:
                    await span.end(commit=False)
                    raise
                await span.end(commit=True)
        finally:
            self._let_go()

    async def end(self) -> None:
        try:
            span, self._span = self._span, None
            if span is not None:
                await span.end(commit=False)
        finally:
            self._let_go()

    def _let_go(self) -> None:
        if self._held:
            self._held = False
            self._d.write_lock.release()


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
        self.run(lambda c: self.atomic(c, lambda c: upgrade(c, SYNTAX, "the object's storage")))

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

    def step(self) -> _Link:
        return _Link(self)

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
