"""The SQL stores' schema, written once: the tables, the indexes and their history, rendered
for each dialect (its column types, its keyed tables) and brought up to date by one runner.

The tables (see ``statements`` for what each statement does with them, ``log`` for a log
row's columns)::

    sessions (sid, agent, session, status, generation, epoch, owner)
    turns    (ordinal, sid, turn_id, kind, status, opening, event, policy, request,
              text, error, reason, cancel, data, deliver)     -- the chain
    log      (sid, seq, sub, gen, n, turn_id, body, step, memo, events)
                                  -- one append-only row per step
    log_transcript (sid, gen, n, seq, body)
                                  -- the log's messages again, many per row
    timers   (sid, id, due, kind, turn_id, input_id, claimed_until)
                                  -- wake-ups: a sleep's end, a deadline, a reminder
    schedules (name, agent, next_fire, claimed_until, claimed_by, body)
                                  -- F24's schedules (``sql._schedules``)

A dialect may add columns to ``sessions`` (PostgreSQL's row lease: ``lease_until``,
``lease_owner``) and indexes of its own (:class:`Syntax`).

**History.** A new database is created at :data:`SCHEMA_VERSION` from the definitions
below. An older one runs the :data:`MIGRATIONS` after its version, in its open's transaction.
A migration *adds what an older database lacks*: a column or an index is added only where
the database has none of that name (the runner asks the database what it has), so the one
history serves every dialect, although their first versions differed (SQLite's version 1
had no ``epoch`` or ``data``; PostgreSQL's had them, and got its lease owner and an index in
version 2). Migrations only add; rows are moved, never lost (version 3 moves the three tables
of version 2 into ``log``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...errors import StoreError
from ._connection import Connection
from ._log import LEGACY_TO_LOG, LOOKED_UP

__all__ = [
    "INDEXES",
    "MIGRATIONS",
    "OPEN",
    "SCHEMA_VERSION",
    "TABLES",
    "VERSION_TABLE",
    "Column",
    "Index",
    "Migration",
    "Syntax",
    "Table",
    "check_version",
    "create_statements",
    "migrate",
    "schema_version",
    "upgrade",
]


@dataclass(frozen=True, slots=True)
class Column:
    """A column, in the schema's own types: ``id`` (the table's auto-numbered key), ``int``,
    ``bigint``, ``text``, ``time`` (a timestamp with its zone)."""

    name: str
    type: str
    not_null: bool = False
    default: str | None = None
    """A SQL literal."""
    references: str | None = None
    """``table (column)``, rendered where the dialect keeps foreign keys."""


@dataclass(frozen=True, slots=True)
class Table:
    """A table: its columns, and a primary key of several columns (a keyed table) or none
    (its ``id`` column is the key)."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    unique: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class Index:
    """An index; partial with ``where``."""

    name: str
    table: str
    columns: str
    where: str | None = None


@dataclass(frozen=True, slots=True)
class Syntax:
    """Where a dialect's SQL differs, as data (what differs in behaviour is the dialect's).

    Statements are written with ``?`` placeholders and rewritten once to ``placeholder``;
    a parameter tested for NULL is cast, which PostgreSQL needs to know its type. Both
    dialects shipped take ``INSERT … ON CONFLICT … DO NOTHING RETURNING`` and partial indexes.
    Transaction control is not here: it is the dialect's (``Dialect.atomic``).
    """

    placeholder: str = "?"
    lock_rows: bool = False
    """Transactions do not serialise writers (PostgreSQL): every write locks its session's row
    first (``FOR UPDATE``), so the chain's rules and the fencing check see no concurrent
    writer of the session."""
    serialised: bool = False
    """One statement at a time writes (SQLite): a statement that reads and then writes is
    atomic on its own, so the common step, the common accept and a repeated claim are one
    statement each, outside any transaction."""
    contains: str = "instr({text}, {part}) > 0"
    """Whether the text ``{text}`` holds ``{part}`` as a substring (PostgreSQL:
    ``strpos``)."""
    lookup_hint: str = ""
    """How a planner without statistics is told to use ``log_lookup`` (SQLite:
    ``INDEXED BY``)."""
    types: Mapping[str, str] = field(default_factory=lambda: {
        "id": "INTEGER PRIMARY KEY", "int": "INTEGER", "bigint": "INTEGER", "text": "TEXT",
        "time": "TEXT"})
    """The schema's types in the dialect's words."""
    keyed_suffix: str = ""
    """After a keyed table's definition (SQLite: ``WITHOUT ROWID``)."""
    foreign_keys: bool = False
    session_columns: tuple[Column, ...] = ()
    """The dialect's own columns of ``sessions`` (its lease's)."""
    indexes: tuple[Index, ...] = ()
    """The dialect's own indexes."""
    columns_query: str = ""
    """``(table, column)`` of every column the database has."""
    indexes_query: str = ""
    """The name of every index the database has."""
    user_version: bool = False
    """Where the schema's version is kept (:func:`upgrade`): ``PRAGMA user_version`` (SQLite's
    file header); else a table of one row, :data:`VERSION_TABLE` (PostgreSQL, and a backend
    that refuses the pragma, such as a Durable Object's SQLite)."""


OPEN = "('queued', 'running', 'suspended')"
"""The statuses of a chain entry that is not over (in SQL)."""

TABLES: tuple[Table, ...] = (
    Table("sessions", (
        Column("sid", "id"),
        Column("agent", "text", not_null=True),
        Column("session", "text", not_null=True),
        Column("status", "text", not_null=True, default="'new'"),
        Column("generation", "int", not_null=True, default="0"),
        Column("epoch", "bigint", not_null=True, default="0"),
        Column("owner", "text"),
    ), unique=(("agent", "session"),)),
    Table("turns", (
        Column("ordinal", "id"),
        Column("sid", "bigint", not_null=True, references="sessions (sid)"),
        Column("turn_id", "text", not_null=True),
        Column("kind", "text", not_null=True, default="'turn'"),
        Column("status", "text", not_null=True),
        Column("opening", "text", not_null=True),
        *(Column(name, "text") for name in ("event", "policy", "request", "text", "error",
                                            "reason", "cancel", "data", "deliver")),
    ), unique=(("sid", "turn_id"),)),
    Table("log", (
        Column("sid", "bigint", not_null=True),
        Column("seq", "bigint", not_null=True),
        Column("sub", "int", not_null=True),
        Column("gen", "int", not_null=True),
        Column("n", "int", not_null=True),
        *(Column(name, "text") for name in ("turn_id", "body", "step", "memo", "events")),
    ), key=("sid", "seq", "sub")),
    Table("log_transcript", (
        Column("sid", "bigint", not_null=True),
        Column("gen", "int", not_null=True),
        Column("n", "int", not_null=True),
        Column("seq", "bigint", not_null=True),
        Column("body", "text", not_null=True),
    ), key=("sid", "gen", "n")),
    Table("timers", (
        Column("sid", "bigint", not_null=True),
        Column("id", "text", not_null=True),
        Column("due", "bigint", not_null=True),
        Column("kind", "text", not_null=True),
        Column("turn_id", "text", not_null=True),
        Column("input_id", "text", not_null=True),
        Column("claimed_until", "bigint"),
    ), key=("sid", "id")),
    Table("schedules", (
        Column("name", "text", not_null=True),
        Column("agent", "text", not_null=True),
        Column("next_fire", "bigint"),
        Column("claimed_until", "bigint"),
        Column("claimed_by", "text"),
        Column("body", "text", not_null=True),
    ), key=("name",)),
)
"""The tables, as a new database gets them."""

INDEXES: tuple[Index, ...] = (
    Index("turns_open", "turns", "sid", f"status IN {OPEN}"),
    Index("log_lookup", "log", "sid, gen, step", LOOKED_UP),
    # Only the entries whose delivery is owed: settling one takes it out of the index.
    Index("turns_owed", "turns", "deliver, ordinal", "deliver IS NOT NULL"),
    Index("timers_due", "timers", "due"),
    # Only the schedules that will fire again, by their next time (a claim's scan).
    Index("schedules_due", "schedules", "next_fire", "next_fire IS NOT NULL"),
)
"""The indexes every dialect has."""


@dataclass(frozen=True, slots=True)
class Migration:
    """What a version adds to a database of the version before (each part only where the
    database lacks it), then the statements that move its rows."""

    version: int
    columns: tuple[str, ...] = ()
    """``table.column`` of :data:`TABLES` to add."""
    tables: tuple[str, ...] = ()
    """Tables of :data:`TABLES` to create."""
    indexes: tuple[str, ...] = ()
    """Indexes of :data:`INDEXES` to create."""
    dialect_parts: bool = False
    """Also add the dialect's own ``sessions`` columns and indexes it lacks."""
    statements: tuple[str, ...] = ()


MIGRATIONS: tuple[Migration, ...] = (
    # 2: the fencing epoch and turn data (SQLite's version 1 lacked them), the dialect's lease
    # columns and indexes (PostgreSQL's version 1 lacked its lease owner and the index of its
    # workers' claims).
    Migration(2, columns=("sessions.epoch", "turns.data"), dialect_parts=True),
    # 3: one append-only row per step (see ``log``); the rows of the three tables before it
    # are moved into it.
    Migration(3, tables=("log",), indexes=("log_lookup",), statements=tuple(LEGACY_TO_LOG)),
    # 4: the log's messages again, many per row (see ``statements``), filled from the next
    # commit that moves a session's chain.
    Migration(4, tables=("log_transcript",)),
    # 5: the channel that owes an entry a delivery, and the index of the owed ones.
    Migration(5, columns=("turns.deliver",), indexes=("turns_owed",)),
    # 6: the principal that owns a session (sessions made before it have none).
    Migration(6, columns=("sessions.owner",)),
    # 7: wake-ups (F24): a sleep's end, a request's deadline and reminders, one row each
    # (``due`` and ``claimed_until`` in milliseconds since the epoch).
    Migration(7, tables=("timers",), indexes=("timers_due",)),
    # 8: schedules (F24): each a row, its next fire time and the claim of the worker firing
    # it (``sql._schedules``).
    Migration(8, tables=("schedules",), indexes=("schedules_due",)),
    # 9: an owner is an identity qualified by where it was verified (``http:alice``); every
    # owner before it was an HTTP host's principal.
    Migration(9, statements=(
        "UPDATE sessions SET owner = 'http:' || owner WHERE owner IS NOT NULL",)),
)
"""Append-only: a database of version ``v`` runs every migration after ``v``."""

SCHEMA_VERSION = MIGRATIONS[-1].version
"""The version a database has once opened by this code."""


def _column(c: Column, syntax: Syntax) -> str:
    out = f"{c.name} {syntax.types[c.type]}"
    if c.not_null:
        out += " NOT NULL"
    if c.default is not None:
        out += f" DEFAULT {c.default}"
    if c.references is not None and syntax.foreign_keys:
        out += f" REFERENCES {c.references}"
    return out


def _columns(table: Table, syntax: Syntax) -> tuple[Column, ...]:
    return table.columns + (syntax.session_columns if table.name == "sessions" else ())


def _create_table(table: Table, syntax: Syntax) -> str:
    parts = [_column(c, syntax) for c in _columns(table, syntax)]
    if table.key:
        parts.append(f"PRIMARY KEY ({', '.join(table.key)})")
    parts += [f"UNIQUE ({', '.join(u)})" for u in table.unique]
    body = ",\n    ".join(parts)
    return f"CREATE TABLE {table.name} (\n    {body}\n){syntax.keyed_suffix if table.key else ''}"


def _create_index(index: Index) -> str:
    where = "" if index.where is None else f" WHERE {index.where}"
    return f"CREATE INDEX {index.name} ON {index.table} ({index.columns}){where}"


def create_statements(syntax: Syntax) -> list[str]:
    """The statements that create a new database at :data:`SCHEMA_VERSION` in a dialect."""
    return ([_create_table(t, syntax) for t in TABLES]
            + [_create_index(i) for i in (*INDEXES, *syntax.indexes)])


def _table(name: str) -> Table:
    return next(t for t in TABLES if t.name == name)


def _index(name: str) -> Index:
    return next(i for i in INDEXES if i.name == name)


def _migration_statements(m: Migration, syntax: Syntax, has: set[str]) -> list[str]:
    """What migration ``m`` runs on a database that has the columns (``table.column``) and
    indexes named in ``has``."""
    out: list[str] = []
    wanted: list[tuple[str, Column]] = []
    for name in m.columns:
        table, _, column = name.partition(".")
        wanted.append((table, next(c for c in _table(table).columns if c.name == column)))
    if m.dialect_parts:
        wanted += [("sessions", c) for c in syntax.session_columns]
    for table, c in wanted:
        if f"{table}.{c.name}" not in has:
            out.append(f"ALTER TABLE {table} ADD COLUMN {_column(c, syntax)}")
    out += [_create_table(_table(t), syntax) for t in m.tables]
    indexes = [_index(i) for i in m.indexes] + list(syntax.indexes if m.dialect_parts else ())
    out += [_create_index(i) for i in indexes if i.name not in has]
    return out + list(m.statements)


VERSION_TABLE = "durable_turns_schema"
"""The table of one row (``version``) that holds the schema's version where the dialect does
not keep it in ``PRAGMA user_version`` (``Syntax.user_version``)."""


def schema_version(c: Connection, syntax: Syntax) -> int:
    """The database's schema version (0: a new database), read where the dialect keeps it;
    the version table is made, empty, if missing (so: inside a write transaction)."""
    if syntax.user_version:
        return int(c.rows("PRAGMA user_version")[0][0])
    c.changes(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER NOT NULL)")
    rows = c.rows(f"SELECT version FROM {VERSION_TABLE}")
    return int(rows[0][0]) if rows else 0


def upgrade(c: Connection, syntax: Syntax, where: str) -> bool:
    """Bring the database to :data:`SCHEMA_VERSION` and record it, where the dialect keeps
    it (``Syntax.user_version``): what a dialect's ``open`` runs, inside one transaction
    (``Dialect.atomic``) under its migration lock.

    Args:
        c: a connection of the dialect, in a write transaction.
        syntax: the dialect's.
        where: the database, as an error names it.

    Returns:
        Whether anything was run (``False``: the database was current).

    Raises:
        StoreError: the database is of a newer version than this code knows.
    """
    version = schema_version(c, syntax)
    if not migrate(c, syntax, version, where):
        return False
    if syntax.user_version:
        c.changes(f"PRAGMA user_version = {SCHEMA_VERSION}")
    elif version == 0:
        c.changes(_q(syntax, f"INSERT INTO {VERSION_TABLE} (version) VALUES (?)"),
                  (SCHEMA_VERSION,))
    else:
        c.changes(_q(syntax, f"UPDATE {VERSION_TABLE} SET version = ?"),
                  (SCHEMA_VERSION,))
    return True


def _q(syntax: Syntax, sql: str) -> str:
    """``sql`` with its ``?`` placeholders in the dialect's."""
    return sql if syntax.placeholder == "?" else sql.replace("?", syntax.placeholder)


def migrate(c: Connection, syntax: Syntax, version: int, where: str) -> bool:
    """Bring a database of schema ``version`` (0: empty) to :data:`SCHEMA_VERSION`, inside the
    caller's transaction, which records the new version (:func:`upgrade` does both).

    Args:
        c: a connection in a transaction that holds the dialect's migration lock.
        syntax: the dialect's.
        version: the database's version now.
        where: the database, as an error names it.

    Returns:
        Whether anything was run (``False``: the database was current).

    Raises:
        StoreError: the database is of a newer version than this code knows.
    """
    check_version(version, where)
    if version == SCHEMA_VERSION:
        return False
    if version == 0:
        for sql in create_statements(syntax):
            c.changes(sql)
        return True
    for m in MIGRATIONS:
        if m.version > version:
            for sql in _migration_statements(m, syntax, _present(c, syntax)):
                c.changes(sql)
    return True


def check_version(version: int, where: str) -> None:
    """Refuse a database of a newer schema than this code knows.

    Raises:
        StoreError: naming ``where`` and both versions.
    """
    if version > SCHEMA_VERSION:
        raise StoreError(f"{where} has schema version {version}, newer than this durable_turns "
                         f"knows ({SCHEMA_VERSION}); upgrade durable_turns")


def _present(c: Connection, syntax: Syntax) -> set[str]:
    """``table.column`` of every column and the name of every index the database has."""
    names = {f"{t}.{col}" for t, col in c.rows(syntax.columns_query)}
    return names | {r[0] for r in c.rows(syntax.indexes_query)}
