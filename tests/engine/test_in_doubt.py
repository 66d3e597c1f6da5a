"""Remote tools in doubt (F26): an intent before the run, settled on replay.

Real child processes (``tests/indoubtkit.py``) are SIGKILLed before a call's intent, after it
(before the remote effect), after the remote effect (before the result commits) and after the
result committed; a new process recovers the turn. Only a call whose intent committed and
whose result did not is in doubt: an ``in_doubt="ask"`` call parks, a reconcile function
settles it from the remote side's ledger, a ``rerun`` call runs again and writes nothing new.
On SQLite and, with ``DURABLE_TURNS_TEST_PG``, PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import PG_DSN, pg_schema_dsn
from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    PostgresStore,
    Reconciled,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.channels.threads import render
from durable_turns.errors import ConfigurationError, DurableTurnsError
from durable_turns.events import ActionInDoubt
from durable_turns.records import Intent, SessionKey
from durable_turns.server._timeline import read_timeline
from durable_turns.stores import SessionStore
from indoubtkit import AGENT, SESSION, TURN_ID, build_tools, calls_of, crash, deliver, ledger

KEY = SessionKey(AGENT, SESSION)
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(
    PG_DSN is None, reason="needs DURABLE_TURNS_TEST_PG (a DSN; see .ci/pg)"))]


def kit_args(backend: str, tools: str, *more: str
             ) -> tuple[list[str], Callable[[], Any] | None]:
    """The child's arguments for a backend, and a factory of a store on the same data."""
    if backend == "postgres":
        dsn = pg_schema_dsn()
        return ["--tools", tools, "--pg", dsn, *more], lambda: PostgresStore(dsn)
    return ["--tools", tools, *more], None


async def read(store: SessionStore) -> tuple[list[Any], list[Any], dict[str, Any]]:
    await store.open()
    try:
        return (await store.read_messages(KEY), await store.read_events(KEY),
                await store.read_steps(KEY))
    finally:
        await store.close()


def store_of(work: Path, factory: Callable[[], Any] | None) -> SessionStore:
    return factory() if factory is not None else SqliteStore(work / "store.sqlite")


def tool_results(messages: list[Any]) -> dict[str, Any]:
    return {m.call_id: m.result for m in messages if m.role == "tool"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kill,in_doubt", [("asked", False), ("intent", True),
                                           ("effect", True), ("done", False)])
@pytest.mark.parametrize("answer", ["yes", "no"])
def test_ask_parks_exactly_the_calls_in_doubt(tmp_path: Path, backend: str, kill: str,
                                              in_doubt: bool, answer: str) -> None:
    args, factory = kit_args(backend, "ask")
    crash(tmp_path, "a", f"{kill}:c1", *args)
    effects_before = len(ledger(tmp_path))
    assert effects_before == (1 if kill in ("effect", "done") else 0)
    recovered = deliver(tmp_path, "b", "--recover", *args)
    if not in_doubt:
        assert recovered["status"] == "completed"
        assert len(ledger(tmp_path)) == 1
        return
    assert recovered["status"] == "suspended"
    request = recovered["request"]
    assert request["id"] == "in_doubt:c1:1" and request["schema"] == {"type": "boolean"}
    assert request["call_id"] == "c1" and "charge_ask" in request["prompt"]
    assert len(ledger(tmp_path)) == effects_before  # parked: the tool did not run again
    done = deliver(tmp_path, "c", "--answer", answer, *args)
    assert done["status"] == "completed"
    messages, events, steps = asyncio.run(read(store_of(tmp_path, factory)))
    result = tool_results(messages)["c1"]
    if answer == "no":
        assert result == {"in_doubt": True, "skipped": True}
        assert len(ledger(tmp_path)) == effects_before
    else:
        assert result == {"charged": 100, "call": "c1"}
        assert len(ledger(tmp_path)) == effects_before + 1
    doubts = [(e.attempt, e.settled) for e in events if isinstance(e, ActionInDoubt)]
    assert doubts == [(1, None), (1, "run" if answer == "yes" else "skipped")]
    intents = {k: s.result for k, s in steps.items() if k.startswith("intent:")}
    assert set(intents) == ({"intent:1:1:c1", "intent:1:2:c1"} if answer == "yes"
                            else {"intent:1:1:c1"})
    first = intents["intent:1:1:c1"]
    assert isinstance(first, Intent) and first.tool == "charge_ask" and first.attempt == 1
    assert first.key == ledger(tmp_path)[0]["key"] if ledger(tmp_path) else True


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kill", ["intent", "effect"])
def test_reconcile_settles_from_the_remote_side(tmp_path: Path, backend: str,
                                                kill: str) -> None:
    args, factory = kit_args(backend, "reconcile")
    crash(tmp_path, "a", f"{kill}:c1", *args)
    done = deliver(tmp_path, "b", "--recover", *args)
    assert done["status"] == "completed"
    assert len(ledger(tmp_path)) == 1  # found: not charged again; not found: charged once
    messages, events, _ = asyncio.run(read(store_of(tmp_path, factory)))
    settled = "reconciled" if kill == "effect" else "run"
    assert [e.settled for e in events if isinstance(e, ActionInDoubt)] == [settled]
    result = tool_results(messages)["c1"]
    assert result.get("reconciled") is (True if kill == "effect" else None)


def test_a_yes_whose_run_dies_too_asks_again(tmp_path: Path) -> None:
    crash(tmp_path, "a", "effect:c1", "--tools", "ask")
    assert deliver(tmp_path, "b", "--recover", "--tools", "ask")["status"] == "suspended"
    crash(tmp_path, "c", "effect:c1", "--tools", "ask", "--answer", "yes")
    again = deliver(tmp_path, "d", "--recover", "--tools", "ask")
    assert again["status"] == "suspended" and again["request"]["id"] == "in_doubt:c1:2"
    assert deliver(tmp_path, "e", "--answer", "no", "--tools", "ask")["status"] == "completed"
    assert len(ledger(tmp_path)) == 2


def log_rows(work: Path) -> int:
    """How many rows a SQLite store's log holds."""
    with contextlib.closing(sqlite3.connect(work / "store.sqlite")) as c:
        return int(c.execute("SELECT count(*) FROM log").fetchone()[0])


def test_rerun_writes_nothing_new(tmp_path: Path) -> None:
    """A ``rerun`` tool's turn writes the steps and rows a remote step always wrote (no
    intent); an ``ask`` tool's the same plus one intent row."""
    steps: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    for mode in ("rerun", "ask"):
        work = tmp_path / mode
        work.mkdir()
        assert deliver(work, "a", "--tools", mode)["status"] == "completed"
        steps[mode] = sorted(asyncio.run(read(SqliteStore(work / "store.sqlite")))[2])
        rows[mode] = log_rows(work)
    assert steps["rerun"] == ["model:1", "model:3", "tool:1:c1"]
    assert steps["ask"] == ["intent:1:1:c1", "model:1", "model:3", "tool:1:c1"]
    assert rows["ask"] == rows["rerun"] + 1


MIX = "rerun,ask,reconcile"
SWEEP = [(parallel, kill, call) for parallel in (False, True)
         for kill in ("asked", "intent", "effect", "done") for call in ("c1", "c2", "c3")
         if not (parallel and kill in ("asked", "done") and call != "c1")]
"""Each kill point of each call: before its intent (its reply committed), after the intent,
after the remote effect, after its result committed (in a batch, only the first call's:
the others may be anywhere then)."""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("parallel,kill,call", SWEEP)
def test_the_crash_sweep_with_a_mix(tmp_path: Path, backend: str, parallel: bool, kill: str,
                                    call: str) -> None:
    """Every kill point of a turn whose calls use the three modes: the turn completes once
    every call in doubt is answered yes; each call's result is in the transcript once, in
    call order; the reconciled call charged once, the others once more only if they were
    killed after their effect."""
    if backend == "postgres" and (parallel or call != "c2"):
        pytest.skip("PostgreSQL: the sequential sweep of the ask call")
    extra = ["--parallel"] if parallel else []
    args, factory = kit_args(backend, MIX, *extra)
    crash(tmp_path, "a", f"{kill}:{call}", *args)
    report = deliver(tmp_path, "b", "--recover", *args)
    asked = 0
    while report["status"] == "suspended":
        asked += 1
        assert asked == 1, report
        assert report["request"]["call_id"] == "c2"
        report = deliver(tmp_path, f"yes{asked}", "--answer", "yes", *args)
    assert report["status"] == "completed", report
    assert asked == (1 if call == "c2" and kill in ("intent", "effect") else 0)
    messages, _, _ = asyncio.run(read(store_of(tmp_path, factory)))
    assert [m.call_id for m in messages if m.role == "tool"] == ["c1", "c2", "c3"]
    counts = {c.id: sum(1 for e in ledger(tmp_path) if e["call"] == c.id)
              for c in calls_of(MIX.split(","))}
    twice = {c for c in ("c1", "c2") if kill == "effect" and call == c}
    assert counts == {"c1": 1 + ("c1" in twice), "c2": 1 + ("c2" in twice), "c3": 1}


# -- in one process ---------------------------------------------------------------------------


def test_declarations_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="remote tools"):
        @tool(in_doubt="ask")
        def local(x: int) -> int:
            """A local tool."""
            return x

    with pytest.raises(ConfigurationError, match="'rerun', 'ask' or an async function"):
        maybe: Any = "maybe"

        @tool(in_doubt=maybe)
        async def remote(x: int) -> int:
            """A remote tool."""
            return x


async def test_a_reconcile_that_returns_something_else_fails_the_turn() -> None:
    # The intent is read back on the same store by a new runtime: in doubt.
    """On the memory store: an intent stored by a drive that stopped (the tool raised
    SystemExit after its effect, abandoning the step) is found in doubt by the next drive."""
    effects: list[str] = []
    stop = [True]

    async def reconcile(args: dict[str, Any], ctx: ToolContext) -> Any:
        return {"ran": True}

    @tool(in_doubt=reconcile)
    async def charge(cents: int, ctx: ToolContext) -> str:
        """Charge."""
        effects.append(ctx.idempotency_key)
        if stop[0]:
            stop[0] = False
            raise SystemExit("the process stops here")
        return "ok"

    store = MemoryStore()
    model = scripted([ModelReply("", [ToolCall("c1", "charge", {"cents": 1})]),
                      ModelReply("done")])
    with pytest.raises(DurableTurnsError, match="unfinished"):
        async with Runtime([Agent(AGENT, "x", [charge])], store, model) as rt:
            await rt.session(AGENT, SESSION).start("go", turn_id=TURN_ID)
            await rt.session(AGENT, SESSION).result(TURN_ID, timeout=10)
    async with Runtime([Agent(AGENT, "x", [charge])], store, model) as rt:
        await rt.recover()
        res = await rt.session(AGENT, SESSION).result(TURN_ID, timeout=10)
    assert res.status == "failed", res
    assert "Reconciled.ran(result) or Reconciled.not_run()" in (res.error or "")
    assert len(effects) == 1


def test_reconciled_values() -> None:
    assert Reconciled.ran({"id": 1}) == Reconciled(True, {"id": 1})
    assert not Reconciled.not_run().did_run


async def test_history_and_timelines_show_the_call_in_doubt(tmp_path: Path) -> None:
    """After a kill past the effect, a park and a no: ``history()`` has the intent's
    checkpoint and both ``action.in_doubt`` events; the console's timeline marks the tool
    row; the Slack reply's markdown says how the call was settled."""
    crash(tmp_path, "a", "effect:c1", "--tools", "ask")
    await asyncio.to_thread(deliver, tmp_path, "b", "--recover", "--tools", "ask")
    await asyncio.to_thread(deliver, tmp_path, "c", "--answer", "no", "--tools", "ask")
    agent = Agent(AGENT, "x", build_tools(tmp_path, ("", "")))
    async with Runtime([agent], SqliteStore(tmp_path / "store.sqlite"), scripted([])) as rt:
        session = rt.session(AGENT, SESSION)
        history = await session.history()
        timeline = await read_timeline(session)
        events = await session.events()
    kinds = [cp.kind for cp in history]
    assert "intent" in kinds
    intent = history[kinds.index("intent")]
    assert intent.steps[0].id == "intent:1:1:c1" and isinstance(intent.results[0], Intent)
    doubts = [e for cp in history for e in cp.events if isinstance(e, ActionInDoubt)]
    assert [d.settled for d in doubts] == [None, "skipped"]
    rows = [r for r in timeline["turns"][0]["steps"] if r["kind"] == "tool"]
    assert rows and all(r["in_doubt"] == {"attempt": 1, "settled": "skipped"} for r in rows)
    assert rows[-1]["result"] == {"in_doubt": True, "skipped": True}
    text = render(events)
    assert "? charge_ask: in doubt: it may have run before the process stopped" in text
    assert "? charge_ask: in doubt: not run again" in text
