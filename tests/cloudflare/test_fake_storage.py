"""F27: the Durable Object fake (``durable_turns.cloudflare.testing``) keeps the rules of
``ctx.storage`` a store must live with: each rule here can fail. Crashes are real: a child
process (``storage_child.py``) SIGKILLs itself."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from durable_turns.cloudflare.testing import JS_NULL, DurableObjectStorage, SqlError, Transaction

HERE = Path(__file__).parent
WAIT = 60.0


def _outside(path: Path) -> list[str]:
    """The rows another connection sees: what is committed."""
    with sqlite3.connect(path) as c:
        return [r[0] for r in c.execute("SELECT v FROM rows ORDER BY v")]


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "object.sqlite"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE rows (v TEXT)")
    return path


async def test_exec_returns_a_cursor_that_has_run() -> None:
    sql = DurableObjectStorage().sql
    sql.exec("CREATE TABLE t (a INTEGER, b TEXT)")
    written = sql.exec("INSERT INTO t VALUES (?, ?), (?, ?)", 1, "x", 2, "y")
    assert written.rowsWritten == 2 and written.toArray() == []
    cur = sql.exec("SELECT a, b FROM t ORDER BY a")
    assert cur.columnNames == ["a", "b"]
    assert list(cur) == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert sql.exec("SELECT a, b FROM t ORDER BY a").raw().toArray() == [[1, "x"], [2, "y"]]
    assert sql.exec("SELECT a FROM t WHERE a = ?", 2).one() == {"a": 2}
    with pytest.raises(SqlError, match="exactly one"):
        sql.exec("SELECT a FROM t").one()
    with pytest.raises(SqlError, match="exactly one"):
        sql.exec("SELECT a FROM t WHERE a = 3").one()


async def test_numbers_are_bound_as_doubles() -> None:
    sql = DurableObjectStorage().sql
    sql.exec("CREATE TABLE t (a INTEGER, b TEXT)")
    sql.exec("INSERT INTO t VALUES (?, ?)", 5, 5)
    assert sql.exec("SELECT a, b FROM t").raw().toArray() == [[5, "5.0"]]


async def test_an_implicit_transaction_commits_at_the_next_turn_of_the_loop(
        tmp_path: Path) -> None:
    path = _file(tmp_path)
    storage = DurableObjectStorage(str(path))
    storage.sql.exec("INSERT INTO rows (v) VALUES (?)", "a")
    storage.sql.exec("INSERT INTO rows (v) VALUES (?)", "b")
    assert _outside(path) == []
    await asyncio.sleep(0)
    assert _outside(path) == ["a", "b"]
    storage.close()


def _child(path: Path, moment: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(HERE / "storage_child.py"), str(path), moment],
                          env=env, capture_output=True, text=True, timeout=WAIT, check=False)


@pytest.mark.parametrize(("moment", "kept"), [("implicit-no-await", []),
                                              ("implicit-after-await",
                                               ["implicit-after-await"])])
def test_a_crash_before_the_next_turn_loses_the_implicit_transaction(
        tmp_path: Path, moment: str, kept: list[str]) -> None:
    path = _file(tmp_path)
    done = _child(path, moment)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert _outside(path) == kept


async def test_transaction_sync_is_a_savepoint_that_nests() -> None:
    storage = DurableObjectStorage()
    sql = storage.sql
    sql.exec("CREATE TABLE t (v TEXT)")

    def inner() -> None:
        sql.exec("INSERT INTO t VALUES ('inner')")
        raise ValueError("inner fails")

    def outer() -> str:
        sql.exec("INSERT INTO t VALUES ('outer')")
        with pytest.raises(ValueError):
            storage.transactionSync(inner)
        return "done"

    assert storage.transactionSync(outer) == "done"

    def failing() -> None:
        sql.exec("INSERT INTO t VALUES ('failing')")
        raise KeyError("boom")

    with pytest.raises(KeyError):
        storage.transactionSync(failing)
    assert sql.exec("SELECT v FROM t").raw().toArray() == [["outer"]]


async def test_transaction_sync_refuses_an_async_function() -> None:
    storage = DurableObjectStorage()

    async def later() -> None:
        return None

    with pytest.raises(TypeError, match="synchronous"):
        storage.transactionSync(later)  # type: ignore[unused-coroutine]


async def test_transaction_holds_across_awaits_and_rolls_back_on_a_raise(
        tmp_path: Path) -> None:
    path = _file(tmp_path)
    storage = DurableObjectStorage(str(path))

    async def kept(txn: Transaction) -> None:
        storage.sql.exec("INSERT INTO rows (v) VALUES ('kept')")
        await asyncio.sleep(0.01)
        assert _outside(path) == []  # no implicit commit while it is open

    await storage.transaction(kept)
    await asyncio.sleep(0)
    assert _outside(path) == ["kept"]

    async def undone(txn: Transaction) -> None:
        storage.sql.exec("INSERT INTO rows (v) VALUES ('undone')")
        await asyncio.sleep(0)
        raise ValueError("boom")

    with pytest.raises(ValueError):
        await storage.transaction(undone)

    async def rolled_back(txn: Transaction) -> None:
        storage.sql.exec("INSERT INTO rows (v) VALUES ('rolled back')")
        txn.rollback()

    await storage.transaction(rolled_back)
    await asyncio.sleep(0)
    assert _outside(path) == ["kept"]
    storage.close()


@pytest.mark.parametrize("statement", ["BEGIN", "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK",
                                       "SAVEPOINT x", "RELEASE x", "END"])
async def test_sql_transaction_control_is_refused(statement: str) -> None:
    with pytest.raises(SqlError, match="transactionSync"):
        DurableObjectStorage().sql.exec(statement)


@pytest.mark.parametrize(("statement", "match"), [
    ("PRAGMA user_version", "pragma: user_version"),
    ("PRAGMA user_version = 3", "pragma: user_version"),
    ("SELECT sqlite_version()", "function: sqlite_version"),
    ("CREATE TABLE _cf_mine (a)", "_cf_"),
    ("SELECT * FROM _cf_KV", "_cf_"),
    ("ATTACH ':memory:' AS other", "ATTACH"),
    ("CREATE TEMP TABLE t (a)", "temporary"),
])
async def test_what_workerd_refuses_is_refused(statement: str, match: str) -> None:
    sql = DurableObjectStorage().sql
    with pytest.raises(SqlError, match=match):
        sql.exec(statement)


async def test_what_the_kit_needs_is_allowed() -> None:
    sql = DurableObjectStorage().sql
    sql.exec("CREATE TABLE t (a)")
    assert sql.exec("SELECT changes(), instr('abc', 'b'), coalesce(NULL, 1)").raw().toArray() \
        == [[0, 2, 1]]
    assert sql.exec("SELECT p.name FROM sqlite_master m JOIN pragma_table_info(m.name) p "
                    "WHERE substr(m.name, 1, 4) != '_cf_'").raw().toArray() == [["a"]]


async def test_a_like_pattern_over_50_bytes_is_refused() -> None:
    sql = DurableObjectStorage().sql
    assert sql.exec("SELECT 'abc' LIKE ?", "%b%").raw().toArray() == [[1]]
    with pytest.raises(SqlError, match="too complex"):
        sql.exec("SELECT 'abc' LIKE ?", "%" + "b" * 60 + "%")


async def test_values_cross_as_pyodide_hands_them() -> None:
    sql = DurableObjectStorage().sql
    sql.exec("CREATE TABLE t (a, b)")
    with pytest.raises(SqlError, match="undefined"):
        sql.exec("INSERT INTO t VALUES (?, ?)", None, 1)  # None crosses as undefined
    sql.exec("INSERT INTO t VALUES (?, ?)", JS_NULL, 2.5)
    assert sql.exec("SELECT a, b, a IS NULL FROM t").raw().toArray() == [[JS_NULL, 2.5, 1]]


async def test_workerd_s_limits_are_kept() -> None:
    sql = DurableObjectStorage().sql
    sql.exec("CREATE TABLE t (v)")
    sql.exec("SELECT " + ", ".join("?" * 100), *range(100))
    with pytest.raises(SqlError, match="too many SQL variables"):
        sql.exec("SELECT " + ", ".join("?" * 101), *range(101))
    sql.exec("INSERT INTO t VALUES (?)", "x" * (4 * 1024 * 1024 - 64))
    with pytest.raises(SqlError, match="too big"):
        sql.exec("INSERT INTO t VALUES (?)", "x" * (4 * 1024 * 1024 + 1))


async def test_the_one_alarm_is_kept_in_the_object_s_file(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"
    storage = DurableObjectStorage(str(path))
    assert await storage.getAlarm() is JS_NULL
    await storage.setAlarm(1_000)
    await storage.setAlarm(2_000)  # one alarm: the later call replaces it
    assert await storage.getAlarm() == 2_000
    assert not storage.due(1_999) and storage.due(2_000)
    with pytest.raises(SqlError, match="_cf_"):
        storage.sql.exec("SELECT at FROM _cf_alarm")
    await asyncio.sleep(0)
    storage.close()
    again = DurableObjectStorage(str(path))  # the object after an eviction
    assert await again.getAlarm() == 2_000
    again.fired(2_000)
    assert await again.getAlarm() is JS_NULL
    await again.setAlarm(3_000)
    await again.deleteAlarm()
    assert not again.due(10_000)
    again.close()
