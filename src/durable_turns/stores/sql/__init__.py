"""The public SQL store kit: a SQL backend is a :class:`Dialect` plus its registration.

Everything that decides what a SQL store reads and writes is written here, once:
the statements (:class:`Statements`, run over a two-call :class:`Connection`), the log row's
codec (``sql._log``), the schema and its history (``sql.schema``: one definition, rendered per
dialect, the migrations runner and :func:`upgrade`, which keeps the version where the
dialect says), the write path, the reads and the feed (:class:`SqlStore`), leases for stores
whose locks end with their holder (:class:`LocalLeases` over :class:`Locks`, such as
:class:`ProcessLocks`), and the step links of a dialect with one write connection
(:class:`SharedLink`) and of one whose transactions are calls that take a function
(:class:`CallbackLink`). SQLite, PostgreSQL and the in-memory store are dialects of it
(``stores.sqlite``, ``stores.postgres``, ``stores.memory``); ``durable_turns.cloudflare``'s
store is one written as from outside, on a Durable Object's storage.

A new SQL backend writes one module:

1. a :class:`Connection` over its driver's handle (``rows``, ``changes``);
2. a :class:`Dialect`: its :class:`Syntax`, ``capabilities`` and ``leases``; ``open`` and
   ``close``; ``read`` and ``write``, where jobs run; ``atomic``, its transactions (its SQL or
   its handle's calls: the kit writes no ``BEGIN`` or ``COMMIT``); ``step``, a
   :class:`StepLink` holding a step's transaction across its local tools and its commit
   (:class:`SharedLink` or :class:`CallbackLink` fit most; or its own);
   ``notify``, ``listen`` and ``live``, its wake-ups;
3. ``class MyStore(SqlStore)`` whose ``__init__`` makes the dialect, and a line in
   ``stores.registry`` (or an entry point) for its URL scheme;

then runs ``durable_turns.testing``'s conformance suite (every tier) against it.
"""

from __future__ import annotations

from ._callback import CallbackLink, CallbackWriter
from ._connection import Connection, first
from ._local import RELEASED_KEPT, LocalLeases, Locks, ProcessLocks, SharedLink, SharedWriter
from ._statements import (
    LAST_ROW,
    NEEDS_DRIVING,
    TRANSCRIPT_CHUNK,
    TRANSCRIPT_COPY_BYTES,
    TRANSCRIPT_COPY_ROWS,
    Statements,
    counters,
)
from ._store import (
    Dialect,
    Grant,
    Leases,
    SqlLease,
    SqlStore,
    SqlTransaction,
    StepLink,
    tool_ended_transaction,
)
from .schema import (
    INDEXES,
    MIGRATIONS,
    SCHEMA_VERSION,
    TABLES,
    VERSION_TABLE,
    Column,
    Index,
    Migration,
    Syntax,
    Table,
    check_version,
    create_statements,
    migrate,
    schema_version,
    upgrade,
)

__all__ = [
    "INDEXES",
    "LAST_ROW",
    "MIGRATIONS",
    "NEEDS_DRIVING",
    "RELEASED_KEPT",
    "SCHEMA_VERSION",
    "TABLES",
    "TRANSCRIPT_CHUNK",
    "TRANSCRIPT_COPY_BYTES",
    "TRANSCRIPT_COPY_ROWS",
    "VERSION_TABLE",
    "CallbackLink",
    "CallbackWriter",
    "Column",
    "Connection",
    "Dialect",
    "Grant",
    "Index",
    "Leases",
    "LocalLeases",
    "Locks",
    "Migration",
    "ProcessLocks",
    "SharedLink",
    "SharedWriter",
    "SqlLease",
    "SqlStore",
    "SqlTransaction",
    "Statements",
    "StepLink",
    "Syntax",
    "Table",
    "check_version",
    "counters",
    "create_statements",
    "first",
    "migrate",
    "schema_version",
    "tool_ended_transaction",
    "upgrade",
]
