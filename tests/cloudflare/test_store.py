"""F27 (F1): the Durable Object store (``durable_turns.cloudflare.DurableObjectStore``, one
module on public names of the kit only) passes the conformance suite's required,
``exactly_once_local`` and ``durable`` tiers on the faithful fake of a Durable Object's
storage, is found by a scheme once registered, and keeps within workerd's limits."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import durable_turns.cloudflare._store as object_store
from durable_turns.cloudflare import DurableObjectStore
from durable_turns.cloudflare.testing import DurableObjectStorage, SqlError
from durable_turns.records import (
    CallOutcome,
    NewEntry,
    SessionKey,
    ToolStepId,
    TurnResult,
    TurnStatus,
)
from durable_turns.stores import SessionStore, registry
from durable_turns.testing import CONFORMANCE, OPTIONAL, REQUIRED, Check, needs, run_check
from durable_turns.testing.helpers import opening

TIERS = {"exactly_once_local", "durable"}
"""The optional tiers the store declares (one instance per object: no sharing, no TTL)."""


def _factory() -> DurableObjectStore:
    return DurableObjectStore(DurableObjectStorage())


def _on_one_storage() -> Callable[[], SessionStore]:
    storage = DurableObjectStorage()
    return lambda: DurableObjectStore(storage)


@pytest.mark.parametrize("check", CONFORMANCE, ids=lambda c: c.__name__.removeprefix("check_"))
async def test_the_do_store_passes_the_conformance_suite(check: Check) -> None:
    ran = await run_check(check, _on_one_storage())
    if check in REQUIRED or needs(check) in TIERS:
        assert ran, f"{check.__name__} was skipped"
    else:
        assert not ran
        pytest.skip(f"the store does not declare {needs(check)}")


def test_the_store_declares_its_tiers() -> None:
    caps = _factory().capabilities
    from durable_turns.testing import declares

    assert {tier for tier in OPTIONAL if declares(caps, tier)} == TIERS


def test_the_store_is_one_module_on_public_names_of_the_kit() -> None:
    """Written as a third party would write it: outside its own package, it imports public
    names of public modules only."""
    tree = ast.parse(Path(object_store.__file__).read_text())
    seen = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                             "durable_turns.cloudflare")
        if not module.startswith("durable_turns") or module.startswith("durable_turns.cloudflare"):
            continue
        seen.add(module)
        assert not any(part.startswith("_") for part in module.split(".")), module
        mod = importlib.import_module(module)
        public = getattr(mod, "__all__", [n for n in vars(mod) if not n.startswith("_")])
        assert all(a.name in public for a in node.names), module
    assert "durable_turns.stores.sql" in seen


async def test_one_registration_makes_a_scheme_find_it(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = DurableObjectStorage()
    monkeypatch.setitem(registry.SCHEMES, "do", lambda spec, ttl: DurableObjectStore(storage))
    store = registry.store_for("do://my-object")
    assert isinstance(store, DurableObjectStore)
    await store.open()
    await store.close()


def test_a_crash_between_a_local_tool_and_its_commit_keeps_nothing_of_the_tool(
        tmp_path: Path) -> None:
    """The note of cloudflare.md: the tool and its step's commit are one transaction (the
    implicit transaction alone would commit the tool's row at the await between them)."""
    path = tmp_path / "object.sqlite"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE rows (v TEXT)")
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), os.environ.get(
        "PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(here / "storage_child.py"), str(path), "store-step"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "tool ran" in done.stdout
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT count(*) FROM rows").fetchone()[0] == 0
        # what the step's claim committed before it is there: the crash came mid-step
        assert c.execute("SELECT count(*) FROM turns").fetchone()[0] == 1


async def test_a_transcript_of_large_messages_stays_within_a_row_s_limit() -> None:
    """The copy of a long transcript (``log_transcript``) is bounded in bytes, not only in
    messages: a Durable Object refuses a value over 4 MiB, and a copy of 32 tool results of
    300 kB each would be one."""
    store = DurableObjectStore(DurableObjectStorage())
    await store.open()
    key = SessionKey("agent", "big")
    await store.enqueue(key, NewEntry("t1", opening("t1")))
    lease = await store.claim(key)
    sent = [opening("t1", f"{i}:" + "x" * 300_000) for i in range(40)]
    for message in sent:  # each commit moves the chain: a copy is made once it may be
        async with lease.transaction() as tx:
            tx.add_message(message)
            tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
    await lease.release()
    assert await store.read_messages(key) == sent
    assert await store.read_messages(key, after=37) == sent[37:]
    await store.close()


async def test_one_value_over_the_row_limit_commits_in_parts_and_reads_back_whole() -> None:
    """A single tool result of 5 MB (a message over workerd's 4 MiB per value, which the fake
    refuses as workerd does) and a step value as large are written as parts in the commit's
    own transaction and joined on read, by a new instance on the same storage."""
    storage = DurableObjectStorage()
    with pytest.raises(SqlError):  # the fake keeps workerd's limit: one such value is refused
        storage.sql.exec("SELECT ?", "y" * 5_000_000)
    store = DurableObjectStore(storage)
    await store.open()
    key = SessionKey("agent", "huge")
    await store.enqueue(key, NewEntry("t1", opening("t1")))
    lease = await store.claim(key)
    big = opening("t1", "é" * 2_600_000)  # 5.2 MB of UTF-8
    outcome = CallOutcome("z" * 5_000_000)
    async with lease.transaction() as tx:
        tx.add_message(big)
        tx.add_step(ToolStepId(0, "c1"), "t1", outcome)
        tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
    await lease.release()
    await store.close()
    again = DurableObjectStore(storage)  # a new instance on the same storage (an eviction)
    await again.open()
    assert await again.read_messages(key) == [big]
    steps = await again.read_steps(key)
    assert steps["tool:0:c1"].data == outcome.to_json()
    short = storage.sql.exec("SELECT max(length(body)), max(length(memo)) FROM log").raw()
    assert all(v < 100 for v in short.toArray()[0])  # the log holds references, not values
    await again.close()
