"""F25 steering, F7: ``start(…, mode="steer")`` while a turn runs stores the message and it
joins that turn as a user message at its next model-call boundary (after the current tool
batch), event ``message.steered``, once; with no turn running it starts one; a parked turn
refuses it; a crash between accept and join loses nothing (a real process SIGKILLed).

The local tool waits on a gate the test opens, so "while the tool runs" is a fact, not a
timing. The model says which user messages it was shown, so "joined before the next model
call" is read off what the model answered.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_turns import (
    Agent,
    AgentSession,
    Runtime,
    SessionBusyError,
    SqliteStore,
    Stop,
    TextDelta,
    ToolCall,
    ToolContext,
    tool,
)
from durable_turns.events import MessageSteered
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.stores import SessionStore

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""


class Gate:
    def __init__(self) -> None:
        self.running = threading.Event()
        self.open = threading.Event()

    async def wait_running(self) -> None:
        assert await asyncio.to_thread(self.running.wait, WAIT), "the tool never ran"


gate = Gate()


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    global gate
    gate = Gate()


@tool
def hold(n: int) -> int:
    """Hold the step open until the test lets it go (a local tool: its step holds a
    one-writer store's write lock meanwhile)."""
    gate.running.set()
    assert gate.open.wait(WAIT), "the test never opened the gate"
    return n


@tool
async def ask_first(question: str, ctx: ToolContext) -> str:
    """Park the turn on a question."""
    return str(await ctx.request_input("q", question, {"type": "string"}))


class SeeingModel:
    """First call of a turn: a tool call (``hold``, or ``ask_first`` for text "park");
    any later call answers with the user texts it was shown, joined by ``|``."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        users = [m.text for m in request.messages if m.role == "user"]
        self.asked.append(users)
        if request.messages[-1].role == "user" and len(users) == 1:
            name, args = (("ask_first", {"question": "ok?"}) if users[0] == "park"
                          else ("hold", {"n": 1}))
            yield ToolCall("c1", name, args)
            yield Stop("tool_use")
            return
        yield TextDelta("|".join(users))
        yield Stop("end_turn")


def make_runtime(store: SessionStore, model: SeeingModel) -> Runtime:
    return Runtime([Agent("ops", "", [hold, ask_first])], store, model)


async def test_a_steer_during_a_local_tool_joins_before_the_next_model_call(
    store: SessionStore,
) -> None:
    model = SeeingModel()
    async with make_runtime(store, model) as rt:
        s = rt.session("ops", "s1")
        steered: list[MessageSteered] = []
        s.observe(lambda e: steered.append(e) if isinstance(e, MessageSteered) else None)
        t = await s.start("go")
        await gate.wait_running()
        # Sent while the tool runs, and stored at once: on a store with one writer at a time
        # the tool's step holds the write lock meanwhile, and the steer is kept beside the
        # chain until the step lets the lock go (then it is appended).
        started = await asyncio.wait_for(s.start("also this", mode="steer", turn_id="st"),
                                         WAIT)
        assert (started.turn_id, started.new, started.steering) == ("st", True, t.turn_id)
        kept = await s.entry("st")
        assert kept is not None and (kept.kind, kept.status) == ("steer", "queued")
        assert not gate.open.is_set() and gate.running.is_set()  # the tool still runs
        gate.open.set()
        r = await asyncio.wait_for(s.result(t.turn_id), WAIT)
        # The second model call (after the tool batch) was shown the steered message.
        assert (r.status, r.text) == ("completed", "go|also this")
        assert model.asked == [["go"], ["go", "also this"]]
        # The steer's result is the turn's it joined.
        assert (await asyncio.wait_for(s.result("st"), WAIT)).text == "go|also this"
        log = [(m.role, m.text, m.turn_id) for m in await s.transcript()]
        assert log.count(("user", "also this", t.turn_id)) == 1
        assert [m[0] for m in log] == ["user", "assistant", "tool", "user", "assistant"]
        events = [e for e in await s.events() if isinstance(e, MessageSteered)]
        assert [(e.turn_id, e.text, e.entry_id) for e in events] == [
            (t.turn_id, "also this", "st")]
        entry = await s.entry("st")
        assert entry is not None and entry.kind == "steer" and entry.data == {
            "joined": t.turn_id}
        # A redelivery of the steer is one steer.
        again = await s.start("also this", mode="steer", turn_id="st")
        assert not again.new
        assert len([m for m in await s.transcript() if m.text == "also this"]) == 1


async def test_a_steer_with_no_turn_running_starts_one(store: SessionStore) -> None:
    model = SeeingModel()
    async with make_runtime(store, model) as rt:
        s = rt.session("ops", "s1")
        gate.open.set()
        started = await s.start("hello", mode="steer")
        assert started.steering is None
        r = await asyncio.wait_for(s.result(started.turn_id), WAIT)
        assert (r.turn_id, r.status, r.text) == (started.turn_id, "completed", "hello")
        entry = await s.entry(started.turn_id)
        assert entry is not None and entry.kind == "turn"


async def test_a_steer_of_a_parked_turn_is_refused(store: SessionStore) -> None:
    model = SeeingModel()
    async with make_runtime(store, model) as rt:
        s = rt.session("ops", "s1")
        t = await s.start("park")
        r = await asyncio.wait_for(s.result(t.turn_id), WAIT)
        assert r.status == "suspended"
        with pytest.raises(SessionBusyError):
            await s.start("and this", mode="steer")
        assert [m.text for m in await s.transcript() if m.role == "user"] == ["park"]


async def test_replace_true_and_mode_replace_are_one(store: SessionStore) -> None:
    model = SeeingModel()
    async with make_runtime(store, model) as rt:
        s = rt.session("ops", "s1")
        t = await s.start("go")
        await gate.wait_running()
        replacing = asyncio.create_task(s.start("instead", mode="replace", turn_id="r"))
        await asyncio.wait_for(cancel_seen(s, t.turn_id), WAIT)
        gate.open.set()
        await asyncio.wait_for(replacing, WAIT)
        r = await asyncio.wait_for(s.result(t.turn_id), WAIT)
        assert (r.status, r.reason) == ("cancelled", "superseded by turn r")
        with pytest.raises(ValueError, match="mode"):
            await s.start("x", mode="sideways")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="replace=True"):
            await s.start("x", mode="steer", replace=True)


async def cancel_seen(s: AgentSession, turn_id: str) -> None:
    """Until the turn's record shows the durable cancel (a poll the caller bounds)."""
    while (rec := await s.entry(turn_id)) is None or rec.cancel is None:
        await asyncio.sleep(0.01)


async def test_a_steer_too_late_for_its_turn_opens_a_turn_of_its_own(
    store: SessionStore,
) -> None:
    """The steer is accepted while the turn runs, but the turn's last model call is under
    way: there is no boundary left, so the steer opens a turn when its place comes."""
    release = asyncio.Event()
    asking = asyncio.Event()

    class SlowAnswer(SeeingModel):
        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
            users = [m.text for m in request.messages if m.role == "user"]
            self.asked.append(users)
            if users == ["go"]:
                asking.set()
                await asyncio.wait_for(release.wait(), WAIT)
            yield TextDelta("|".join(users))
            yield Stop("end_turn")

    model = SlowAnswer()
    async with make_runtime(store, model) as rt:
        s = rt.session("ops", "s1")
        t = await s.start("go")
        await asyncio.wait_for(asking.wait(), WAIT)
        st = await s.start("late", mode="steer")
        release.set()
        assert (await asyncio.wait_for(s.result(t.turn_id), WAIT)).text == "go"
        r = await asyncio.wait_for(s.result(st.turn_id), WAIT)
        assert (r.status, r.text) == ("completed", "go|late")
        assert r.turn_id == f"{st.turn_id}:turn"
        assert [m.text for m in await s.transcript() if m.role == "user"] == ["go", "late"]


# -- a crash between accept and join -------------------------------------------------------

CHILD = """
import asyncio, sys, pathlib, time
from durable_turns import Agent, Runtime, SqliteStore, PostgresStore, Stop, ToolCall, tool

kind, url, marks = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
store = SqliteStore(url) if kind == "sqlite" else PostgresStore(url, lease_ttl=1.0)

@tool
async def slow(n: int) -> int:
    '''A remote tool that holds the turn until the test kills this process.'''
    (marks / "running").write_text("yes")
    for _ in range(3000):
        await asyncio.sleep(0.01)
    raise SystemExit("never killed")

class Model:
    async def stream(self, request):
        with (marks / "models").open("a") as f:
            f.write("call\\n")
        yield ToolCall("c1", "slow", {"n": 1})
        yield Stop("tool_use")

async def main():
    async with Runtime([Agent("ops", "", [slow])], store, Model()) as rt:
        await rt.session("ops", "s1").start("go", turn_id="t1")
        await asyncio.sleep(120)

asyncio.run(main())
"""


@tool
async def slow(n: int) -> int:
    """The replayed remote tool: answers at once here."""
    return n


class Answers(SeeingModel):
    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        users = [m.text for m in request.messages if m.role == "user"]
        self.asked.append(users)
        yield TextDelta("|".join(users))
        yield Stop("end_turn")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_steer_accepted_before_a_crash_joins_once_on_replay(
    kind: str, tmp_path: Path,
) -> None:
    from conftest import pg_schema_dsn

    url = str(tmp_path / "db.sqlite") if kind == "sqlite" else pg_schema_dsn()
    marks = tmp_path / "marks"
    marks.mkdir()
    child = subprocess.Popen([sys.executable, "-c", CHILD, kind, url, str(marks)])
    try:
        deadline = time.monotonic() + WAIT
        while not (marks / "running").exists():  # a bounded poll of the child's file
            assert child.poll() is None, "the child ended before its tool ran"
            assert time.monotonic() < deadline, "the child's tool never ran"
            await asyncio.sleep(0.02)
        store: SessionStore
        if kind == "sqlite":
            store = SqliteStore(url)
        else:
            from durable_turns import PostgresStore

            store = PostgresStore(url, lease_ttl=1.0)
        model = Answers()
        rt = Runtime([Agent("ops", "", [slow])], store, model)
        async with rt:
            s = rt.session("ops", "s1")
            # Accepted while the child's turn runs its tool; the child dies before the join.
            st = await asyncio.wait_for(s.start("and this", mode="steer", turn_id="st"), WAIT)
            assert st.new
            entry = await s.entry("st")
            assert entry is not None and entry.kind == "steer" and entry.status == "queued"
            child.send_signal(signal.SIGKILL)
            assert child.wait(WAIT) == -signal.SIGKILL
            assert (marks / "models").read_text() == "call\n"
            await rt.recover()
            r = await asyncio.wait_for(s.result("st"), WAIT)
            assert (r.turn_id, r.status, r.text) == ("t1", "completed", "go|and this")
            assert model.asked == [["go", "and this"]]
            log = [(m.role, m.text) for m in await s.transcript()]
            assert log.count(("user", "and this")) == 1
            assert [role for role, _ in log] == ["user", "assistant", "tool", "user",
                                                 "assistant"]
            assert len([e for e in await s.events() if isinstance(e, MessageSteered)]) == 1
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(WAIT)


# -- a steer kept while a local tool's step holds the write lock, then a SIGKILL ------------

CHILD_LOCAL = """
import asyncio, pathlib, sys, threading
from durable_turns import Agent, Runtime, SqliteStore, Stop, ToolCall, tool

url, marks = sys.argv[1], pathlib.Path(sys.argv[2])
running, never = threading.Event(), threading.Event()

@tool
def hold_lock(n: int) -> int:
    '''A local tool: its step holds the file's write lock until the test kills us.'''
    running.set()
    never.wait(120)
    raise SystemExit("never killed")

class Model:
    async def stream(self, request):
        yield ToolCall("c1", "hold_lock", {"n": 1})
        yield Stop("tool_use")

async def main():
    async with Runtime([Agent("ops", "", [hold_lock])], SqliteStore(url), Model()) as rt:
        s = rt.session("ops", "s1")
        await s.start("go", turn_id="t1")
        assert await asyncio.to_thread(running.wait, 30), "the tool never ran"
        # The tool's step holds the write lock now: the steer must not wait for its commit.
        await s.start("and this", mode="steer", turn_id="st")
        (marks / "steered").write_text("yes")
        await asyncio.sleep(120)

asyncio.run(main())
"""


@tool
def hold_lock(n: int) -> int:
    """The replayed local tool: answers at once here."""
    return n


async def test_a_steer_during_a_local_tools_step_is_durable_before_the_step_commits(
    tmp_path: Path,
) -> None:
    """On SQLite a local tool's step holds the file's write lock while the tool runs; a steer
    sent meanwhile is stored at once (``start()`` returns), and a SIGKILL before the step
    commits loses neither: the replay runs the tool again, and the steer joins before the
    next model call, once."""
    from crashkit import wait_for_child_file

    url = str(tmp_path / "db.sqlite")
    marks = tmp_path / "marks"
    marks.mkdir()
    child = subprocess.Popen([sys.executable, "-c", CHILD_LOCAL, url, str(marks)])
    try:
        await wait_for_child_file(marks / "steered", child)
        assert child.poll() is None  # the tool still runs: its step has not committed
        child.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(child.wait, WAIT) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(WAIT)
    model = Answers()
    async with Runtime([Agent("ops", "", [hold_lock])], SqliteStore(url), model) as rt:
        s = rt.session("ops", "s1")
        entry = await s.entry("st")
        assert entry is not None and entry.kind == "steer"
        await rt.recover()
        r = await asyncio.wait_for(s.result("st"), WAIT)
        assert (r.turn_id, r.status, r.text) == ("t1", "completed", "go|and this")
        assert model.asked == [["go", "and this"]]
        log = [(m.role, m.text) for m in await s.transcript()]
        assert log.count(("user", "and this")) == 1
        assert [role for role, _ in log] == ["user", "assistant", "tool", "user", "assistant"]
        assert len([e for e in await s.events() if isinstance(e, MessageSteered)]) == 1
        again = await s.start("and this", mode="steer", turn_id="st")
        assert not again.new  # a redelivery is the same steer
