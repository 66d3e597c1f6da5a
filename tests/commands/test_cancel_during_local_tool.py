"""F7 cancellation: a cancel, a replace or a reset sent while a local tool (a plain ``def``,
run inside its step's transaction) runs ends the turn at the next boundary — the batch's next
calls answered ``{"cancelled": true}``, no further model call — and the cancel returns while
the tool still runs, with the turn's id: from this process, from another process, over HTTP.

The tool waits on a gate the test opens (a ``threading.Event``, or a file for a tool in
another process), so "while the tool runs" is a fact, not a timing.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_turns import Agent, Runtime, SqliteStore, Stop, TextDelta, ToolCall, tool
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app
from durable_turns.stores import SessionStore
from fakes.serving import serving

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""


class Gate:
    """What the local tool waits on: the test knows when it runs and when it may end."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.open = threading.Event()
        self.ran: list[str] = []

    async def wait_running(self) -> None:
        assert await asyncio.to_thread(self.running.wait, WAIT), "the tool never ran"


gate = Gate()


@tool
def hold(n: int) -> int:
    """Hold the step open until the test lets it go (a local tool)."""
    gate.ran.append(f"hold {n}")
    gate.running.set()
    assert gate.open.wait(WAIT), "the test never opened the gate"
    return n


@tool
def mark(n: int) -> int:
    """A second local call of the batch: it must not run after a cancel."""
    gate.ran.append(f"mark {n}")
    return n


class CountingModel:
    """First call: ``hold`` then ``mark``; any later call answers (and is counted)."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        """The turn of each call, in order."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.asked.append(request.turn_id or "")
        if calls_this_turn(request) == 0 and request.messages[-1].text != "after":
            yield ToolCall("c1", "hold", {"n": 1})
            yield ToolCall("c2", "mark", {"n": 2})
            yield Stop("tool_use")
            return
        yield TextDelta("answered")
        yield Stop("end_turn")


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    global gate
    gate = Gate()


def make_runtime(store: SessionStore, model: CountingModel) -> Runtime:
    return Runtime([Agent("ops", "", [hold, mark])], store, model)


async def cancelled_at_the_boundary(rt: Runtime, turn_id: str, model: CountingModel,
                                    reason: str) -> None:
    s = rt.session("ops", "s1")
    r = await asyncio.wait_for(s.result(turn_id), WAIT)
    assert (r.status, r.reason) == ("cancelled", reason)
    tools = [(m.call_id, m.result) for m in await s.transcript()
             if m.role == "tool" and m.turn_id == turn_id]
    # What committed stays: the call that ran keeps its result; the next one never ran.
    assert tools == [("c1", 1), ("c2", {"cancelled": True})]
    assert gate.ran == ["hold 1"]
    assert model.asked.count(turn_id) == 1  # no model call after the cancel


async def test_a_cancel_while_a_local_tool_runs_returns_at_once_and_ends_the_turn(
    store: SessionStore,
) -> None:
    model = CountingModel()
    rt = make_runtime(store, model)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("go")
    await gate.wait_running()
    # Returns while the tool still holds its step open (the gate is shut until it did).
    ids = await asyncio.wait_for(s.cancel(t.turn_id, reason="stop now"), WAIT)
    assert ids == [t.turn_id]
    gate.open.set()
    await cancelled_at_the_boundary(rt, t.turn_id, model, "stop now")
    await rt.close()


async def test_a_replace_while_a_local_tool_runs_ends_the_turn_at_the_boundary(
    store: SessionStore,
) -> None:
    model = CountingModel()
    rt = make_runtime(store, model)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("go")
    await gate.wait_running()
    replacing = asyncio.create_task(s.start("after", turn_id="d", replace=True))
    await asyncio.wait_for(cancel_seen(s, t.turn_id), WAIT)
    gate.open.set()
    assert (await asyncio.wait_for(replacing, WAIT)).new
    await cancelled_at_the_boundary(rt, t.turn_id, model, "superseded by turn d")
    assert (await asyncio.wait_for(s.result("d"), WAIT)).text == "answered"
    await rt.close()


async def test_a_reset_while_a_local_tool_runs_ends_the_turn_at_the_boundary(
    store: SessionStore,
) -> None:
    model = CountingModel()
    rt = make_runtime(store, model)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("go")
    await gate.wait_running()
    resetting = asyncio.create_task(s.reset())
    await asyncio.wait_for(cancel_seen(s, t.turn_id), WAIT)
    gate.open.set()
    assert (await asyncio.wait_for(resetting, WAIT)).generation == 1
    r = await s.result(t.turn_id)
    assert (r.status, r.reason) == ("cancelled", "reset")
    assert gate.ran == ["hold 1"] and model.asked.count(t.turn_id) == 1
    archived = (await s.archive(0)).messages
    assert [(m.call_id, m.result) for m in archived if m.role == "tool"] == [
        ("c1", 1), ("c2", {"cancelled": True})]
    await rt.close()


async def cancel_seen(s: Any, turn_id: str) -> None:
    """Until the turn's record shows the durable cancel (a bounded poll of the store)."""
    while (rec := await s.entry(turn_id)) is None or rec.cancel is None:
        await asyncio.sleep(0.01)


# -- from another process ----------------------------------------------------------------

CHILD = """
import asyncio, sys, pathlib
from durable_turns import Runtime, SqliteStore, PostgresStore, Agent, ToolCall, tool
from durable_turns.models import ScriptedModel, ModelReply

kind, url, marks = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
store = SqliteStore(url) if kind == "sqlite" else PostgresStore(url)

@tool
def hold(n: int) -> int:
    '''Writes a mark, then holds its step open until the gate file appears.'''
    with (marks / "ran").open("a") as f:
        f.write(f"hold {n}\\n")
    import time
    for _ in range(3000):  # a bounded wait on a file another process writes
        if (marks / "gate").exists():
            return n
        time.sleep(0.01)
    raise SystemExit("the gate never opened")

@tool
def mark(n: int) -> int:
    '''Must not run after the cancel.'''
    with (marks / "ran").open("a") as f:
        f.write(f"mark {n}\\n")
    return n

def reply(request):
    from durable_turns.models.scripted import calls_this_turn
    with (marks / "models").open("a") as f:
        f.write("call\\n")
    if calls_this_turn(request) == 0:
        return ModelReply("", [ToolCall("c1", "hold", {"n": 1}), ToolCall("c2", "mark", {"n": 2})])
    return ModelReply("answered")

async def main():
    async with Runtime([Agent("ops", "", [hold, mark])], store, ScriptedModel(reply)) as rt:
        s = rt.session("ops", "s1")
        await s.start("go", turn_id="t1")
        r = await s.result("t1", timeout=60)
        (marks / "result").write_text(f"{r.status} {r.reason}")

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_cancel_from_another_process_while_its_local_tool_runs(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    from conftest import pg_schema_dsn

    url = str(tmp_path / "db.sqlite") if kind == "sqlite" else pg_schema_dsn()
    marks = tmp_path / "marks"
    marks.mkdir()
    child = subprocess.Popen([sys.executable, "-c", CHILD, kind, url, str(marks)])
    try:
        deadline = time.monotonic() + WAIT
        while not (marks / "ran").exists():  # a bounded poll of the child's file
            assert child.poll() is None, "the child ended before its tool ran"
            assert time.monotonic() < deadline, "the child's tool never ran"
            await asyncio.sleep(0.02)
        if kind == "sqlite":
            store: SessionStore = SqliteStore(url)
        else:
            from durable_turns import PostgresStore

            store = PostgresStore(url)
        async with Runtime([Agent("ops", "", [hold, mark])], store, CountingModel()) as rt:
            # Returns while the child's tool holds its step (and SQLite's write lock) open.
            ids = await asyncio.wait_for(rt.session("ops", "s1").cancel("t1", reason="away"),
                                         WAIT)
            assert ids == ["t1"]
            (marks / "gate").write_text("open")
            assert child.wait(WAIT) == 0
            assert (marks / "result").read_text() == "cancelled away"
            assert (marks / "ran").read_text() == "hold 1\n"
            assert (marks / "models").read_text() == "call\n"
            tools = [(m.call_id, m.result) for m in await rt.session("ops", "s1").transcript()
                     if m.role == "tool"]
            assert tools == [("c1", 1), ("c2", {"cancelled": True})]
    finally:
        (marks / "gate").write_text("open")
        if child.poll() is None:
            child.kill()
        child.wait(WAIT)


# -- over HTTP ---------------------------------------------------------------------------

async def test_post_cancel_while_a_local_tool_runs_answers_at_once(tmp_path: Path) -> None:
    model = CountingModel()
    async with Runtime([Agent("ops", "", [hold, mark])], SqliteStore(tmp_path / "db"),
                       model) as rt:
        app = create_app(rt)
        base = "/agents/ops/sessions/s1"
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            t = await rt.session("ops", "s1").start("go", turn_id="t1")
            await gate.wait_running()
            r = await c.post(f"{base}/cancel", json={"turn_id": t.turn_id, "reason": "http"})
            assert r.status_code == 200 and r.json() == {"cancelled": ["t1"]}
            gate.open.set()
            await cancelled_at_the_boundary(rt, "t1", model, "http")


# -- durable at once -----------------------------------------------------------------------

CANCELLER = """
import asyncio, os, signal, sys
from durable_turns import Agent, Runtime, SqliteStore
from durable_turns.models.scripted import scripted

async def main():
    rt = Runtime([Agent("ops")], SqliteStore(sys.argv[1]), scripted([]))
    await rt.open()
    ids = await rt.session("ops", "s1").cancel("t1", reason="then died")
    print(",".join(ids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # before its fold into the chain can run

asyncio.run(main())
"""


async def test_a_cancel_is_durable_once_it_returns_even_if_its_sender_dies(
    tmp_path: Path,
) -> None:
    db = tmp_path / "db.sqlite"
    model = CountingModel()
    async with Runtime([Agent("ops", "", [hold, mark])], SqliteStore(db), model) as rt:
        t = await rt.session("ops", "s1").start("go", turn_id="t1")
        await gate.wait_running()
        # Another process cancels while the tool holds SQLite's write lock, and is killed
        # as soon as the cancel returned: what it returned must hold.
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CANCELLER, str(db), stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(child.communicate(), WAIT)
        assert child.returncode == -9 and out.decode().strip() == "t1"
        gate.open.set()
        await cancelled_at_the_boundary(rt, t.turn_id, model, "then died")
