"""The public SQL store kit: a SQL backend is a :class:`Dialect` plus its registration.

Everything that decides what a SQL store reads and writes is written here, once:
the statements (:class:`Statements`), the log row's codec (``sql.log``), the schema and its
history (``sql.schema``: one definition, rendered per dialect, and the migrations runner),
the write path, the reads and the feed (:class:`SqlStore`), and leases for stores of one
machine (:class:`LocalLeases`). SQLite, PostgreSQL and the in-memory store are dialects of
it (``stores.sqlite``, ``stores.postgres``, ``stores.memory``).

A new SQL backend writes one module:

1. a :class:`Syntax` (placeholders, the begin statement, row locks or serialised
   statements, the schema's types, its lease columns and indexes, the two introspection
   queries the migrations runner asks);
2. a :class:`Dialect`: its connections and where jobs run on them (``read``, ``write``, a
   :class:`StepLink` per step), ``open`` (connect, then ``schema.migrate`` under a lock),
   its :class:`Leases` (:class:`LocalLeases` over OS locks, or row leases with a TTL), its
   wake-ups (``listen``, ``notify``) and its :class:`~durable_turns.stores.StoreCapabilities`;
3. ``class MyStore(SqlStore)`` whose ``__init__`` makes the dialect, and a line in
   ``stores.registry`` (or an entry point) for its URL scheme;

then runs ``durable_turns.testing``'s conformance suite (every tier) against it.
"""

from __future__ import annotations

from .connection import Connection, first
from .local import RELEASED_KEPT, LocalLeases, Locks, ProcessLocks, SharedLink, SharedWriter
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
from .statements import (
    LAST_ROW,
    NEEDS_DRIVING,
    TRANSCRIPT_CHUNK,
    TRANSCRIPT_COPY_ROWS,
    Statements,
    counters,
)
from .store import (
    Dialect,
    Grant,
    Leases,
    SqlLease,
    SqlStore,
    SqlTransaction,
    StepLink,
    tool_ended_transaction,
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
    "TRANSCRIPT_COPY_ROWS",
    "VERSION_TABLE",
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
