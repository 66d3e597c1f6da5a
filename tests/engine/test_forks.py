"""F21: Time travel (issue 30): a session's history, and forks at every kind of checkpoint, on
every store; children forked with their parent; a fork killed halfway leaves nothing."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_turns import (
    Agent,
    InboundEvent,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    subagent,
    tool,
)
from durable_turns.errors import SessionExistsError
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.scheduling import NoDriveScheduler
from durable_turns.stores import SessionStore
from durable_turns.subagents import find_child

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""
effects: list[str] = []


@tool
async def lookup(q: str, ctx: ToolContext) -> dict[str, Any]:
    """Look something up (a remote effect, keyed by the step)."""
    effects.append(ctx.idempotency_key)
    return {"q": q, "found": len(q)}


@tool
async def refund(order: str, ctx: ToolContext) -> str:
    """Refund an order once a person approves."""
    ok = await ctx.request_input("approve", f"Refund {order}?", schema={"type": "boolean"})
    return "refunded" if ok else "kept"


def brain(request: ModelRequest) -> ModelReply:
    text = next(m.text for m in reversed(request.messages) if m.is_opening)
    n = calls_this_turn(request)
    if text.startswith("refund") and n == 0:
        return ModelReply("Asking.", [ToolCall("r1", "refund", {"order": "42"})])
    if text.startswith("look") and n < 2:
        return ModelReply(f"Looking {n}.", [ToolCall(f"l{n}", "lookup", {"q": f"q{n}"})])
    return ModelReply(f"Done with: {text}")


@pytest.fixture(autouse=True)
def _clear() -> None:
    effects.clear()


def runtime(store: SessionStore) -> Runtime:
    return Runtime([Agent("ops", "You help.", [lookup, refund])], store, scripted(brain))


async def test_history_and_a_fork_at_every_kind_of_checkpoint(store: SessionStore) -> None:
    rt = runtime(store)
    await rt.open()
    await rt.session("ops", "s1").turn("look twice", turn_id="t1")
    # Forks made where nothing drives (a server of workers) keep what they copied as it was:
    # a turn under way stays queued for whoever drives the fork.
    viewer = Runtime([Agent("ops", "You help.", [lookup, refund])], store,
                     scheduler=NoDriveScheduler(), owns_store=False)
    await viewer.open()
    s = viewer.session("ops", "s1")
    source = await s.transcript()
    history = await s.history()
    assert [cp.kind for cp in history] == ["start", "model", "tool", "model", "tool", "model"]
    assert all(cp.at is not None for cp in history)
    assert [cp.messages for cp in history] == [1, 2, 3, 4, 5, 6]
    for i, cp in enumerate(history):
        fork = await s.fork(f"f{i}", cp)
        assert await fork.transcript() == source[:cp.messages], cp.kind
        (t1,) = await fork.chain()
        # Under way at any checkpoint but the last (the turn's end): queued in the fork.
        assert t1.status == ("completed" if i == len(history) - 1 else "queued"), cp.kind
        assert await fork.history() == [
            _moved(c, fork.key.session) for c in history[:i + 1]]
    # The source is untouched; a fork goes on as a timeline of its own: its turn is driven
    # from the checkpoint (no step before it runs again), its effects keyed anew.
    assert await s.history() == history and len(effects) == 2
    middle = rt.session("ops", "f2")  # after the first lookup's result
    r = await middle.result("t1", timeout=WAIT)
    assert (r.status, r.text) == ("completed", "Done with: look twice")
    assert len(effects) == 3 and effects[2] not in effects[:2]
    assert [m.text for m in await middle.transcript()] == [m.text for m in source]
    # A runtime that drives goes on with a fork's turn at once.
    eager = await rt.session("ops", "s1").fork("f9", history[2])
    r = await eager.result("t1", timeout=WAIT)
    assert (r.status, r.text) == ("completed", "Done with: look twice") and len(effects) == 4
    with pytest.raises(SessionExistsError):
        await s.fork("f2", history[0])
    with pytest.raises(LookupError):
        await rt.session("ops", "nobody").fork("f10")
    await viewer.close()
    await rt.close()


def _moved(cp: Any, session: str) -> Any:
    from dataclasses import replace

    return replace(cp, events=tuple(replace(e, session=session) for e in cp.events))


async def test_a_fork_at_a_park_is_answered_on_its_own(store: SessionStore) -> None:
    rt = runtime(store)
    await rt.open()
    s = rt.session("ops", "s1")
    alice = InboundEvent("web", {"id": "alice", "attested": True}, "refund 42")
    await s.start(event=alice, turn_id="t1")
    assert (await s.result("t1", timeout=WAIT)).status == "suspended"
    park = (await s.history())[-1]
    assert park.kind == "park"
    fork = await s.fork("s1-fork", park)
    assert await fork.pending() == await s.pending() is not None
    assert await fork.status() == "suspended"
    await fork.resume("t1", "approve", False, by="alice")
    assert (await fork.result("t1", timeout=WAIT)).text == "Done with: refund 42"
    # The source still waits, and is answered its own way.
    assert await s.pending() is not None
    await s.resume("t1", "approve", True, by="alice")
    assert (await s.result("t1", timeout=WAIT)).status == "completed"
    tools = [m.result for m in await s.transcript() if m.role == "tool"]
    forked = [m.result for m in await fork.transcript() if m.role == "tool"]
    assert (tools, forked) == (["refunded"], ["kept"])
    await rt.close()


async def test_then_starts_another_turn_after_a_turns_end(store: SessionStore) -> None:
    rt = runtime(store)
    await rt.open()
    s = rt.session("ops", "s1")
    await s.turn("look once more", turn_id="t1")
    await s.turn("and thanks", turn_id="t2")
    history = await s.history()
    end_of_t1 = next(cp for cp in history if cp.kind == "model" and cp.turn_id == "t1"
                     and cp.events[-1].ends_turn)
    fork = await s.fork("alt", end_of_t1, then="something else", turn_id="t2-alt")
    assert (await fork.result("t2-alt", timeout=WAIT)).text == "Done with: something else"
    chain = [t.opening.text for t in await fork.chain() if t.opening]
    assert chain == ["look once more", "something else"]
    texts = [m.text for m in await fork.transcript() if m.role == "user"]
    assert texts == ["look once more", "something else"]
    with pytest.raises(ValueError, match="under way"):
        await s.fork("alt2", (await s.history())[1], then="x")
    await rt.close()


async def test_children_are_forked_with_their_parent(store: SessionStore) -> None:
    def relay(request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("Asking.", [ToolCall("c1", "helper", {"task": "refund 7"})])
        return ModelReply(f"Helper: {request.messages[-1].result}")

    lead = Agent("lead", "", [subagent("helper", description="Refunds.")],
                 model=scripted(relay))
    helper = Agent("helper", "", [refund], model=scripted(brain))
    rt = Runtime([lead, helper], store)
    await rt.open()
    s = rt.session("lead", "p1")
    alice = InboundEvent("web", {"id": "alice", "attested": True}, "go")
    await s.start(event=alice, turn_id="t1")
    assert (await s.result("t1", timeout=WAIT)).status == "suspended"
    fork = await s.fork("p1-fork")
    pending = await fork.pending()
    found = await find_child(fork, "t1", "c1")
    assert found is not None
    new_child, child_turn = found
    assert pending is not None and pending.child is not None
    assert pending.child["session"] == new_child
    child = rt.session("helper", new_child)
    assert (await child.pending()) is not None  # the child's park, in the child's fork
    await fork.resume("t1", pending.id, True, by="alice")
    done = await fork.result("t1", timeout=WAIT)
    assert done.text == "Helper: {'answer': 'Done with: refund 7'}"
    assert (await child.result(child_turn)).status == "completed"
    # The source's child was not touched: it still waits.
    old = await find_child(s, "t1", "c1")
    assert old is not None and old[0] != new_child  # a new child, under a new id
    old_child = old[0]
    assert await rt.session("helper", old_child).pending() is not None
    assert await s.pending() is not None
    await rt.close()


CHILD = """
import asyncio, sys
from durable_turns import Agent, ModelReply, Runtime, SqliteStore, scripted

async def main() -> None:
    async with Runtime([Agent("ops")], SqliteStore(sys.argv[1]), scripted([])) as rt:
        print("forking", flush=True)
        await rt.session("ops", "big").fork("big-fork")
        print("forked", flush=True)

asyncio.run(main())
"""


async def test_a_fork_killed_halfway_leaves_no_session(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    model = scripted(lambda _r: ModelReply("ok " * 50))
    async with Runtime([Agent("ops")], SqliteStore(db), model) as rt:
        s = rt.session("ops", "big")
        for i in range(150):
            await s.turn(f"turn {i}", turn_id=f"t{i}")
        whole = await s.transcript()
    outcomes = set()
    for delay in (0.0, 0.01, 0.03, 0.08, None):
        with subprocess.Popen([sys.executable, "-c", CHILD, str(db)],
                              stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "forking"
            if delay is not None:
                await asyncio.sleep(delay)  # a kill point somewhere in the fork, not a sync
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=WAIT)
        async with Runtime([Agent("ops")], SqliteStore(db), model) as rt:
            fork = rt.session("ops", "big-fork")
            copied = await fork.transcript()
            assert copied in ([], whole), len(copied)
            assert (await fork.chain() == []) == (copied == [])
            outcomes.add(bool(copied))
            if copied:
                break
    assert True in outcomes  # the unkilled run forked it whole


@tool
def create_order(item: str, ctx: ToolContext) -> dict[str, Any]:
    """Place an order (a local tool: a row in the app's table, in the step's transaction)."""
    db = ctx.store.unwrap()
    db.execute("create table if not exists orders (item text)")
    db.execute("insert into orders values (?)", (item,))
    return {"ordered": item, "n": db.execute("select count(*) from orders").fetchone()[0]}


def orderer(request: ModelRequest) -> ModelReply:
    n = calls_this_turn(request)
    if n < 2:
        item = ("keyboard", "mouse")[n]
        return ModelReply(f"Ordering {item}.", [ToolCall(f"o{n}", "create_order", {"item": item})])
    return ModelReply("Ordered both.")


def orders(db: Path) -> int:
    import sqlite3

    with sqlite3.connect(db) as c:
        found: int = c.execute("select count(*) from orders").fetchone()[0]
    return found


async def test_a_fork_that_would_run_local_tools_again_says_so_first(tmp_path: Path) -> None:
    """Issue 37: forking inside a turn whose local tool calls are owed there would run them
    again for real in the app's tables: refused (nothing written) unless the fork says how:
    ``tools="live"`` runs them, ``fork_recorded`` answers them from the recording."""
    from durable_turns.errors import ForkRerunsToolsError
    from durable_turns.replay import fork_recorded

    db = tmp_path / "shop.db"
    async with Runtime([Agent("shop", "You shop.", [create_order])], SqliteStore(db),
                       scripted(orderer)) as rt:
        s = rt.session("shop", "s1")
        assert (await s.turn("order two", turn_id="t1")).text == "Ordered both."
        assert orders(db) == 2
        history = await s.history()
        asked = history[1]  # the model asked for the first order; its result is owed
        assert asked.kind == "model"
        with pytest.raises(ForkRerunsToolsError, match=r"create_order \(call o0\)") as refused:
            await s.fork("f-refused", asked)
        assert refused.value.calls == [("o0", "create_order")]
        assert not (await rt.session("shop", "f-refused").summary()).exists
        assert orders(db) == 2
        # Recorded: both calls answered with what the source's calls returned; no row added.
        recorded = await fork_recorded(s, "f-recorded", asked, timeout=WAIT)
        r = await recorded.result("t1", timeout=WAIT)
        assert (r.status, r.text) == ("completed", "Ordered both.")
        assert orders(db) == 2
        results = [m.result for m in await recorded.transcript() if m.role == "tool"]
        assert results == [m.result for m in await s.transcript() if m.role == "tool"]
        # Live: the calls run again, for real.
        live = await s.fork("f-live", asked, tools="live")
        assert (await live.result("t1", timeout=WAIT)).status == "completed"
        assert orders(db) == 4
        # At a turn's end nothing is owed: no question asked.
        await s.fork("f-end", history[-1])
        assert orders(db) == 4
