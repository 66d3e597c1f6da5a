"""F1: a store written as a third party would write it: a Cloudflare Durable Object's SQLite
storage (here :mod:`fake_do_storage`, which keeps its rules) as a dialect of the public SQL
kit ``durable_turns.stores.sql``. It imports public names of the kit only.

What it had to write: a :class:`~durable_turns.stores.sql.Connection` over ``sql.exec`` (a
few lines), a :class:`~durable_turns.stores.sql.Dialect` (its SQL, its transactions as
``transactionSync`` and ``transaction`` calls, its leases, nothing to tell other processes),
and the store class. Its step link is the kit's
:class:`~durable_turns.stores.sql.CallbackLink`: one ``transaction()`` held across a step's
local tools and its commit (with the implicit transaction alone, a tool's writes would commit
at the next await, before the step's, and a crash between them would run the tool again).

A Durable Object has one live instance per object id, so its sessions' leases are a set held
in this process (``ProcessLocks``), and nothing else shares its storage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from durable_turns.errors import StoreError
from durable_turns.records import SessionKey
from durable_turns.stores import StoreCapabilities
from durable_turns.stores.kit import Feed
from durable_turns.stores.sql import (
    CallbackLink,
    LocalLeases,
    ProcessLocks,
    SqlStore,
    Syntax,
    upgrade,
)
from fake_do_storage import DurableObjectStorage, SqlError, SqlStorage

__all__ = ["DoConnection", "DoDialect", "DoStore"]

T = TypeVar("T")

SYNTAX = Syntax(
    serialised=True,  # one instance, one thread: a statement is atomic on its own
    lookup_hint=" INDEXED BY log_lookup",
    keyed_suffix=" WITHOUT ROWID",
    columns_query="SELECT m.name, p.name FROM sqlite_master m "
                  "JOIN pragma_table_info(m.name) p WHERE m.type = 'table'",
    indexes_query="SELECT name FROM sqlite_master WHERE type = 'index'",
    user_version=False,  # PRAGMA user_version is refused: the version lives in a table
)


class DoConnection:
    """The kit's ``Connection`` over ``ctx.storage.sql``."""

    def __init__(self, sql: SqlStorage) -> None:
        self.sql = sql

    def rows(self, query: str, params: Sequence[Any] = (), /) -> list[Any]:
        return self.sql.exec(query, *params).raw().toArray()

    def changes(self, query: str, params: Sequence[Any] = (), /) -> int:
        self.sql.exec(query, *params)
        return int(self.sql.exec("SELECT changes()").raw().toArray()[0][0])


class DoDialect:
    """A Durable Object's SQLite storage as a dialect of the SQL kit (and the kit's
    ``CallbackWriter``, for its step link).

    Args:
        storage: ``ctx.storage``.
    """

    syntax = SYNTAX
    capabilities = StoreCapabilities(durable=True, shared_by="process",
                                     exactly_once_local=True, paramstyle="qmark")
    live = None  # nothing else shares the object's storage
    signals = None  # one isolate: nothing can cancel while a step runs a (synchronous) tool

    def __init__(self, storage: DurableObjectStorage) -> None:
        self.storage = storage
        self.conn = DoConnection(storage.sql)
        self.leases = LocalLeases(ProcessLocks())  # one live instance per object
        self.write_lock = asyncio.Lock()
        """Held by a step from its first use of the storage to its commit's end, and by
        each write: nobody's statement lands in another's transaction."""

    def run(self, job: Callable[[DoConnection], T]) -> T:
        try:
            return job(self.conn)
        except SqlError as e:
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
        return self.storage.transactionSync(lambda: job(c))

    def transaction(self, job: Callable[[], Awaitable[None]]) -> Awaitable[None]:
        return self.storage.transaction(lambda txn: job())

    def writer(self) -> SqlStorage:
        return self.storage.sql

    def step(self) -> CallbackLink:
        return CallbackLink(self)

    def notify(self, c: Any, key: SessionKey, seq: int | None,
               live: Sequence[str] = ()) -> None:
        return None  # every commit is this instance's: the store publishes it

    def listen(self, feed: Feed) -> None:
        return None


class DoStore(SqlStore):
    """A session store in a Durable Object's SQLite storage.

    Args:
        storage: ``ctx.storage``.
    """

    dialect: DoDialect

    def __init__(self, storage: DurableObjectStorage) -> None:
        super().__init__(DoDialect(storage))

    def unwrap(self) -> SqlStorage:
        """``ctx.storage.sql``: what local tools write through (``exec(sql, *bindings)``)."""
        return self.dialect.storage.sql
