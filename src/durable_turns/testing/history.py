"""Checks of a session's history and its forks: every commit read back in order, and a fork
that copies a session up to a checkpoint, whole or not at all, its source untouched."""

from __future__ import annotations

from dataclasses import replace

from ..errors import SessionExistsError
from ..events import ActionCompleted, InputRequested, MessageCompleted, TurnEvent, TurnStarted
from ..history import ForkPlan
from ..messages import Message, ToolCall
from ..records import (
    Answer,
    ChainEntry,
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
from .helpers import KEY, event_ids, get_turn, opening

CALL = ToolCall("c1", "look", {"q": "x"})
CHILD = {"agent": "sub", "session": "agent:s1:t1:c9", "turn_id": "t1:c9"}


async def _session(store: SessionStore) -> list[TurnEvent]:
    """A turn that opens, asks for a tool, gets its result, records a child, parks on a
    child's request, is answered: five commits, the last without events."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)
    written: list[TurnEvent] = []
    reply = Message("assistant", "looking", (CALL,), turn_id="t1")
    request = InputRequest("ok@c9", "ok?", turn_id="t1", call_id="c9",
                           child={**CHILD, "input_id": "ok"})
    async with lease.transaction() as tx:
        tx.add_message(opening("t1"))
        written.append(tx.add_event(TurnStarted(**event_ids("t1"), text="hello")))
        tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
        tx.set_status("running")
    async with lease.transaction() as tx:
        tx.add_message(reply)
        tx.add_step(ModelStepId(1), "t1", ModelMemo(1, "tool_use"))
        written.append(tx.add_event(MessageCompleted(**event_ids("t1"), text="looking",
                                                     tool_calls=(CALL,))))
    async with lease.transaction() as tx:
        tx.add_message(Message("tool", call_id="c1", result={"found": 1}, turn_id="t1"))
        tx.add_step(ToolStepId(1, "c1"), "t1", ToolMemo(2))
        written.append(tx.add_event(ActionCompleted(**event_ids("t1"), call=CALL,
                                                    result={"found": 1})))
    async with lease.transaction() as tx:
        tx.add_step(ChildStepId("t1", "c9"), "t1", ChildMemo(**CHILD))
        written.append(tx.add_event(TurnStarted(**event_ids("t1"), text="go",
                                                child={**CHILD, "seq": 1})))
        written.append(tx.add_event(InputRequested(**event_ids("t1"), request=request)))
        tx.set_turn(TurnResult("t1", TurnStatus.SUSPENDED, request=request))
        tx.set_status("suspended")
    async with lease.transaction() as tx:
        tx.add_step(InputStepId("t1", "ok@c9"), "t1", Answer(True, "ann"))
    await lease.release()
    return written


async def check_history_lists_every_commit_in_order(store: SessionStore) -> None:
    """Each commit is a checkpoint, read back in order with its steps, events, generation
    and transcript length; a reset's next generation follows its archived one."""
    written = await _session(store)
    history = await store.checkpoints(KEY)
    assert [cp.kind for cp in history] == ["start", "model", "tool", "child", "input"], history
    assert [cp.messages for cp in history] == [1, 2, 3, 3, 3]
    assert [cp.position for cp in history] == sorted(cp.position for cp in history)
    assert [e for cp in history for e in cp.events] == written
    assert history[1].results == (ModelMemo(1, "tool_use"),)
    assert history[3].results == (ChildMemo(**CHILD),)
    assert history[4].results == (Answer(True, "ann"),) and history[4].events == ()
    assert {cp.generation for cp in history} == {0}
    assert await store.checkpoints(SessionKey("agent", "none")) == []
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        tx.new_generation()
    async with lease.transaction() as tx:
        tx.add_message(opening("t2"))
        tx.add_event(TurnStarted(**event_ids("t2"), text="again"))
    await lease.release()
    after = await store.checkpoints(KEY)
    assert after[:5] == history and [cp.generation for cp in after[5:]] == [1], after[5:]
    assert [cp.generation for cp in await store.checkpoints(KEY, generation=1)] == [1]


async def check_a_fork_copies_a_session_up_to_a_checkpoint(store: SessionStore) -> None:
    """The fork's log is its source's up to the checkpoint (children renamed), its chain the
    plan's; the source is untouched, and the two go on independently. A fork onto an address
    that exists writes nothing, of any plan."""
    await _session(store)
    history = await store.checkpoints(KEY)
    park = history[3]
    dst = SessionKey("agent", "s1-alt")
    (t1,) = await store.entries(KEY)
    forked_request = replace(t1.request, child={**CHILD, "session": "new-child",
                                                "input_id": "ok"}) if t1.request else None
    entry = replace(t1, status=TurnStatus.SUSPENDED, request=forked_request)
    plan = ForkPlan(KEY, dst, 0, park.position, (entry,), "suspended",
                    {CHILD["session"]: "new-child"})
    await store.fork([plan])
    assert await store.read_messages(dst) == await store.read_messages(KEY)
    copied = await store.checkpoints(dst)
    assert [cp.kind for cp in copied] == ["start", "model", "tool", "child"]
    assert copied[3].results == (ChildMemo("sub", "new-child", "t1:c9"),)
    events = [e for cp in copied for e in cp.events]
    assert [e.seq for e in events] == [e.seq for cp in history[:4] for e in cp.events]
    assert events[3].child is not None and events[3].child["session"] == "new-child"
    assert isinstance(events[4], InputRequested) and events[4].request == forked_request
    assert all((e.agent, e.session) == (dst.agent, dst.session) for e in events)
    assert "input:t1:ok@c9" not in await store.read_steps(dst)  # after the checkpoint
    fork_t1 = await get_turn(store, dst, "t1")
    assert fork_t1 is not None and fork_t1.status == "suspended"
    assert fork_t1.request == forked_request and fork_t1.opening == t1.opening
    info = await store.session_info(dst)
    assert info is not None and (info.status, info.generation) == ("suspended", 0)
    # The two timelines go on apart: a commit in the fork is not in the source.
    lease = await store.claim(dst)
    assert (lease.last_seq, lease.message_count) == (park.seq, park.messages)
    async with lease.transaction() as tx:
        tx.add_message(Message("assistant", "fork only", turn_id="t1"))
        tx.add_event(MessageCompleted(**{**event_ids("t1"), "session": dst.session},
                                      text="fork only"))
    await lease.release()
    assert await store.checkpoints(KEY) == history
    assert len(await store.read_messages(dst)) == len(await store.read_messages(KEY)) + 1
    # An address that exists: nothing of any plan is written.
    other = SessionKey("agent", "s1-other")
    try:
        await store.fork([ForkPlan(KEY, other, 0, park.position, (entry,), "suspended"),
                          ForkPlan(KEY, dst, 0, park.position, (entry,), "suspended")])
    except SessionExistsError:
        pass
    else:
        raise AssertionError("a fork onto an existing session was written")
    assert await store.checkpoints(other) == [] and await store.entries(other) == []


async def check_a_fork_before_any_checkpoint_is_an_empty_session(store: SessionStore) -> None:
    """A plan with no checkpoint writes only its chain: a new session with the turns given."""
    dst = SessionKey("agent", "blank")
    entry = replace(await _accepted(store), status=TurnStatus.QUEUED)
    await store.fork([ForkPlan(KEY, dst, 0, None, (entry,), "idle")])
    assert await store.checkpoints(dst) == [] and await store.read_messages(dst) == []
    assert [(t.turn_id, t.status) for t in await store.entries(dst)] == [("t1", "queued")]
    assert await store.find_sessions("unfinished") == sorted([KEY, dst])



async def check_a_fork_is_owned_by_its_plan_s_owner(store: SessionStore) -> None:
    """A plan's ``owner`` owns the fork, written with it; a fork onto a session that another
    owns (an empty one, as following its events makes) writes nothing."""
    entry = replace(await _accepted(store), status=TurnStatus.QUEUED)
    mine = SessionKey("agent", "mine")
    await store.fork([ForkPlan(KEY, mine, 0, None, (entry,), "idle", owner="ann")])
    info = await store.session_info(mine)
    assert info is not None and info.owner == "ann"
    taken = SessionKey("agent", "taken")
    assert await store.own_session(taken, "bob") == "bob"
    try:
        await store.fork([ForkPlan(KEY, taken, 0, None, (entry,), "idle", owner="ann")])
    except SessionExistsError:
        pass
    else:
        raise AssertionError("a fork onto a session another owns was written")
    assert await store.entries(taken) == []
    info = await store.session_info(taken)
    assert info is None or info.owner == "bob"


async def _accepted(store: SessionStore) -> ChainEntry:
    rec, _ = await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    return rec


__all__ = [
    "CALL",
    "CHILD",
    "check_a_fork_before_any_checkpoint_is_an_empty_session",
    "check_a_fork_copies_a_session_up_to_a_checkpoint",
    "check_a_fork_is_owned_by_its_plan_s_owner",
    "check_history_lists_every_commit_in_order",
]
