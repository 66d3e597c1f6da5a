"""F2, F5: The turn loop on every store: steps, events, tool errors, model stops, the chain."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import pytest

from durable_turns import (
    Agent,
    FatalToolError,
    ModelReply,
    Runtime,
    Stop,
    TextDelta,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.errors import ConfigurationError, UnknownAgentError, UnknownTurnError
from durable_turns.events import TurnEvent
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.stores import SessionStore


def _placeholder(h: Any) -> str:
    """The raw handle's parameter marker: ``%s`` for psycopg, ``?`` for sqlite3."""
    return "?" if isinstance(h, sqlite3.Connection) else "%s"


def _has_table(h: Any, name: str) -> bool:
    if not isinstance(h, sqlite3.Connection):
        sql = ("SELECT count(*) FROM information_schema.tables "
               "WHERE table_schema = current_schema() AND table_name = %s")
    else:
        sql = "SELECT count(*) FROM sqlite_master WHERE name = ?"
    return bool(h.execute(sql, (name,)).fetchone()[0])


@tool
def record(value: str, ctx: ToolContext) -> dict[str, str]:
    """Write a row through the store's own handle (exactly once on SQL stores)."""
    h = ctx.store.unwrap()
    if h is not None:
        h.execute("CREATE TABLE IF NOT EXISTS rows (v TEXT)")
        h.execute(f"INSERT INTO rows (v) VALUES ({_placeholder(h)})", (value,))
    return {"recorded": value}


@tool
def record_then_fail(value: str, ctx: ToolContext) -> None:
    """Write a row, then raise: the row must be rolled back."""
    record.run({"value": value}, ctx)
    raise ValueError(f"could not finish {value}")


@tool
async def remote(text: str) -> str:
    """A remote call."""
    return text.upper()


@tool
async def fail_plain(msg: str) -> None:
    """Raise a plain Exception."""
    raise Exception(msg)


@tool
async def fail_fatal() -> None:
    """Raise FatalToolError."""
    raise FatalToolError("the deployment has no database")


@tool
def returns_set() -> Any:
    """Return something that is not JSON."""
    return {1, 2}


def _returns_coroutine(input: dict[str, Any], ctx: ToolContext) -> Any:
    return remote.run({"text": "x"}, ctx)


from durable_turns import Tool, ToolSpec  # noqa: E402
from durable_turns.testing import step_result  # noqa: E402

forgot_async = Tool(ToolSpec("forgot_async", "A plain def that awaits."), _returns_coroutine)

TOOLS = [record, record_then_fail, remote, fail_plain, fail_fatal, returns_set, forgot_async]


def call(name: str, cid: str, **args: Any) -> ToolCall:
    return ToolCall(cid, name, args)


def runtime(store: SessionStore, replies: Any, **kw: Any) -> Runtime:
    return Runtime([Agent("ops", "You run ops.", TOOLS)], store, scripted(replies), **kw)


async def seen_until(seen: list[TurnEvent], last: str) -> None:
    """Wait (bounded) until an observer has been handed an event of type ``last``: observers
    are called from their own task, which on a store whose reads leave the loop (PostgreSQL)
    may still be catching up when ``turn()`` returns."""
    async with asyncio.timeout(10):
        while not any(e.type == last for e in seen):
            await asyncio.sleep(0.005)


def types(events: list[TurnEvent]) -> list[str]:
    return [e.type for e in events]


async def test_a_turn_runs_tools_and_logs_every_step(store: SessionStore) -> None:
    rt = runtime(store, [
        ModelReply("Recording.", [call("record", "c1", value="a"), call("remote", "c2", text="b")]),
        ModelReply("Done: a, B."),
    ])
    s = rt.session("ops", "s1")
    seen: list[TurnEvent] = []
    s.observe(seen.append, turn_id="t1")
    r = await s.turn("record a and shout b", turn_id="t1")
    assert (r.status, r.text) == ("completed", "Done: a, B.")
    await seen_until(seen, "turn.completed")
    assert types([e for e in seen if e.type != "message.delta"]) == [
        "turn.started", "message.completed", "action.requested", "action.requested",
        "action.completed", "action.completed", "message.completed", "turn.completed",
    ]
    streamed = "".join(e.to_dict()["text"] for e in seen if e.type == "message.delta")
    assert streamed == "Recording.Done: a, B."
    durable = [e for e in seen if e.type != "message.delta"]
    assert [e.seq for e in durable] == list(range(1, 9))
    # Logged events are exactly the durable ones, deltas never persisted.
    assert [e.to_dict() for e in await s.events()] == [e.to_dict() for e in durable]
    msgs = await s.transcript()
    assert [(m.role, m.call_id) for m in msgs] == [
        ("user", None), ("assistant", None), ("tool", "c1"), ("tool", "c2"), ("assistant", None)
    ]
    assert msgs[2].result == {"recorded": "a"} and msgs[3].result == "B"
    assert all(m.turn_id == "t1" for m in msgs)
    assert await s.status() == "idle"
    if store.capabilities.exactly_once_local:
        assert store.unwrap().execute("SELECT v FROM rows").fetchall() == [("a",)]
    steps = [await step_result(store, s.key, sid) for sid in ("model:1", "tool:1:c1", "tool:1:c2",
                                                           "model:4")]
    assert all(steps)
    await rt.close()


async def test_tool_errors_become_results_and_local_writes_roll_back(store: SessionStore) -> None:
    long = "x" * 5000
    rt = runtime(store, [
        ModelReply("", [
            call("record_then_fail", "c1", value="ghost"),
            call("fail_plain", "c2", msg="plain words"),
            call("fail_plain", "c3", msg=long),
            call("returns_set", "c4"),
            call("nope", "c5"),
            call("record", "c6", valu="typo"),
        ]),
        ModelReply("Handled."),
    ])
    s = rt.session("ops", "s1")
    seen: list[TurnEvent] = []
    s.observe(seen.append)
    r = await s.turn("try things")
    assert r.status == "completed"
    await seen_until(seen, "turn.completed")
    results = {m.call_id: m for m in await s.transcript() if m.role == "tool"}
    assert results["c1"].result == {"error": "ValueError: could not finish ghost"}
    assert results["c2"].result == {"error": "plain words"}
    assert len(results["c3"].result["error"]) == 2000
    assert "JSON-serialisable" in results["c4"].result["error"]
    assert results["c5"].result == {"error": "unknown tool: nope"}
    assert results["c6"].result["error"] == \
        "invalid input for record: 'value' is a required property"
    assert all(m.is_error for m in results.values())
    assert not any("Traceback" in str(m.result) for m in results.values())
    completed = [e for e in seen if e.type == "action.completed"]
    assert [getattr(e, "error", None) for e in completed] == [
        m.result["error"] for m in results.values()
    ]
    if store.capabilities.exactly_once_local:
        # the failing tool's CREATE TABLE and INSERT were rolled back together
        assert not _has_table(store.unwrap(), "rows")
    await rt.close()


async def test_fatal_tool_error_fails_the_turn(store: SessionStore) -> None:
    rt = runtime(store, [ModelReply("", [call("fail_fatal", "c1")]), ModelReply("never")])
    s = rt.session("ops", "s1")
    seen: list[TurnEvent] = []
    s.observe(seen.append)
    r = await s.turn("go")
    assert r.status == "failed" and r.error == "the deployment has no database"
    await seen_until(seen, "turn.failed")
    assert seen[-1].type == "turn.failed"
    # The call it owed is answered in the transaction that ended it: the log stays valid.
    msgs = await s.transcript()
    assert [m.role for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[2].call_id == "c1" and msgs[2].is_error
    assert msgs[2].result == {"error": "turn failed: the deployment has no database"}
    assert await s.status() == "idle"
    await rt.close()


async def test_plain_def_returning_an_awaitable_fails_clearly(store: SessionStore) -> None:
    rt = runtime(store, [ModelReply("", [call("forgot_async", "c1")])])
    r = await rt.session("ops", "s1").turn("go")
    assert r.status == "failed"
    assert r.error is not None and "forgot_async" in r.error and "async def" in r.error
    msgs = await rt.session("ops", "s1").transcript()
    # Never recorded as {}: the call is answered with the turn's failure.
    assert [m.result for m in msgs if m.role == "tool"] == [{"error": f"turn failed: {r.error}"}]
    await rt.close()


class _Stream:
    """A model that streams fixed events (to test stops the scripted model cannot make)."""

    def __init__(self, *events: ModelEvent) -> None:
        self.events = events
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        for e in self.events:
            yield e


@pytest.mark.parametrize("reason", ["max_tokens", "content_filter", "refusal"])
async def test_abnormal_stop_with_empty_reply_fails_before_commit(
    store: SessionStore, reason: str
) -> None:
    rt = Runtime([Agent("ops", "", TOOLS)], store, _Stream(Stop(reason)))
    s = rt.session("ops", "s1")
    r = await s.turn("go")
    assert r.status == "failed" and reason in (r.error or "")
    assert [m.role for m in await s.transcript()] == ["user"]
    assert await step_result(store, s.key, "model:1") is None
    await rt.close()


async def test_abnormal_stop_with_content_still_commits(store: SessionStore) -> None:
    model = _Stream(TextDelta("partial"), Stop("max_tokens"))
    rt = Runtime([Agent("ops", "", TOOLS)], store, model)
    r = await rt.session("ops", "s1").turn("go")
    assert (r.status, r.text) == ("completed", "partial")
    await rt.close()


async def test_a_stream_without_stop_fails_the_step(store: SessionStore) -> None:
    rt = Runtime([Agent("ops", "", TOOLS)], store, _Stream(TextDelta("cut off")))
    s = rt.session("ops", "s1")
    r = await s.turn("go")
    assert r.status == "failed" and "ended without a Stop" in (r.error or "")
    assert "_Stream" in (r.error or "")  # the model's failure, named, not the engine's
    assert [m.role for m in await s.transcript()] == ["user"]
    await rt.close()


async def test_turns_of_a_session_run_in_order_and_scripts_count_per_turn(
    store: SessionStore,
) -> None:
    rt = runtime(store, [ModelReply("", [call("remote", "c1", text="x")]), ModelReply("ok")])
    s = rt.session("ops", "s1")
    ids = [(await s.start(f"turn {i}")).turn_id for i in range(3)]
    results = [await s.result(t) for t in ids]
    assert [r.status for r in results] == ["completed"] * 3
    openings = [m.text for m in await s.transcript() if m.role == "user"]
    assert openings == ["turn 0", "turn 1", "turn 2"]
    await rt.close()


async def test_redelivering_a_finished_turn_changes_nothing(store: SessionStore) -> None:
    rt = runtime(store, [ModelReply("once")])
    s = rt.session("ops", "s1")
    first = await s.turn("hi", turn_id="t1")
    again = await s.start("hi", turn_id="t1")
    assert not again.new
    assert await s.result("t1") == first
    assert len(await s.transcript()) == 2
    await rt.close()


async def test_observe_replay_folds_the_log_before_live_events(store: SessionStore) -> None:
    rt = runtime(store, [ModelReply("", [call("remote", "c1", text="x")]), ModelReply("ok")])
    s = rt.session("ops", "s1")
    await s.turn("one", turn_id="t1")
    got: list[TurnEvent] = []
    done = asyncio.Event()

    def cb(e: TurnEvent) -> None:
        got.append(e)
        if e.type == "turn.completed" and e.turn_id == "t2":
            done.set()

    s.observe(cb, replay=True)
    await s.start("two", turn_id="t2")
    await asyncio.wait_for(done.wait(), 30)
    durable = [e for e in got if e.type != "message.delta"]
    assert [e.seq for e in durable] == list(range(1, len(durable) + 1))
    assert [e.turn_id for e in durable].count("t1") == 6
    assert types(durable)[-1] == "turn.completed"
    await rt.close()


async def test_sink_sees_every_event(store: SessionStore) -> None:
    class Sink:
        def __init__(self) -> None:
            self.events: list[TurnEvent] = []

        def emit(self, event: TurnEvent) -> None:
            self.events.append(event)

    sink = Sink()
    rt = Runtime([Agent("ops", "", TOOLS)], store, scripted([ModelReply("hey")]), sink=sink)
    await rt.session("ops", "s1").turn("hi")
    assert types(sink.events) == ["turn.started"] + ["message.delta"] * 3 + [
        "message.completed", "turn.completed"]
    await rt.close()


async def test_bad_calls_are_refused_clearly(store: SessionStore) -> None:
    rt = runtime(store, [ModelReply("ok")])
    with pytest.raises(UnknownAgentError, match="unknown agent 'nobody'"):
        rt.session("nobody", "s1")
    s = rt.session("ops", "s1")
    with pytest.raises(ValueError, match="non-empty text"):
        await s.start("  ")
    with pytest.raises(UnknownTurnError):
        await s.result("missing")
    no_model = Runtime([Agent("ops", "", TOOLS)], store)
    with pytest.raises(ConfigurationError, match="no model"):
        await no_model.session("ops", "s1").start("hi")
    await rt.close()


async def test_recover_runs_turns_accepted_before_a_stop(tmp_path: Any) -> None:
    from durable_turns import SqliteStore

    db = tmp_path / "db.sqlite"
    rt = runtime(SqliteStore(db), [ModelReply("recovered")])
    s = rt.session("ops", "s1")
    started = await s.start("hi")
    await rt.close()  # stops before the pump ran a step: the turn is durable, not run
    rt2 = runtime(SqliteStore(db), [ModelReply("recovered")])
    assert [str(k) for k in await rt2.recover()] == ["ops/s1"]
    r = await rt2.session("ops", "s1").result(started.turn_id)
    assert (r.status, r.text) == ("completed", "recovered")
    assert await rt2.recover() == []
    await rt2.close()


async def test_a_tool_that_ends_the_store_transaction_fails_the_turn(tmp_path: Any) -> None:
    from durable_turns import SqliteStore

    @tool
    def rogue(ctx: ToolContext) -> None:
        """Commits the step's transaction behind the engine's back."""
        conn: sqlite3.Connection = ctx.store.unwrap()
        conn.execute("COMMIT")

    rt = Runtime([Agent("ops", "", [rogue])], SqliteStore(tmp_path / "db.sqlite"),
                 scripted([ModelReply("", [call("rogue", "c1")])]))
    r = await rt.session("ops", "s1").turn("go")
    assert r.status == "failed" and "ended the store's transaction" in (r.error or "")
    await rt.close()


async def test_queued_turns_survive_a_stop_and_recover_runs_them_in_order(tmp_path: Any) -> None:
    from durable_turns import SqliteStore

    db = tmp_path / "db.sqlite"
    rt = runtime(SqliteStore(db), [ModelReply("ok")])
    s = rt.session("ops", "s1")
    ids = [(await s.start(f"turn {i}")).turn_id for i in range(3)]
    await rt.close()  # nothing ran: three durable, queued turns
    rt2 = runtime(SqliteStore(db), [ModelReply("ok")])
    await rt2.recover()
    s2 = rt2.session("ops", "s1")
    assert [(await s2.result(t)).status for t in ids] == ["completed"] * 3
    assert [m.text for m in await s2.transcript() if m.role == "user"] == [
        "turn 0", "turn 1", "turn 2"]
    await rt2.close()
