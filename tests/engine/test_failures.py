"""Failure semantics (F2): ordinary failures leave a valid session, transient ones are retried,
the Model seam is checked, and a failed turn can be retried."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durable_turns import (
    Agent,
    FatalToolError,
    MemoryStore,
    Message,
    ModelReply,
    Runtime,
    SqliteStore,
    Stop,
    TextDelta,
    ToolCall,
    ToolContext,
    TurnConflictError,
    scripted,
    tool,
)
from durable_turns.errors import ToolCrashedError
from durable_turns.events import TurnEvent
from durable_turns.models import ModelRequest, anthropic
from durable_turns.records import NewEntry, TurnResult, TurnStatus
from durable_turns.stores import SessionStore
from fakes.anthropic_api import Fail, Reply, Text, ToolUse, anthropic_app
from fakes.serving import serving


def fast(*tools: Any) -> Agent:
    """The agent, retrying a transient model failure three times, quickly."""
    return Agent("ops", "You are terse.", list(tools), model_retries=3, model_retry_delay=0.01)


@tool
def lookup(order: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order": order, "state": "shipped"}


@tool
def explode(order: str) -> dict[str, Any]:
    """A tool whose deployment is broken."""
    raise FatalToolError("the deployment has no database")


@contextlib.asynccontextmanager
async def anthropic_at(app: Any) -> AsyncIterator[Any]:
    """The official SDK on a local fake of the Messages API (no SDK retries)."""
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0)
        try:
            yield model
        finally:
            await model.aclose()


async def test_a_failed_batch_leaves_every_call_answered_for_the_next_turn(
    tmp_path: Path,
) -> None:
    app = anthropic_app([
        Reply([ToolUse("explode", {"order": "42"}, id="c1"),
               ToolUse("lookup", {"order": "42"}, id="c2")]),
        Reply([Text("Sorry, the order service is down.")]),
    ])
    async with anthropic_at(app) as model:
        agent = fast(explode, lookup)
        async with Runtime([agent], SqliteStore(tmp_path / "s.db"), model) as rt:
            s = rt.session("ops", "s1")
            first = await s.turn("where is order 42?")
            assert first.status == "failed" and "no database" in (first.error or "")
            # The provider answers the next turn: its request had a result for every call.
            second = await s.turn("and now?")
            transcript = await s.transcript()
    assert second.status == "completed", second.error
    assert second.text == "Sorry, the order service is down."
    tool_msgs = [m for m in transcript if m.role == "tool"]
    assert [(m.call_id, m.is_error) for m in tool_msgs] == [("c1", True), ("c2", True)]
    assert all(m.result == {"error": f"turn failed: {first.error}"} for m in tool_msgs)
    sent = app.state.requests[-1]["body"]["messages"]
    results = [b["tool_use_id"] for b in sent[2]["content"] if b["type"] == "tool_result"]
    assert results == ["c1", "c2"]


async def test_a_cut_stream_is_asked_again_and_commits_one_reply(tmp_path: Path) -> None:
    app = anthropic_app([
        Reply([Text("Looking that up for you now")], cut_after=4),
        Reply([Text("Looking that up for you now")], cut_after=4),
        Reply([Text("Order 42 has shipped.")]),
    ])
    seen: list[TurnEvent] = []
    async with anthropic_at(app) as model:
        agent = fast(lookup)
        async with Runtime([agent], SqliteStore(tmp_path / "s.db"), model) as rt:
            s = rt.session("ops", "s1")
            s.observe(seen.append)
            r = await s.turn("where is order 42?", turn_id="t1")
            transcript = await s.transcript()
            logged = await s.events()
    assert (r.status, r.text) == ("completed", "Order 42 has shipped.")
    assert [m.role for m in transcript] == ["user", "assistant"]
    retries = [e for e in seen if e.type == "message.retry"]
    assert [getattr(e, "attempt", None) for e in retries] == [1, 2]
    assert all("before message_stop" in getattr(e, "error", "") for e in retries)
    assert len(app.state.requests) == 3
    # Retries are live news, never stored.
    assert "message.retry" not in {e.type for e in logged}



class _FailsFirst:
    """A custom model whose stream raises ``error`` (after a delta) on its first ``times``
    calls, then answers."""

    def __init__(self, error: Exception, times: int) -> None:
        self.error = error
        self.times = times
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.calls += 1
        if self.calls <= self.times:
            yield TextDelta("Looking")
            raise self.error
        yield TextDelta("Order 42 has shipped.")
        yield Stop("end_turn")


@pytest.mark.parametrize("error", [
    ConnectionResetError(104, "Connection reset by peer"),
    ConnectionRefusedError(111, "Connection refused"),
    BrokenPipeError(32, "Broken pipe"),
    TimeoutError("read timed out"),
], ids=lambda e: type(e).__name__)
async def test_a_custom_models_connection_error_or_timeout_is_asked_again(
    error: Exception,
) -> None:
    model = _FailsFirst(error, times=2)
    seen: list[TurnEvent] = []
    async with Runtime([fast(lookup)], MemoryStore(), model) as rt:
        s = rt.session("ops", "s1")
        s.observe(seen.append)
        r = await s.turn("where is order 42?", turn_id="t1")
        transcript = await s.transcript()
    assert (r.status, r.text) == ("completed", "Order 42 has shipped.")
    assert model.calls == 3
    retries = [e for e in seen if e.type == "message.retry"]
    assert [getattr(e, "attempt", None) for e in retries] == [1, 2]
    assert all(type(error).__name__ in getattr(e, "error", "") for e in retries)
    assert [m.role for m in transcript] == ["user", "assistant"]


async def test_a_custom_models_other_error_is_not_asked_again() -> None:
    model = _FailsFirst(ValueError("bad key"), times=1)
    async with Runtime([fast(lookup)], MemoryStore(), model) as rt:
        r = await rt.session("ops", "s1").turn("where is order 42?", turn_id="t1")
    assert r.status == "failed" and "raised ValueError: bad key" in (r.error or "")
    assert model.calls == 1


async def test_a_provider_down_past_the_retries_fails_and_retry_completes(
    tmp_path: Path,
) -> None:
    down = [Fail(529, "Overloaded", error_type="overloaded_error") for _ in range(4)]
    app = anthropic_app([Reply([ToolUse("lookup", {"order": "42"}, id="c1")]), *down])
    async with anthropic_at(app) as model:
        agent = fast(lookup)
        async with Runtime([agent], SqliteStore(tmp_path / "s.db"), model) as rt:
            s = rt.session("ops", "s1")
            r = await s.turn("where is order 42?", turn_id="t1")
            assert r.status == "failed" and "HTTP 529" in (r.error or "")
            assert "gave up after 4 attempts" in (r.error or "")
            app.state.script.append(Reply([Text("Order 42 has shipped.")]))  # back up
            started = await s.retry("t1")
            done = await s.result(started.turn_id, timeout=30)
            transcript = await s.transcript()
    assert (done.status, done.text, done.error) == ("completed", "Order 42 has shipped.", None)
    # The finished steps stayed: one opening, one call, one result, one final reply.
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]


async def test_redelivery_returns_the_stored_result_and_other_text_conflicts(
    store: SessionStore,
) -> None:
    rt = Runtime([Agent("ops")], store, scripted([ModelReply("once")]))
    await rt.open()
    s = rt.session("ops", "s1")
    r = await s.turn("hello", turn_id="t1")
    again = await s.turn("hello", turn_id="t1")
    assert again == r and again.text == "once"
    with pytest.raises(TurnConflictError, match="other text") as e:
        await s.start("something else", turn_id="t1")
    assert (e.value.turn_id, e.value.session) == ("t1", "ops/s1")
    assert len(await s.transcript()) == 2
    await rt.close()


async def test_retry_refuses_a_turn_that_did_not_fail(store: SessionStore) -> None:
    rt = Runtime([Agent("ops")], store, scripted([ModelReply("fine")]))
    await rt.open()
    s = rt.session("ops", "s1")
    await s.turn("hello", turn_id="t1")
    with pytest.raises(TurnConflictError, match="completed, not failed"):
        await s.retry("t1")
    with pytest.raises(LookupError):
        await s.retry("nope")
    await rt.close()


async def test_result_times_out(store: SessionStore) -> None:
    gate = asyncio.Event()

    @tool
    async def wait_for_gate() -> str:
        """Wait."""
        await asyncio.wait_for(gate.wait(), timeout=30)
        return "open"

    model = scripted([ModelReply("", [ToolCall("c1", "wait_for_gate", {})]), ModelReply("ok")])
    rt = Runtime([Agent("ops", "", [wait_for_gate])], store, model)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("go")
    with pytest.raises(TimeoutError, match="did not end"):
        await s.result(t.turn_id, timeout=0.05)
    gate.set()
    assert (await s.result(t.turn_id, timeout=30)).text == "ok"
    await rt.close()


async def test_result_drives_a_turn_left_running_with_no_live_lease(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SqliteStore(db)
    await store.open()
    # What a process killed mid-turn leaves: a turn marked running, no lease held.
    key = Runtime([Agent("ops")], store).key("ops", "s1")
    await store.enqueue(key, NewEntry("t1", Message("user", "hello", turn_id="t1")))
    lease = await store.claim(key)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
        tx.set_status("running")
    await lease.release()
    await store.close()
    async with Runtime([Agent("ops")], SqliteStore(db), scripted([ModelReply("done")])) as rt:
        r = await rt.session("ops", "s1").result("t1", timeout=30)
    assert (r.status, r.text) == ("completed", "done")


class _Yields:
    """A custom model that yields exactly what it is given (to break the seam on purpose)."""

    def __init__(self, *events: Any) -> None:
        self.events = events

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        for e in self.events:
            if isinstance(e, BaseException):
                raise e
            yield e


@pytest.mark.parametrize("events, problem", [
    ((ToolCall(None, "lookup", {}), Stop("tool_use")), "has no id"),  # type: ignore[arg-type]
    ((ToolCall("c1", "lookup", {}), ToolCall("c1", "lookup", {}), Stop("tool_use")),
     "share the id 'c1'"),
    ((ToolCall("c1", "", {}), Stop("tool_use")), "has no name"),
    ((ToolCall("c1", "lookup", ["x"]), Stop("tool_use")), "must be an object"),  # type: ignore[arg-type]
    (("plain text", Stop("end_turn")), "yielded a str"),
    (({"text": "hi"}, Stop("end_turn")), "yielded a dict"),
    ((TextDelta(123), Stop("end_turn")), "TextDelta.text is a int"),  # type: ignore[arg-type]
    ((TextDelta("hi"),), "ended without a Stop"),
    ((Stop("end_turn"), TextDelta("late")), "after its Stop"),
    ((TextDelta("hi"), Stop("end_turn", usage="lots")), "Stop.usage"),  # type: ignore[arg-type]
    ((TextDelta("hi"), ValueError("bad key")), "raised ValueError: bad key"),
])
async def test_the_model_seam_is_checked_and_nothing_commits(
    store: SessionStore, events: tuple[Any, ...], problem: str,
) -> None:
    rt = Runtime([Agent("ops", "", [lookup], model_retries=0)], store, _Yields(*events))
    await rt.open()
    s = rt.session("ops", "s1")
    r = await s.turn("go")
    assert r.status == "failed"
    assert "_Yields" in (r.error or "") and problem in (r.error or ""), r.error
    assert "internal error" not in (r.error or "")
    assert [m.role for m in await s.transcript()] == ["user"]
    await rt.close()


async def test_stop_without_usage_is_no_usage(store: SessionStore) -> None:
    rt = Runtime([Agent("ops")], store, _Yields(TextDelta("hi"), Stop("end_turn", usage=None)))  # type: ignore[arg-type]
    await rt.open()
    r = await rt.session("ops", "s1").turn("go")
    assert (r.status, r.text) == ("completed", "hi")
    assert (await rt.session("ops", "s1").transcript())[-1].usage == {}
    await rt.close()


@pytest.mark.parametrize("signal_", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("kind", ["remote", "local"])
async def test_a_tool_raising_system_exit_abandons_its_step_and_names_the_tool(
    tmp_path: Path, kind: str, signal_: type[BaseException],
) -> None:
    db = tmp_path / "s.db"
    raised: list[int] = []

    def maybe_raise() -> str:
        if not raised:
            raised.append(1)
            raise signal_(3)
        return "ok"

    @tool(name="shutdown_now")
    async def remote(ctx: ToolContext) -> str:
        """Exit the process (the first time)."""
        return maybe_raise()

    @tool(name="shutdown_now")
    def local(ctx: ToolContext) -> str:
        """Exit the process (the first time), inside the step's transaction."""
        ctx.store.unwrap().execute("INSERT INTO effects VALUES (?)", (len(raised),))
        return maybe_raise()

    model = scripted([ModelReply("", [ToolCall("c1", "shutdown_now", {})]), ModelReply("done")])
    agent = Agent("ops", "", [remote if kind == "remote" else local])
    async with Runtime([agent], SqliteStore(db), model) as rt:
        rt.store.unwrap().execute("CREATE TABLE effects (n INTEGER)")
        s = rt.session("ops", "s1")
        with pytest.raises(Exception, match=f"tool 'shutdown_now' raised {signal_.__name__}: 3"
                           ) as e:
            await s.turn("go", turn_id="t1")
        assert isinstance(e.value.__cause__, ToolCrashedError)
        assert e.value.__cause__.call_id == "c1"
        assert await s.status() == "running"  # unfinished, nothing of the step committed
        assert [m.role for m in await s.transcript()] == ["user", "assistant"]
        assert await rt.recover() == [s.key]
        r = await s.result("t1", timeout=30)
        rows = rt.store.unwrap().execute("SELECT n FROM effects").fetchall()
    assert (r.status, r.text) == ("completed", "done")
    assert rows == ([(1,)] if kind == "local" else [])  # the crashed attempt's row rolled back


async def test_an_oversized_tool_result_becomes_an_error_result(store: SessionStore) -> None:
    @tool
    def dump() -> str:
        """Return far too much."""
        return "x" * (5 * 1024 * 1024)

    model = scripted([ModelReply("", [ToolCall("c1", "dump", {})]), ModelReply("noted")])
    rt = Runtime([Agent("ops", "", [dump], max_result_bytes=1 << 20)], store, model)
    await rt.open()
    s = rt.session("ops", "s1")
    r = await s.turn("go")
    (result,) = [m for m in await s.transcript() if m.role == "tool"]
    assert r.status == "completed" and result.is_error
    assert "5,242,882 bytes of JSON, over the limit of 1,048,576" in result.result["error"]
    await rt.close()


OPEN_TOGETHER = textwrap.dedent("""
    import asyncio, os, sys
    from durable_turns import Agent, ModelReply, Runtime, SqliteStore, scripted
    db, gate, me = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    os.read(gate, 1)  # released together: the test closes the pipe's write end

    async def main():
        async with Runtime([Agent("ops")], SqliteStore(db), scripted([ModelReply("hi")])) as rt:
            r = await rt.session("ops", me).turn("hello")
            assert r.status == "completed", r
    asyncio.run(main())
""")


@pytest.mark.parametrize("round_", range(5))
async def test_processes_opening_a_new_store_together_all_start(
    tmp_path: Path, round_: int,
) -> None:
    db = tmp_path / f"new-{round_}.sqlite"
    read, write = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_TOGETHER, str(db), str(read),
                               f"p{i}"], pass_fds=(read,), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    os.close(read)
    os.close(write)
    outcomes = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outcomes
    async with Runtime([Agent("ops")], SqliteStore(db)) as rt:
        for i in range(4):
            assert await rt.session("ops", f"p{i}").status() == "idle"


HOLD_THE_LOCK = textwrap.dedent("""
    import sqlite3, sys, time, pathlib
    db, flag, seconds = sys.argv[1], pathlib.Path(sys.argv[2]), float(sys.argv[3])
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    flag.touch()
    time.sleep(seconds)  # the scenario: another process holds the write lock that long
    conn.execute("COMMIT")
""")


async def test_a_locked_database_abandons_the_step_and_drives_the_turn_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    db = tmp_path / "s.db"
    inside, go = asyncio.Event(), asyncio.Event()
    runs: list[int] = []

    @tool
    async def ship(order: str) -> dict[str, Any]:
        """Ship an order (remote: at least once)."""
        runs.append(1)
        inside.set()
        await asyncio.wait_for(go.wait(), timeout=30)
        return {"order": order, "shipped": True}

    model = scripted([ModelReply("", [ToolCall("c1", "ship", {"order": "42"})]),
                      ModelReply("shipped")])
    async with Runtime([Agent("ops", "", [ship])], SqliteStore(db, busy_timeout=0.05),
                       model) as rt:
        s = rt.session("ops", "s1")
        t = await s.start("ship 42", turn_id="t1")
        await asyncio.wait_for(inside.wait(), timeout=30)
        flag = tmp_path / "locked"
        holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(db), str(flag),
                                   "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            async with asyncio.timeout(30):
                while not flag.exists():
                    assert holder.poll() is None, holder.communicate()
                    await asyncio.sleep(0.005)
            with caplog.at_level("WARNING", logger="durable_turns"):
                go.set()  # the tool's step now commits into a locked database
                r = await s.result(t.turn_id, timeout=60)
            assert holder.wait(timeout=30) == 0
        finally:
            if holder.poll() is None:
                holder.kill()
            holder.communicate()
        transcript = await s.transcript()
    assert (r.status, r.text) == ("completed", "shipped")
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]
    assert "database is locked" in caplog.text and "driving it again" in caplog.text
    assert len(runs) >= 2  # the abandoned step ran again: at least once, as promised


async def test_cli_sessions_retry_reopens_a_failed_turn_for_the_next_worker(
    tmp_path: Path,
) -> None:
    from durable_turns.errors import ModelError

    db = tmp_path / "s.db"

    def down(request: ModelRequest) -> ModelReply:
        raise ModelError("provider: HTTP 401 authentication_error", provider="provider")

    async with Runtime([Agent("ops")], SqliteStore(db), scripted(down)) as rt:
        r = await rt.session("ops", "s1").turn("hello", turn_id="t1")
        assert r.status == "failed"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "durable_turns.cli", "sessions", "retry",
                               "--db", str(db), *args], capture_output=True, text=True,
                              timeout=120, check=False)

    nope = cli("--turn", "nope")
    assert nope.returncode == 2 and "no session of" in nope.stderr
    assert "Traceback" not in nope.stderr
    done = cli("--turn", "t1")
    assert done.returncode == 0, done.stderr
    assert "turn t1 of ops/s1 re-opened" in done.stdout
    again = cli("--turn", "t1")  # asked twice before a worker ran it: one retry
    assert again.returncode == 0, again.stderr
    async with Runtime([Agent("ops")], SqliteStore(db), scripted([ModelReply("hi")])) as rt:
        (entry,) = [t for t in await rt.store.entries(rt.key("ops", "s1")) if t.kind == "retry"]
        assert await rt.recover() == [rt.key("ops", "s1")]
        await rt.session("ops", "s1").result(entry.turn_id, timeout=30)  # the turn re-opened
        r = await rt.session("ops", "s1").result("t1", timeout=30)
        retries = [t for t in await rt.store.entries(rt.key("ops", "s1")) if t.kind == "retry"]
    assert (r.status, r.text, r.error) == ("completed", "hi", None)
    assert [t.status for t in retries] == ["completed"]
    assert cli("--turn", "t1").returncode == 1  # completed now: nothing to retry
