"""F1: a third-party store: the Durable Object store of ``do_store`` (one module, public names
of the kit only) passes the conformance suite's required and ``exactly_once_local`` tiers on
a faithful fake of a Durable Object's storage, and is found by a scheme once registered."""

from __future__ import annotations

import ast
import importlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from do_store import DoStore
from durable_turns.records import NewEntry, SessionKey, TurnResult, TurnStatus
from durable_turns.stores import SessionStore, registry
from durable_turns.testing import CONFORMANCE, OPTIONAL, REQUIRED, Check, needs, run_check
from durable_turns.testing.helpers import opening
from fake_do_storage import DurableObjectStorage

TIERS = {"exactly_once_local", "durable"}
"""The optional tiers the store declares (one instance per object: no sharing, no TTL)."""


def _factory() -> DoStore:
    return DoStore(DurableObjectStorage())


def _on_one_storage() -> Callable[[], SessionStore]:
    storage = DurableObjectStorage()
    return lambda: DoStore(storage)


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


def test_the_store_is_one_module_of_public_names() -> None:
    tree = ast.parse((Path(__file__).parent / "do_store.py").read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if module.startswith("durable_turns"):
            assert not any(part.startswith("_") for part in module.split(".")), module
            mod = importlib.import_module(module)
            public = getattr(mod, "__all__", [n for n in vars(mod) if not n.startswith("_")])
            assert all(a.name in public for a in node.names), module


async def test_one_registration_makes_a_scheme_find_it(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = DurableObjectStorage()
    monkeypatch.setitem(registry.SCHEMES, "do", lambda spec, ttl: DoStore(storage))
    store = registry.store_for("do://my-object")
    assert isinstance(store, DoStore)
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
    done = subprocess.run([sys.executable, str(here / "do_child.py"), str(path), "store-step"],
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
    store = DoStore(DurableObjectStorage())
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
