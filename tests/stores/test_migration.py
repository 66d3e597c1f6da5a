"""F1: Stores written by older engines open with today's code: every old row reads back as it did
then (archived generation included) and new steps append after them, on SQLite and
PostgreSQL (whose old tables, made by the old DDL in ``old_schemas.py``, are filled with the
same rows). A store of schema version 2 (three tables: messages, steps, events;
``v2_store.py``) and one of version 4 (the step log and its transcript copies, the last
version before owed deliveries; ``v4_store.py``)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from durable_turns import Message, Runtime, SqliteStore, scripted
from durable_turns.agent import Agent
from durable_turns.records import SessionKey
from durable_turns.stores import SessionStore
from durable_turns.stores.sql import SCHEMA_VERSION
from old_schemas import PG_HISTORY
from v2_store import dump, look, refund, reply
from v4_store import V4_SESSIONS

FIXTURES = Path(__file__).parents[1] / "fixtures"
EXPECTED: dict[str, Any] = json.loads((FIXTURES / "v2_store.json").read_text())
S1, S3 = SessionKey("ops", "s1"), SessionKey("ops", "s3")


def _copy(tmp_path: Path) -> Path:
    db = tmp_path / "v2.sqlite"
    shutil.copy(FIXTURES / "v2_store.sqlite", db)
    return db


def test_the_fixture_is_a_version_2_store() -> None:
    c = sqlite3.connect(f"file:{FIXTURES / 'v2_store.sqlite'}?mode=ro", uri=True)
    try:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 2
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"messages", "steps", "events"} <= tables and "log" not in tables
    finally:
        c.close()


async def _goes_on(store: SessionStore, reopen: SessionStore) -> None:
    """Every old read as recorded; then new steps after the old ones, readable as well."""
    agent = Agent("ops", "You run ops.", [look, refund])
    async with Runtime([agent], store, scripted(reply)) as rt:
        assert await dump(store) == EXPECTED
        s1 = rt.session("ops", "s1")
        r = await s1.turn("look again", turn_id="t4")
        assert r.status == "completed"
        s3 = rt.session("ops", "s3")
        parked = await s3.pending()
        assert parked is not None
        await s3.resume("p1", parked.id, True)
        assert (await s3.result("p1")).status == "completed"
    await reopen.open()
    try:
        after = await dump(reopen)
    finally:
        await reopen.close()
    old, new = EXPECTED[str(S1)], after[str(S1)]
    assert new["generations"]["0"] == old["generations"]["0"]  # the archive, untouched
    live_old, live_new = old["generations"]["1"], new["generations"]["1"]
    assert live_new["messages"][:len(live_old["messages"])] == live_old["messages"]
    # t4: its opening, the reply with two calls, their results, the answer
    assert len(live_new["messages"]) == len(live_old["messages"]) + 5
    assert set(live_old["steps"]) < set(live_new["steps"])
    assert new["events"][:len(old["events"])] == old["events"]
    seqs = [e["seq"] for e in new["events"]]
    assert seqs == list(range(1, len(seqs) + 1))
    assert [e["type"] for e in new["events"][len(old["events"]):]][-1] == "turn.completed"
    p1 = after[str(S3)]
    assert p1["status"] == "idle" and p1["events"][-1]["type"] == "turn.completed"
    assert p1["events"][:len(EXPECTED[str(S3)]["events"])] == EXPECTED[str(S3)]["events"]
    assert "input:p1:approve" in p1["generations"]["0"]["steps"]


async def test_sqlite_version_2_opens_reads_and_goes_on(tmp_path: Path) -> None:
    db = _copy(tmp_path)
    await _goes_on(SqliteStore(db), SqliteStore(db))
    c = sqlite3.connect(db)
    try:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 9
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "log" in tables and not tables & {"messages", "steps", "events"}
        assert {"timers", "schedules"} <= tables  # versions 7 and 8 (F24)
    finally:
        c.close()


async def test_sqlite_migration_is_one_transaction(tmp_path: Path) -> None:
    """A migration that fails leaves the version-2 file as it was."""
    db = _copy(tmp_path)
    c = sqlite3.connect(db)
    c.execute("CREATE TABLE log (x)")  # in the way of the migration's CREATE TABLE
    c.commit()
    c.close()
    store = SqliteStore(db)
    with pytest.raises(Exception, match="log"):
        await store.open()
    c = sqlite3.connect(db)
    try:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 2
        assert c.execute("SELECT count(*) FROM events").fetchone()[0] == sum(
            len(s["events"]) for s in EXPECTED.values())
    finally:
        c.close()


OPEN_AND_DUMP = """
import asyncio, json, sys, time
from pathlib import Path
from durable_turns import SqliteStore
from v2_store import dump

async def main(db: str, go: Path) -> None:
    deadline = time.monotonic() + 60
    while not go.exists():  # all children open at once
        if time.monotonic() > deadline:
            sys.exit("no go file")
        await asyncio.sleep(0.001)
    store = SqliteStore(db)
    await store.open()
    try:
        print(json.dumps(await dump(store)))
    finally:
        await store.close()

asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
"""


def test_sqlite_processes_opening_an_old_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    """The processes meet on the schema lock: one migrates, the others wait for it (on
    their store's thread) and find the file current; each reads every old row."""
    import os
    import subprocess
    import sys

    db, go = _copy(tmp_path), tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    children = [subprocess.Popen([sys.executable, "-c", OPEN_AND_DUMP, str(db), str(go)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env) for _ in range(4)]
    go.touch()
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert json.loads(out) == EXPECTED
    c = sqlite3.connect(db)
    try:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        c.close()


def _v2_postgres(dsn: str, source: Path) -> None:
    """A PostgreSQL schema at version 2 holding the SQLite fixture's rows."""
    _old_postgres(dsn, source, 2, {
        "sessions": "sid, agent, session, status, generation, epoch",
        "turns": "ordinal, sid, turn_id, kind, status, opening, event, policy, "
                 "request, text, error, reason, cancel, data",
        "messages": "sid, gen, idx, turn_id, body",
        "steps": "sid, gen, step_id, turn_id, data",
        "events": "sid, seq, turn_id, type, data",
    })


def _old_postgres(dsn: str, source: Path, version: int, tables: dict[str, str]) -> None:
    """A PostgreSQL schema at ``version``, made by that version's DDL, holding the rows of
    these tables and columns of the SQLite fixture ``source``."""
    import psycopg

    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        with psycopg.connect(dsn, autocommit=False) as c:
            for sql in PG_HISTORY[:version]:
                c.execute(sql.encode())
            c.execute("CREATE TABLE durable_turns_schema (version INTEGER NOT NULL)")
            c.execute("INSERT INTO durable_turns_schema VALUES (%s)", (version,))
            c.execute("ALTER TABLE sessions ALTER COLUMN sid SET GENERATED BY DEFAULT")
            c.execute("ALTER TABLE turns ALTER COLUMN ordinal SET GENERATED BY DEFAULT")
            for table, cols in tables.items():
                rows = src.execute(f"SELECT {cols} FROM {table}").fetchall()
                marks = ", ".join(["%s"] * len(cols.split(",")))
                with c.cursor() as cur:
                    cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)
            c.execute("SELECT setval(pg_get_serial_sequence('sessions', 'sid'), "
                      "(SELECT max(sid) FROM sessions))")
            c.execute("SELECT setval(pg_get_serial_sequence('turns', 'ordinal'), "
                      "(SELECT max(ordinal) FROM turns))")
            c.execute("ALTER TABLE sessions ALTER COLUMN sid SET GENERATED ALWAYS")
            c.execute("ALTER TABLE turns ALTER COLUMN ordinal SET GENERATED ALWAYS")
            c.commit()
    finally:
        src.close()


async def test_postgres_version_2_opens_reads_and_goes_on(pg_dsn: str) -> None:
    from durable_turns import PostgresStore

    _v2_postgres(pg_dsn, FIXTURES / "v2_store.sqlite")
    await _goes_on(PostgresStore(pg_dsn, lease_ttl=5.0), PostgresStore(pg_dsn, lease_ttl=5.0))
    import psycopg

    with psycopg.connect(pg_dsn) as c:
        row = c.execute("SELECT version FROM durable_turns_schema").fetchone()
        assert row is not None and row[0] == SCHEMA_VERSION
        assert c.execute("SELECT to_regclass('events')").fetchone() == (None,)


# -- version 4: the step log, before owed deliveries --------------------------------------

V4: dict[str, Any] = json.loads((FIXTURES / "v4_store.json").read_text())
S4 = SessionKey("ops", "s4")


async def _v4_goes_on(store: SessionStore) -> None:
    """Every old read as recorded (transcript copies included); then a turn on the long
    session reads after them, and a turn accepted with a delivery owed is an owed one."""
    from durable_turns.records import NewEntry

    agent = Agent("ops", "You run ops.", [look, refund])
    async with Runtime([agent], store, scripted(reply)) as rt:
        assert await dump(store, V4_SESSIONS) == V4
        assert await store.owed_deliveries("slack") == []
        s4 = rt.session("ops", "s4")
        assert (await s4.turn("look once more", turn_id="l12")).status == "completed"
        old = V4[str(S4)]["generations"]["0"]["messages"]
        new = [repr(m) for m in await store.read_messages(S4)]
        assert new[:len(old)] == old and len(new) == len(old) + 5
        rec, _ = await store.enqueue(SessionKey("ops", "s5"), NewEntry(
            "d1", Message("user", "hi", turn_id="d1"), deliver="slack"))
        assert rec.deliver == "slack"
        assert [t.turn_id for _, t in await store.owed_deliveries("slack")] == ["d1"]


async def test_sqlite_version_4_opens_reads_and_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "v4.sqlite"
    shutil.copy(FIXTURES / "v4_store.sqlite", db)
    c = sqlite3.connect(db)
    try:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 4
        assert c.execute("SELECT count(*) FROM log_transcript").fetchone()[0] > 0
    finally:
        c.close()
    await _v4_goes_on(SqliteStore(db))
    c = sqlite3.connect(db)
    try:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert "deliver" in {r[1] for r in c.execute("PRAGMA table_info(turns)")}
        # Version 6: sessions made before owners have none.
        assert c.execute("SELECT count(*), count(owner) FROM sessions").fetchone()[1] == 0
    finally:
        c.close()


async def test_postgres_version_4_opens_reads_and_goes_on(pg_dsn: str) -> None:
    from durable_turns import PostgresStore

    _old_postgres(pg_dsn, FIXTURES / "v4_store.sqlite", 4, {
        "sessions": "sid, agent, session, status, generation, epoch",
        "turns": "ordinal, sid, turn_id, kind, status, opening, event, policy, "
                 "request, text, error, reason, cancel, data",
        "log": "sid, seq, sub, gen, n, turn_id, body, step, memo, events",
        "log_transcript": "sid, gen, n, seq, body",
    })
    await _v4_goes_on(PostgresStore(pg_dsn, lease_ttl=5.0))
    import psycopg

    with psycopg.connect(pg_dsn) as c:
        row = c.execute("SELECT version FROM durable_turns_schema").fetchone()
        assert row == (SCHEMA_VERSION,)
        indexes = {r[0] for r in c.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")}
        assert {"turns_owed", "turns_runnable", "turns_by_id", "log_lookup"} <= indexes


# -- version 9: owners are identities qualified by their source (issue 38) -----------------


async def test_sqlite_version_6_owners_become_http_identities(tmp_path: Path) -> None:
    """An owner recorded before version 9 was an HTTP host's principal: it opens as
    ``http:<id>``, and a session without one keeps none."""
    db = tmp_path / "v6.sqlite"
    store = SqliteStore(db)
    async with Runtime([Agent("ops", "")], store, scripted([])):
        assert await store.own_session(SessionKey("ops", "mine"), "http:x") == "http:x"
        assert await store.own_session(SessionKey("ops", "theirs"), "http:y") == "http:y"
        await store.enqueue(SessionKey("ops", "none"), _entry("t1"))
    c = sqlite3.connect(db)
    try:  # as a version-6 file holds them
        c.execute("UPDATE sessions SET owner = substr(owner, 6)")
        for later in ("timers", "schedules"):  # the tables of versions 7 and 8
            c.execute(f"DROP TABLE IF EXISTS {later}")
        c.execute("PRAGMA user_version = 6")
        c.commit()
    finally:
        c.close()
    reopened = SqliteStore(db)
    async with Runtime([Agent("ops", "")], reopened, scripted([])):
        owners = {k: (await reopened.session_info(SessionKey("ops", k))) for k in
                  ("mine", "theirs", "none")}
        assert {k: i.owner if i else "missing" for k, i in owners.items()} == {
            "mine": "http:x", "theirs": "http:y", "none": None}
    c = sqlite3.connect(db)
    try:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        c.close()


def _entry(turn_id: str) -> Any:
    from durable_turns.records import NewEntry

    return NewEntry(turn_id, Message("user", "hi", turn_id=turn_id))
