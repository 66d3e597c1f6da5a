"""Helpers for testing stores and agents, shipped with the package.

The store conformance suite: every :class:`~durable_turns.stores.SessionStore` backend must
pass every check in :data:`CONFORMANCE`. Run it from your own tests with a factory that
returns a fresh, opened store::

    @pytest.mark.parametrize("check", CONFORMANCE, ids=lambda c: c.__name__)
    async def test_my_store(check, tmp_path):
        await run_check(check, lambda: MyStore(tmp_path / "db"))

Checks are plain coroutines taking a store, so they need no test framework.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import LeaseLostError, LeaseTimeoutError, SessionBusyError
from .events import (
    ActionCompleted,
    ActionRequested,
    InputRequested,
    MessageCompleted,
    TurnCancelled,
    TurnCompleted,
    TurnEvent,
    TurnStarted,
)
from .messages import Message, ToolCall
from .records import (
    Answer,
    ChildMemo,
    ChildStepId,
    InputRequest,
    InputStepId,
    ModelMemo,
    ModelStepId,
    NewEntry,
    SessionKey,
    StepResult,
    ToolMemo,
    ToolStepId,
    TurnRecord,
    TurnResult,
    TurnStatus,
)
from .stores import SessionStore

Check = Callable[[SessionStore], Awaitable[None]]
KEY = SessionKey("agent", "s1")


def _opening(turn_id: str, text: str = "hello") -> Message:
    return Message("user", text, turn_id=turn_id)


def _ids(turn_id: str) -> dict[str, Any]:
    return {"agent": KEY.agent, "session": KEY.session, "turn_id": turn_id}


async def check_enqueue_is_durable_and_idempotent(store: SessionStore) -> None:
    assert await store.session_info(KEY) is None
    t1, new1 = await store.enqueue(KEY, NewEntry("t1", _opening("t1"), event={"source": "x"}))
    t2, new2 = await store.enqueue(KEY, NewEntry("t2", _opening("t2")))
    again, new3 = await store.enqueue(KEY, NewEntry("t1", _opening("t1", "other text")))
    assert (new1, new2, new3) == (True, True, False)
    assert t1.status == "queued" and t1.ordinal < t2.ordinal
    assert again.opening is not None and again.opening.text == "hello"
    assert again.event == {"source": "x"}
    info = await store.session_info(KEY)
    assert info is not None and info.status == "new" and info.generation == 0
    assert [t.turn_id for t in await store.turns(KEY, unfinished=True)] == ["t1", "t2"]
    assert await store.find_sessions("unfinished") == [KEY]
    got = await get_turn(store, KEY, "t2")
    assert got is not None and got.opening == _opening("t2")
    assert await get_turn(store, KEY, "nope") is None


async def check_lease_is_exclusive(store: SessionStore) -> None:
    lease = await store.claim(KEY)
    try:
        await store.claim(KEY, timeout=0.05)
    except LeaseTimeoutError:
        pass
    else:
        raise AssertionError("a second lease on one session was granted")
    other = await store.claim(SessionKey("agent", "s2"), timeout=0.05)
    await other.release()
    await lease.release()
    again = await store.claim(KEY, timeout=1)
    await again.release()


async def check_transaction_commits_everything(store: SessionStore) -> None:
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    lease = await store.claim(KEY)
    call = ToolCall("c1", "tool", {"a": 1})
    async with lease.transaction() as tx:
        assert tx.add_message(_opening("t1")) == 0
        assert tx.add_message(Message("assistant", "hi", (call,), turn_id="t1")) == 1
        tx.add_step(ModelStepId(1), "t1", ModelMemo(1))
        e1 = tx.add_event(TurnStarted(**_ids("t1"), text="hello"))
        e2 = tx.add_event(ActionCompleted(**_ids("t1"), call=call, result={"ok": True}))
        tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
        tx.set_status("running")
    assert (e1.seq, e2.seq) == (1, 2)
    assert (lease.last_seq, lease.message_count) == (2, 2)
    await lease.release()
    msgs = await store.read_messages(KEY)
    assert msgs == [_opening("t1"), Message("assistant", "hi", (call,), turn_id="t1")]
    assert await store.read_messages(KEY, after=1) == msgs[1:]
    assert await step_result(store, KEY, "model:1") == ModelMemo(1)
    assert await step_result(store, KEY, "model:9") is None
    events = await store.read_events(KEY)
    assert [(e.seq, e.type) for e in events] == [(1, "turn.started"), (2, "action.completed")]
    assert isinstance(events[1], ActionCompleted) and events[1].result == {"ok": True}
    assert [e.seq for e in await store.read_events(KEY, after_seq=1)] == [2]
    info = await store.session_info(KEY)
    assert info is not None and info.status == "running"
    turn = await get_turn(store, KEY, "t1")
    assert turn is not None and turn.status == "running"
    # A new lease continues the numbering where the last one stopped.
    lease = await store.claim(KEY)
    assert (lease.last_seq, lease.message_count) == (2, 2)
    async with lease.transaction() as tx:
        assert tx.add_message(Message("assistant", "bye", turn_id="t1")) == 2
        tx.set_turn(TurnResult("t1", TurnStatus.COMPLETED, text="bye"))
        tx.set_status("idle")
    await lease.release()
    turn = await get_turn(store, KEY, "t1")
    assert turn is not None and (turn.status, turn.text) == ("completed", "bye")
    assert await store.find_sessions("unfinished") == []


async def check_every_write_reads_back_as_written(store: SessionStore) -> None:
    """Whatever shape a step's writes take, each message, step and event reads back equal
    (``at`` included): a store may keep a payload once and rebuild the rest (SQL stores
    derive an event's fields from the step's message), never change it."""
    await store.enqueue(KEY, NewEntry("t1", _opening("t1", "hi there")))
    await store.enqueue(KEY, NewEntry("t2", _opening("t2")))
    lease = await store.claim(KEY)
    calls = (ToolCall("c1", "look", {"q": "x", "n": [1, 2.5]}), ToolCall("c2", "pay", {}))
    reply = Message("assistant", "let me look", calls, turn_id="t1", usage={"in": 3, "out": 4})
    result = {"found": ["a", "b\nc"], "ok": True, "none": None}  # a newline: kept as it is
    written: list[TurnEvent] = []
    async with lease.transaction() as tx:  # an opening and its turn.started
        tx.add_message(_opening("t1", "hi there"))
        written.append(tx.add_event(TurnStarted(**_ids("t1"), text="hi there")))
    async with lease.transaction() as tx:  # a model step asking for two calls
        tx.add_message(reply)
        tx.add_step(ModelStepId(1), "t1", ModelMemo(1, "tool_use"))
        written.append(tx.add_event(MessageCompleted(
            **_ids("t1"), text=reply.text, tool_calls=calls, stop_reason="tool_use",
            usage=reply.usage)))
        written += [tx.add_event(ActionRequested(**_ids("t1"), call=c)) for c in calls]
    async with lease.transaction() as tx:  # two tool messages and steps in one commit
        tx.add_message(Message("tool", call_id="c1", result=result, turn_id="t1"))
        tx.add_message(Message("tool", call_id="c2", result={"error": "no"}, is_error=True,
                               turn_id="t1"))
        tx.add_step(ToolStepId(1, "c1"), "t1", ToolMemo(2))
        tx.add_step(ToolStepId(1, "c2"), "t1", ToolMemo(3))
        written.append(tx.add_event(ActionCompleted(**_ids("t1"), call=calls[0],
                                                    result=result)))
        written.append(tx.add_event(ActionCompleted(**_ids("t1"), call=calls[1],
                                                    result={"error": "no"}, error="no")))
    async with lease.transaction() as tx:  # an event that differs from its message
        tx.add_message(Message("assistant", "done", turn_id="t1"))
        tx.add_step(ModelStepId(4), "t1", ModelMemo(4, "end_turn"))
        written.append(tx.add_event(MessageCompleted(**_ids("t1"), text="other text")))
        written.append(tx.add_event(TurnCompleted(**_ids("t1"), text="done")))
    async with lease.transaction() as tx:  # a step with neither message nor event
        tx.add_step(InputStepId("t1", "ok"), "t1", Answer(True, "ann"))
    async with lease.transaction() as tx:  # events of two turns, one forwarded from a child
        written.append(tx.add_event(TurnCancelled(**_ids("t1"), reason="reset")))
        written.append(tx.add_event(InputRequested(
            **_ids("t2"), child={"agent": "sub", "session": "c", "turn_id": "x", "seq": 7},
            request=InputRequest("ok", "ok?", turn_id="x"))))
        tx.add_step(ChildStepId("t2", "1"), "t2", ChildMemo("sub", "c", "x"))
    async with lease.transaction() as tx:  # a second step with neither, at the same seq
        tx.add_step(InputStepId("t2", "ok"), "t2", Answer(False))
    await lease.release()
    assert [e.seq for e in written] == list(range(1, 11))
    events = await store.read_events(KEY)
    assert events == written
    assert [e.at for e in events] == [e.at for e in written]
    assert await store.read_events(KEY, after_seq=3) == written[3:]
    assert await store.read_events(KEY, turn_id="t2") == [written[-1]]
    assert await store.read_events(KEY, after_seq=8, turn_id="t1") == [written[8]]
    assert await store.read_messages(KEY, after=3) == [
        Message("tool", call_id="c2", result={"error": "no"}, is_error=True, turn_id="t1"),
        Message("assistant", "done", turn_id="t1")]
    assert len(await store.read_messages(KEY)) == 5
    steps = await store.read_steps(KEY)
    assert sorted(steps) == ["child:t2:1", "input:t1:ok", "input:t2:ok", "model:1", "model:4",
                             "tool:1:c1", "tool:1:c2"]
    child = steps["child:t2:1"]
    assert (child.turn_id, child.step, child.result) == (
        "t2", ChildStepId("t2", "1"), ChildMemo("sub", "c", "x"))
    assert steps["model:1"].result == ModelMemo(1, "tool_use")
    assert await step_result(store, KEY, "tool:1:c2") == ToolMemo(3)
    assert await step_result(store, KEY, "input:t2:ok") == Answer(False)
    assert await step_result(store, KEY, "input:t1:ok") == Answer(True, "ann")
    assert await step_result(store, KEY, "child:t2:1") == ChildMemo("sub", "c", "x")
    assert await step_result(store, KEY, "child:t2:2") is None
    again = await store.claim(KEY)  # the counters survive the lease
    assert (again.last_seq, again.message_count) == (10, 5)
    await again.release()


async def check_failed_transaction_writes_nothing(store: SessionStore) -> None:
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    lease = await store.claim(KEY)
    try:
        async with lease.transaction() as tx:
            tx.add_message(_opening("t1"))
            tx.add_event(TurnStarted(**_ids("t1")))
            tx.set_status("running")
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert (lease.last_seq, lease.message_count) == (0, 0)
    await lease.release()
    assert await store.read_messages(KEY) == []
    assert await store.read_events(KEY) == []
    info = await store.session_info(KEY)
    assert info is not None and info.status == "new"


async def check_local_writes_join_the_transaction(store: SessionStore) -> None:
    if store.unwrap() is None:
        return  # no raw handle, no rollback: nothing to check (documented for MemoryStore)
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    lease = await store.claim(KEY)

    def setup(h: Any) -> None:
        h.execute("CREATE TABLE IF NOT EXISTS conformance_rows (v TEXT)")

    def write(value: str, fail: bool) -> Callable[[Any], None]:
        def run(h: Any) -> None:
            # A literal: DB-API drivers disagree on placeholders (``?``, ``%s``).
            h.execute(f"INSERT INTO conformance_rows (v) VALUES ('{value}')")
            if fail:
                raise ValueError("tool failed")

        return run

    async with lease.transaction() as tx:
        await tx.run_local(setup)
    async with lease.transaction() as tx:
        await tx.run_local(write("kept", False))
        with contextlib.suppress(ValueError):
            await tx.run_local(write("rolled back", True))
        tx.add_message(_opening("t1"))
    try:
        async with lease.transaction() as tx:
            await tx.run_local(write("lost with the step", False))
            raise RuntimeError("crash before commit")
    except RuntimeError:
        pass
    await lease.release()
    rows = store.unwrap().execute("SELECT v FROM conformance_rows").fetchall()
    assert [r[0] for r in rows] == ["kept"]
    assert len(await store.read_messages(KEY)) == 1


async def check_cancel_requests_are_durable(store: SessionStore) -> None:
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    await store.enqueue(KEY, NewEntry("t2", _opening("t2")))
    assert await store.request_cancel(KEY, "t1", "stop") == ["t1"]
    assert await store.request_cancel(KEY, "t1", "again") == []
    lease = await store.claim(KEY)
    assert await lease.cancel_requested("t1") == "stop"
    assert await lease.cancel_requested("t2") is None
    assert await store.request_cancel(KEY, None, "all") == ["t2"]
    assert await lease.cancel_requested("t2") == "all"
    await lease.release()
    assert await store.request_cancel(SessionKey("agent", "none"), None, "x") == []


async def check_turn_data_is_set_without_a_lease(store: SessionStore) -> None:
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    lease = await store.claim(KEY)  # a driver holds the session: channel state needs no lease
    assert await store.set_turn_data(KEY, "t1", "stream", {"ts": "1.1"}) == {"ts": "1.1"}
    assert await store.set_turn_data(KEY, "t1", "stream", {"ts": "2.2"}, only_new=True) == {
        "ts": "1.1"}
    assert await store.set_turn_data(KEY, "t1", "prompt", "3.3", only_new=True) == "3.3"
    async with lease.transaction() as tx:  # the engine's own write keeps the names
        tx.set_turn(TurnResult("t1", TurnStatus.COMPLETED, text="done"))
    await lease.release()
    (t,) = await store.turns(KEY, turn_id="t1")
    assert t.status == "completed" and t.text == "done"
    assert t.data == {"stream": {"ts": "1.1"}, "prompt": "3.3"}
    assert await store.set_turn_data(KEY, "nope", "x", 1) is None
    assert await store.set_turn_data(SessionKey("agent", "none"), "t1", "x", 1) is None


async def check_turn_data_of_two_writers_merges(store: SessionStore) -> None:
    """The engine (in its step's transaction) and a channel (without a lease) write the same
    entry's data, each its own name: neither write drops the other's."""
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
        tx.set_turn_data("t1", "trace", {"span": "a"})
    assert await store.set_turn_data(KEY, "t1", "delivery", {"ts": "1.1"}) == {"ts": "1.1"}
    async with lease.transaction() as tx:
        tx.set_turn_data("t1", "trace", {"span": "b"})
        tx.set_turn(TurnResult("t1", TurnStatus.COMPLETED, text="done"))
    await lease.release()
    (t,) = await store.turns(KEY, turn_id="t1")
    assert t.data == {"trace": {"span": "b"}, "delivery": {"ts": "1.1"}}, t.data
    assert (t.status, t.text) == ("completed", "done")


async def check_a_cancel_withdraws_a_park(store: SessionStore) -> None:
    """A cancel reaches a parked turn: its request no longer stands (no inbox, no refusal of
    new turns) and the turn is work for a driver, which ends it; a supersede never does."""
    await store.enqueue(KEY, NewEntry("p1", _opening("p1")))
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("p1", TurnStatus.SUSPENDED, request=InputRequest("ok", "ok?")))
        tx.set_status("suspended")
    await lease.release()
    assert (await store.find_sessions("parked"), await store.find_sessions("unfinished")) == (
        [KEY], [])
    assert await store.claim_ready(["agent"]) == []
    assert await store.request_cancel(KEY, "p1", "withdrawn") == ["p1"]
    assert await store.request_cancel(KEY, None, "again") == []  # asked once
    p1 = await get_turn(store, KEY, "p1")
    assert p1 is not None and (p1.status, p1.cancel) == ("suspended", "withdrawn")
    assert not p1.parked and p1.needs_driving
    assert (await store.find_sessions("parked"), await store.find_sessions("unfinished")) == (
        [], [KEY])
    claimed = await store.claim_ready(["agent"])
    assert [x.key for x in claimed] == [KEY]
    for x in claimed:
        await x.release()
    rec, new = await store.enqueue(KEY, NewEntry("p2", _opening("p2")))
    assert new and rec.status == "queued"


async def check_parked_session_refuses_other_turns(store: SessionStore) -> None:
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("t1", TurnStatus.SUSPENDED, request=InputRequest("approve", "ok?")))
        tx.set_status("suspended")
    await lease.release()
    try:
        await store.enqueue(KEY, NewEntry("t2", _opening("t2")))
    except SessionBusyError:
        pass
    else:
        raise AssertionError("a parked session accepted another turn")
    rec, new = await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    assert not new and rec.status == "suspended" and rec.request == InputRequest("approve", "ok?")
    assert [t.turn_id for t in await store.turns(KEY, unfinished=True)] == ["t1"]
    assert await store.find_sessions("unfinished") == []
    assert await store.find_sessions("parked") == [KEY]


async def check_sessions_are_found_by_turn_id(store: SessionStore) -> None:
    other = SessionKey("agent", "s2")
    await store.enqueue(KEY, NewEntry("shared", _opening("shared")))
    await store.enqueue(other, NewEntry("shared", _opening("shared")))
    await store.enqueue(other, NewEntry("own", _opening("own")))
    await store.enqueue(other, NewEntry("r1", kind="reset"))
    assert await store.find_sessions(turn_id="shared") == [KEY, other]
    assert await store.find_sessions(turn_id="own") == [other]
    assert await store.find_sessions(turn_id="r1") == []  # chain entries that are not turns
    assert await store.find_sessions(turn_id="nope") == []
    assert await store.find_sessions("parked") == []


async def check_sessions_are_listed_newest_first(store: SessionStore) -> None:
    names = ["b", "a", "c"]
    for name in names:
        await store.enqueue(SessionKey("agent", name), NewEntry(f"t-{name}", _opening(f"t-{name}")))
    await store.enqueue(SessionKey("other", "z"), NewEntry("t-z", _opening("t-z")))
    await store.enqueue(SessionKey("agent", "b"), NewEntry("t-b2", _opening("t-b2")))
    await store.enqueue(SessionKey("agent", "a"), NewEntry("r", kind="reset"))
    assert await store.list_sessions("agent") == [SessionKey("agent", n) for n in "cab"]
    assert await store.list_sessions("other") == [SessionKey("other", "z")]
    assert await store.list_sessions("nobody") == []


async def _commit_events(store: SessionStore, key: SessionKey, turn_id: str, n: int) -> None:
    lease = await store.claim(key)
    try:
        async with lease.transaction() as tx:
            for i in range(n):
                tx.add_event(TurnStarted(agent=key.agent, session=key.session, turn_id=turn_id,
                                         text=f"e{lease.last_seq + i + 1}"))
    finally:
        await lease.release()


async def check_reset_starts_a_new_generation(store: SessionStore) -> None:
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        tx.add_message(_opening("t1"))
        tx.add_step(ModelStepId(1), "t1", ModelMemo(1))
        tx.set_turn(TurnResult("t1", TurnStatus.SUSPENDED, request=InputRequest("ok", "ok?")))
        tx.set_status("suspended")
    await lease.release()
    # A reset is accepted while parked; a turn behind a queued reset is accepted too.
    reset, new = await store.enqueue(KEY, NewEntry("r1", kind="reset"))
    assert new and reset.kind == "reset" and reset.status == "queued"
    await store.enqueue(KEY, NewEntry("t2", _opening("t2")))
    lease = await store.claim(KEY)
    assert lease.generation == 0
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("r1", TurnStatus.COMPLETED))
        tx.set_turn_data("r1", "reset", {"archived": 0})
        tx.new_generation()
    assert (lease.generation, lease.message_count) == (1, 0)
    await lease.release()
    info = await store.session_info(KEY)
    assert info is not None and (info.status, info.generation) == ("new", 1)
    t1 = await get_turn(store, KEY, "t1")
    assert t1 is not None and (t1.status, t1.reason, t1.request) == ("cancelled", "reset", None)
    r1 = await get_turn(store, KEY, "r1")
    assert r1 is not None and r1.status == "completed" and r1.data == {"reset": {"archived": 0}}
    # The live log is empty; the archived generation stays readable, steps included.
    assert await store.read_messages(KEY) == []
    assert await store.read_steps(KEY) == {}
    assert await store.read_messages(KEY, generation=0) == [_opening("t1")]
    archived = await store.read_steps(KEY, generation=0)
    assert list(archived) == ["model:1"] and archived["model:1"].kind == "model"
    assert archived["model:1"].turn_id == "t1" and archived["model:1"].result == ModelMemo(1)
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        assert tx.add_message(_opening("t2")) == 0
    await lease.release()
    assert await store.read_messages(KEY) == [_opening("t2")]
    assert await store.read_messages(KEY, generation=0) == [_opening("t1")]


async def _grow(store: SessionStore, turns: range, per_turn: int) -> list[Message]:
    """Turns of ``per_turn`` messages each (an opening, replies, a two-message commit, a
    commit without events), every turn started and ended: what a long session is made of."""
    written: list[Message] = []
    for t in turns:
        tid = f"g{t}"
        await store.enqueue(KEY, NewEntry(tid, _opening(tid)))
        lease = await store.claim(KEY)
        async with lease.transaction() as tx:
            tx.add_message(_opening(tid))
            tx.add_event(TurnStarted(**_ids(tid), text="hello"))
            tx.set_turn(TurnResult(tid, TurnStatus.RUNNING))
        step = [_opening(tid)]
        for k in range(1, per_turn - 1):
            reply = Message("assistant", f"{tid} reply {k}", turn_id=tid)
            pair = [Message("tool", call_id=f"{tid}-{k}", result={"k": k}, turn_id=tid),
                    Message("assistant", f"{tid} after {k}", turn_id=tid)]
            batch = pair if k % 5 == 0 else [reply]
            async with lease.transaction() as tx:
                for m in batch:
                    tx.add_message(m)
                if k % 7:  # and every seventh commit has no event
                    tx.add_event(MessageCompleted(**_ids(tid), text=batch[-1].text))
            step += batch
        last = Message("assistant", f"{tid} done", turn_id=tid)
        async with lease.transaction() as tx:
            tx.add_message(last)
            tx.add_event(TurnCompleted(**_ids(tid), text=last.text))
            tx.set_turn(TurnResult(tid, TurnStatus.COMPLETED, text=last.text))
        await lease.release()
        written += [*step, last]
    return written


async def check_a_long_transcript_reads_back_whole(store: SessionStore) -> None:
    """A session of many turns and messages (past any size a store may keep its messages
    in groups of, SQL stores' ``log_transcript``) reads back whole, from any message on, in
    each generation, and its leases count every message."""
    written = await _grow(store, range(9), 14)
    assert len(written) > 120
    assert await store.read_messages(KEY) == written
    for after in range(len(written) + 2):
        assert await store.read_messages(KEY, after=after) == written[after:], after
    lease = await store.claim(KEY)
    assert lease.message_count == len(written)
    async with lease.transaction() as tx:  # a reset: the generation is archived whole
        tx.new_generation()
    await lease.release()
    assert await store.read_messages(KEY) == []
    again = await _grow(store, range(9, 14), 17)
    assert await store.read_messages(KEY) == again
    assert await store.read_messages(KEY, after=40) == again[40:]
    assert await store.read_messages(KEY, generation=0) == written
    assert await store.read_messages(KEY, generation=0, after=100) == written[100:]
    assert await store.read_messages(KEY, generation=1) == again


async def check_supersede_cancels_unfinished_turns_but_not_a_park(store: SessionStore) -> None:
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    await store.enqueue(KEY, NewEntry("t2", _opening("t2")))
    await store.enqueue(KEY, NewEntry("t3", _opening("t3"), supersede="superseded by turn t3"))
    for turn_id, cancel in (("t1", "superseded by turn t3"), ("t2", "superseded by turn t3"),
                            ("t3", None)):
        rec = await get_turn(store, KEY, turn_id)
        assert rec is not None and rec.cancel == cancel, (turn_id, rec)
    # A parked turn is never superseded: a new turn is refused instead.
    other = SessionKey("agent", "parked")
    await store.enqueue(other, NewEntry("p1", _opening("p1")))
    lease = await store.claim(other)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("p1", TurnStatus.SUSPENDED, request=InputRequest("ok", "ok?")))
    await lease.release()
    with contextlib.suppress(SessionBusyError):
        await store.enqueue(other, NewEntry("p2", _opening("p2"), supersede="replace"))
        raise AssertionError("a parked session accepted a superseding turn")
    p1 = await get_turn(store, other, "p1")
    assert p1 is not None and p1.cancel is None and p1.status == "suspended"
    # A resume command is accepted while parked, once per id.
    _, new = await store.enqueue(other, NewEntry("resume:p1:ok", kind="resume",
                                                 args={"value": True}))
    again, new2 = await store.enqueue(other, NewEntry("resume:p1:ok", kind="resume",
                                                      args={"value": False}))
    assert (new, new2) == (True, False) and again.args == {"value": True}
    assert again.opening is None and again.kind == "resume"


async def check_events_are_read_by_turn(store: SessionStore) -> None:
    await _commit_events(store, KEY, "t1", 2)
    await _commit_events(store, KEY, "t2", 1)
    await _commit_events(store, KEY, "t1", 1)
    assert [e.seq for e in await store.read_events(KEY, turn_id="t1")] == [1, 2, 4]
    assert [e.seq for e in await store.read_events(KEY, turn_id="t2")] == [3]
    assert [e.seq for e in await store.read_events(KEY, after_seq=2, turn_id="t1")] == [4]
    assert await store.read_events(KEY, turn_id="none") == []
    assert await store.read_events(SessionKey("agent", "none")) == []


async def check_subscribe_replays_then_goes_live(store: SessionStore) -> None:
    await _commit_events(store, KEY, "t1", 3)
    got: list[TurnEvent] = []
    live: list[TurnEvent] = []
    async with store.subscribe(KEY, after_seq=1) as replay, store.subscribe(KEY) as newest:
        # Commits that race the backlog read are neither lost nor doubled.
        await _commit_events(store, KEY, "t1", 2)
        async with asyncio.timeout(10):
            while len(got) < 4:
                got.append(await anext(replay))
            while len(live) < 2:
                live.append(await anext(newest))
        await _commit_events(store, KEY, "t2", 1)
        async with asyncio.timeout(10):
            got.append(await anext(replay))
            live.append(await anext(newest))
    assert [e.seq for e in got] == [2, 3, 4, 5, 6]
    assert [e.seq for e in live] == [4, 5, 6]
    assert got[-1].turn_id == "t2" and isinstance(got[-1], TurnStarted)
    # An unknown session is no error: it has nothing yet.
    async with store.subscribe(SessionKey("agent", "none"), after_seq=0) as empty:
        assert empty.cursor == 0


async def check_watchers_hear_commits_and_cancels(store: SessionStore) -> None:
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    heard: list[list[TurnEvent] | None] = []
    stop = store.watch(KEY, heard.append)
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        done = tx.add_event(TurnCompleted(**_ids("t1"), text="ok"))
    await lease.release()
    # ``None`` ("look again") may come at any time; committed events come as a list.
    assert [[e.seq for e in h] for h in heard if h is not None] == [[done.seq]]
    await store.enqueue(KEY, NewEntry("t2", _opening("t2")))
    heard.clear()
    await store.request_cancel(KEY, "t2", "stop")
    assert None in heard
    stop()
    n = len(heard)
    await store.request_cancel(KEY, None, "again")
    assert len(heard) == n


async def check_two_holders_contend_for_one_session(store: SessionStore) -> None:
    order: list[str] = []
    first = await store.claim(KEY)

    async def second() -> int:
        lease = await store.claim(KEY, timeout=30)
        order.append("second holds")
        epoch = lease.epoch
        await lease.release()
        return epoch

    waiting = asyncio.ensure_future(second())
    await asyncio.sleep(0.05)  # give the contender time to try (and be refused)
    assert order == [] and not waiting.done()
    order.append("first releases")
    await first.release()
    async with asyncio.timeout(30):
        epoch = await waiting
    assert order == ["first releases", "second holds"]
    assert epoch > first.epoch


async def check_a_stale_epoch_is_refused(store: SessionStore) -> None:
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    stale = await store.claim(KEY)
    await stale.release()
    current = await store.claim(KEY)
    assert current.epoch > stale.epoch
    try:
        async with stale.transaction() as tx:
            tx.add_message(_opening("t1"))
            tx.add_event(TurnStarted(**_ids("t1")))
            tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
            tx.set_status("running")
    except LeaseLostError as e:
        assert e.epoch == stale.epoch and e.session == str(KEY)
    else:
        raise AssertionError("a commit under a stale epoch was accepted")
    # The common step (a message and its events, nothing else), which a store may write in
    # a shorter way, is fenced just the same.
    try:
        async with stale.transaction() as tx:
            tx.add_message(_opening("t1"))
            tx.add_event(TurnStarted(**_ids("t1")))
    except LeaseLostError as e:
        assert e.epoch == stale.epoch
    else:
        raise AssertionError("a step under a stale epoch was accepted")
    assert await store.read_messages(KEY) == []
    assert await store.read_events(KEY) == []
    t1 = await get_turn(store, KEY, "t1")
    assert t1 is not None and t1.status == "queued"
    # The current holder still writes.
    async with current.transaction() as tx:
        tx.add_message(_opening("t1"))
    await current.release()
    assert await store.read_messages(KEY) == [_opening("t1")]


async def check_claimable_sessions_are_unfinished_and_free(store: SessionStore) -> None:
    other, parked = SessionKey("agent", "s2"), SessionKey("agent", "parked")
    assert await store.find_claimable() == []
    await store.enqueue(KEY, NewEntry("t1", _opening("t1")))
    await store.enqueue(other, NewEntry("t1", _opening("t1")))
    await store.enqueue(parked, NewEntry("p1", _opening("p1")))
    lease = await store.claim(parked)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("p1", TurnStatus.SUSPENDED, request=InputRequest("ok", "ok?")))
    await lease.release()
    assert await store.find_claimable() == [KEY, other]  # a parked turn waits on a person
    held = await store.claim(KEY)
    assert await store.find_claimable() == [other]
    assert await store.find_claimable(limit=0) == []
    await held.release()
    assert await store.find_claimable(limit=1) == [KEY]


async def check_ready_sessions_are_claimed_once(store: SessionStore) -> None:
    other, parked = SessionKey("agent", "s2"), SessionKey("agent", "parked")
    foreign = SessionKey("another", "s1")
    assert list(await store.claim_ready(["agent"])) == []
    for key in (KEY, other, parked, foreign):
        await store.enqueue(key, NewEntry("t1", _opening("t1")))
    lease = await store.claim(parked)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("t1", TurnStatus.SUSPENDED, request=InputRequest("ok", "ok?")))
    await lease.release()
    held = await store.claim(KEY)
    # Two workers claiming at once share the ready sessions out, never one to both.
    first, second = await asyncio.gather(store.claim_ready(["agent"]),
                                         store.claim_ready(["agent"]))
    assert sorted(x.key for x in [*first, *second]) == [other]  # KEY is held, parked waits
    got = [*first, *second][0]
    assert list(await store.claim_ready(["agent", "another"], limit=0)) == []
    assert [x.key for x in await store.claim_ready(["another"])] == [foreign]
    # A claimed lease is a lease: a new epoch that commits, and nobody else's until released.
    async with got.transaction() as tx:
        tx.add_message(_opening("t1"))
    assert list(await store.claim_ready(["agent"])) == []
    await held.release()
    await got.release()
    again = await store.claim_ready(["agent"], limit=1)
    assert len(again) == 1 and again[0].key in (KEY, other)
    rest = await store.claim_ready(["agent"])
    assert {x.key for x in [*again, *rest]} == {KEY, other}
    assert [x.epoch for x in [*again, *rest] if x.key == other] > [got.epoch]
    for x in [*again, *rest]:
        await x.release()


CONFORMANCE: list[Check] = [
    check_enqueue_is_durable_and_idempotent,
    check_lease_is_exclusive,
    check_transaction_commits_everything,
    check_every_write_reads_back_as_written,
    check_failed_transaction_writes_nothing,
    check_local_writes_join_the_transaction,
    check_cancel_requests_are_durable,
    check_turn_data_is_set_without_a_lease,
    check_turn_data_of_two_writers_merges,
    check_parked_session_refuses_other_turns,
    check_a_cancel_withdraws_a_park,
    check_sessions_are_found_by_turn_id,
    check_sessions_are_listed_newest_first,
    check_reset_starts_a_new_generation,
    check_a_long_transcript_reads_back_whole,
    check_supersede_cancels_unfinished_turns_but_not_a_park,
    check_events_are_read_by_turn,
    check_subscribe_replays_then_goes_live,
    check_watchers_hear_commits_and_cancels,
    check_two_holders_contend_for_one_session,
    check_a_stale_epoch_is_refused,
    check_claimable_sessions_are_unfinished_and_free,
    check_ready_sessions_are_claimed_once,
]
"""Every check a store must pass."""


async def run_check(check: Check, factory: Callable[[], SessionStore]) -> None:
    """Open a fresh store from ``factory``, run ``check`` on it, close it."""
    store = factory()
    await store.open()
    try:
        await check(store)
    finally:
        await store.close()


async def get_turn(store: SessionStore, key: SessionKey, turn_id: str) -> TurnRecord | None:
    """The chain entry ``turn_id`` of a session, or ``None``."""
    found = await store.turns(key, turn_id=turn_id)
    return found[0] if found else None


async def step_result(store: SessionStore, key: SessionKey,
                      step_id: str) -> StepResult | None:
    """What a checkpointed step of the live generation keeps, or ``None``."""
    steps = await store.read_steps(key, step_id=step_id)
    return steps[step_id].result if step_id in steps else None
