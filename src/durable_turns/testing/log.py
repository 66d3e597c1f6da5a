"""Checks of the step log: commits, what they write read back as written, generations."""

from __future__ import annotations

from ..errors import LeaseLostError
from ..events import (
    ActionCompleted,
    ActionRequested,
    InputRequested,
    MessageCompleted,
    TurnCancelled,
    TurnCompleted,
    TurnEvent,
    TurnStarted,
)
from ..messages import Message, ToolCall
from ..records import (
    Answer,
    ChildMemo,
    ChildStepId,
    InputRequest,
    InputStepId,
    ModelMemo,
    ModelStepId,
    NewEntry,
    SessionKey,
    ToolMemo,
    ToolStepId,
    TurnResult,
    TurnStatus,
)
from ..stores import SessionStore
from .helpers import KEY, commit_events, event_ids, get_turn, grow, opening, step_result


async def check_transaction_commits_everything(store: SessionStore) -> None:
    """A step's messages, checkpoints, events, turn and session status commit together, and a new
    lease counts on from them."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)
    call = ToolCall("c1", "tool", {"a": 1})
    async with lease.transaction() as tx:
        assert tx.add_message(opening("t1")) == 0
        assert tx.add_message(Message("assistant", "hi", (call,), turn_id="t1")) == 1
        tx.add_step(ModelStepId(1), "t1", ModelMemo(1))
        e1 = tx.add_event(TurnStarted(**event_ids("t1"), text="hello"))
        e2 = tx.add_event(ActionCompleted(**event_ids("t1"), call=call, result={"ok": True}))
        tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
        tx.set_status("running")
    assert (e1.seq, e2.seq) == (1, 2)
    assert (lease.last_seq, lease.message_count) == (2, 2)
    await lease.release()
    msgs = await store.read_messages(KEY)
    assert msgs == [opening("t1"), Message("assistant", "hi", (call,), turn_id="t1")]
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
    await store.enqueue(KEY, NewEntry("t1", opening("t1", "hi there")))
    await store.enqueue(KEY, NewEntry("t2", opening("t2")))
    lease = await store.claim(KEY)
    calls = (ToolCall("c1", "look", {"q": "x", "n": [1, 2.5]}), ToolCall("c2", "pay", {}))
    reply = Message("assistant", "let me look", calls, turn_id="t1", usage={"in": 3, "out": 4})
    result = {"found": ["a", "b\nc"], "ok": True, "none": None}  # a newline: kept as it is
    written: list[TurnEvent] = []
    async with lease.transaction() as tx:  # an opening and its turn.started
        tx.add_message(opening("t1", "hi there"))
        written.append(tx.add_event(TurnStarted(**event_ids("t1"), text="hi there")))
    async with lease.transaction() as tx:  # a model step asking for two calls
        tx.add_message(reply)
        tx.add_step(ModelStepId(1), "t1", ModelMemo(1, "tool_use"))
        written.append(tx.add_event(MessageCompleted(
            **event_ids("t1"), text=reply.text, tool_calls=calls, stop_reason="tool_use",
            usage=reply.usage)))
        written += [tx.add_event(ActionRequested(**event_ids("t1"), call=c)) for c in calls]
    async with lease.transaction() as tx:  # two tool messages and steps in one commit
        tx.add_message(Message("tool", call_id="c1", result=result, turn_id="t1"))
        tx.add_message(Message("tool", call_id="c2", result={"error": "no"}, is_error=True,
                               turn_id="t1"))
        tx.add_step(ToolStepId(1, "c1"), "t1", ToolMemo(2))
        tx.add_step(ToolStepId(1, "c2"), "t1", ToolMemo(3))
        written.append(tx.add_event(ActionCompleted(**event_ids("t1"), call=calls[0],
                                                    result=result)))
        written.append(tx.add_event(ActionCompleted(**event_ids("t1"), call=calls[1],
                                                    result={"error": "no"}, error="no")))
    async with lease.transaction() as tx:  # an event that differs from its message
        tx.add_message(Message("assistant", "done", turn_id="t1"))
        tx.add_step(ModelStepId(4), "t1", ModelMemo(4, "end_turn"))
        written.append(tx.add_event(MessageCompleted(**event_ids("t1"), text="other text")))
        written.append(tx.add_event(TurnCompleted(**event_ids("t1"), text="done")))
    async with lease.transaction() as tx:  # a step with neither message nor event
        tx.add_step(InputStepId("t1", "ok"), "t1", Answer(True, "ann"))
    async with lease.transaction() as tx:  # events of two turns, one forwarded from a child
        written.append(tx.add_event(TurnCancelled(**event_ids("t1"), reason="reset")))
        written.append(tx.add_event(InputRequested(
            **event_ids("t2"), child={"agent": "sub", "session": "c", "turn_id": "x", "seq": 7},
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
    """A transaction that raises writes nothing and leaves its lease's counters as they were."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)
    try:
        async with lease.transaction() as tx:
            tx.add_message(opening("t1"))
            tx.add_event(TurnStarted(**event_ids("t1")))
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


async def check_a_stale_epoch_is_refused(store: SessionStore) -> None:
    """A lease taken over (a stale epoch) commits nothing, in a full transaction or in the common
    step."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    stale = await store.claim(KEY)
    await stale.release()
    current = await store.claim(KEY)
    assert current.epoch > stale.epoch
    try:
        async with stale.transaction() as tx:
            tx.add_message(opening("t1"))
            tx.add_event(TurnStarted(**event_ids("t1")))
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
            tx.add_message(opening("t1"))
            tx.add_event(TurnStarted(**event_ids("t1")))
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
        tx.add_message(opening("t1"))
    await current.release()
    assert await store.read_messages(KEY) == [opening("t1")]


async def check_reset_starts_a_new_generation(store: SessionStore) -> None:
    """A reset archives the live generation (still readable), ending a stale park in the
    same commit; accepted while parked, it clears the park for the entries after it."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        tx.add_message(opening("t1"))
        tx.add_step(ModelStepId(1), "t1", ModelMemo(1))
        tx.set_turn(TurnResult("t1", TurnStatus.SUSPENDED, request=InputRequest("ok", "ok?")))
        tx.set_status("suspended")
    await lease.release()
    # A reset is accepted while parked; a turn behind a queued reset is accepted too.
    reset, new = await store.enqueue(KEY, NewEntry("r1", kind="reset", supersede="reset",
                                                   while_parked="clears"))
    assert new and reset.kind == "reset" and reset.status == "queued"
    await store.enqueue(KEY, NewEntry("t2", opening("t2")))
    lease = await store.claim(KEY)
    assert lease.generation == 0
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("t1", TurnStatus.CANCELLED, reason="reset"))
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
    assert await store.read_messages(KEY, generation=0) == [opening("t1")]
    archived = await store.read_steps(KEY, generation=0)
    assert list(archived) == ["model:1"] and archived["model:1"].kind == "model"
    assert archived["model:1"].turn_id == "t1" and archived["model:1"].result == ModelMemo(1)
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        assert tx.add_message(opening("t2")) == 0
    await lease.release()
    assert await store.read_messages(KEY) == [opening("t2")]
    assert await store.read_messages(KEY, generation=0) == [opening("t1")]


async def check_a_long_transcript_reads_back_whole(store: SessionStore) -> None:
    """A session of many turns and messages (past any size a store may keep its messages
    in groups of, SQL stores' ``log_transcript``) reads back whole, from any message on, in
    each generation, and its leases count every message."""
    written = await grow(store, range(9), 14)
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
    again = await grow(store, range(9, 14), 17)
    assert await store.read_messages(KEY) == again
    assert await store.read_messages(KEY, after=40) == again[40:]
    assert await store.read_messages(KEY, generation=0) == written
    assert await store.read_messages(KEY, generation=0, after=100) == written[100:]
    assert await store.read_messages(KEY, generation=1) == again


async def check_events_are_read_by_turn(store: SessionStore) -> None:
    """Events are read by turn and after a cursor."""
    await commit_events(store, KEY, "t1", 2)
    await commit_events(store, KEY, "t2", 1)
    await commit_events(store, KEY, "t1", 1)
    assert [e.seq for e in await store.read_events(KEY, turn_id="t1")] == [1, 2, 4]
    assert [e.seq for e in await store.read_events(KEY, turn_id="t2")] == [3]
    assert [e.seq for e in await store.read_events(KEY, after_seq=2, turn_id="t1")] == [4]
    assert await store.read_events(KEY, turn_id="none") == []
    assert await store.read_events(SessionKey("agent", "none")) == []


__all__ = [
    "check_a_long_transcript_reads_back_whole",
    "check_a_stale_epoch_is_refused",
    "check_events_are_read_by_turn",
    "check_every_write_reads_back_as_written",
    "check_failed_transaction_writes_nothing",
    "check_reset_starts_a_new_generation",
    "check_transaction_commits_everything",
]
