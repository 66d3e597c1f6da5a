"""Checks of the chain: accepting entries, cancels, parks, supersedes, turn data."""

from __future__ import annotations

import contextlib

from ..errors import SessionBusyError
from ..events import (
    MessageCompleted,
)
from ..messages import Message
from ..records import (
    InputRequest,
    NewEntry,
    SessionKey,
    TurnResult,
    TurnStatus,
)
from ..stores import SessionStore
from .helpers import KEY, event_ids, get_turn, opening, park


async def check_enqueue_is_durable_and_idempotent(store: SessionStore) -> None:
    """Accepted entries are durable and in order; an id accepted again is returned as it is."""
    assert await store.session_info(KEY) is None
    t1, new1 = await store.enqueue(KEY, NewEntry("t1", opening("t1"), event={"source": "x"}))
    t2, new2 = await store.enqueue(KEY, NewEntry("t2", opening("t2")))
    again, new3 = await store.enqueue(KEY, NewEntry("t1", opening("t1", "other text")))
    assert (new1, new2, new3) == (True, True, False)
    assert t1.status == "queued" and t1.ordinal < t2.ordinal
    assert again.opening is not None and again.opening.text == "hello"
    assert again.event == {"source": "x"}
    info = await store.session_info(KEY)
    assert info is not None and info.status == "new" and info.generation == 0
    assert [t.turn_id for t in await store.entries(KEY, unfinished=True)] == ["t1", "t2"]
    assert await store.find_sessions("unfinished") == [KEY]
    got = await get_turn(store, KEY, "t2")
    assert got is not None and got.opening == opening("t2")
    assert await get_turn(store, KEY, "nope") is None


async def check_cancel_requests_are_durable(store: SessionStore) -> None:
    """A cancel is asked of unfinished turns once each, durably, with or without a lease."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    await store.enqueue(KEY, NewEntry("t2", opening("t2")))
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
    """A name of a turn's data is set without a lease (only_new: a compare-and-set), and the
    engine's commit keeps it."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)  # a driver holds the session: channel state needs no lease
    assert await store.set_turn_data(KEY, "t1", "stream", {"ts": "1.1"}) == {"ts": "1.1"}
    assert await store.set_turn_data(KEY, "t1", "stream", {"ts": "2.2"}, only_new=True) == {
        "ts": "1.1"}
    assert await store.set_turn_data(KEY, "t1", "prompt", "3.3", only_new=True) == "3.3"
    async with lease.transaction() as tx:  # the engine's own write keeps the names
        tx.set_turn(TurnResult("t1", TurnStatus.COMPLETED, text="done"))
    await lease.release()
    (t,) = await store.entries(KEY, turn_id="t1")
    assert t.status == "completed" and t.text == "done"
    assert t.data == {"stream": {"ts": "1.1"}, "prompt": "3.3"}
    assert await store.set_turn_data(KEY, "nope", "x", 1) is None
    assert await store.set_turn_data(SessionKey("agent", "none"), "t1", "x", 1) is None
    # Data accepted with its entry, in the same write (a new session, then a known one).
    for key in (SessionKey("agent", "with-data"), SessionKey("agent", "with-data")):
        tid = f"d{len(await store.entries(key))}"
        rec, new = await store.enqueue(key, NewEntry(tid, opening(tid), data={"k": [1, "a"]}))
        assert new and rec.data == {"k": [1, "a"]}
        (found,) = await store.entries(key, turn_id=tid)
        assert found.data == {"k": [1, "a"]}
        assert await store.set_turn_data(key, tid, "other", 2) == 2
        (found,) = await store.entries(key, turn_id=tid)
        assert found.data == {"k": [1, "a"], "other": 2}


async def check_turn_data_of_two_writers_merges(store: SessionStore) -> None:
    """The engine (in its step's transaction) and a channel (without a lease) write the same
    entry's data, each its own name: neither write drops the other's."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
        tx.set_turn_data("t1", "trace", {"span": "a"})
    assert await store.set_turn_data(KEY, "t1", "delivery", {"ts": "1.1"}) == {"ts": "1.1"}
    async with lease.transaction() as tx:
        tx.set_turn_data("t1", "trace", {"span": "b"})
        tx.set_turn(TurnResult("t1", TurnStatus.COMPLETED, text="done"))
    await lease.release()
    (t,) = await store.entries(KEY, turn_id="t1")
    assert t.data == {"trace": {"span": "b"}, "delivery": {"ts": "1.1"}}, t.data
    assert (t.status, t.text) == ("completed", "done")


async def check_a_cancel_withdraws_a_park(store: SessionStore) -> None:
    """A cancel reaches a parked turn: its request no longer stands (no inbox, no refusal of
    new turns) and the turn is work for a driver, which ends it; a supersede never does."""
    await park(store, KEY, "p1")
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
    rec, new = await store.enqueue(KEY, NewEntry("p2", opening("p2")))
    assert new and rec.status == "queued"


async def check_parked_session_refuses_other_turns(store: SessionStore) -> None:
    """A parked session refuses new turns, and the commands that declare so
    (``while_parked="refused"``), while a queued command that does not clear the park changes
    nothing; it lists as parked, not as work for a driver."""
    await park(store, KEY, "t1", InputRequest("approve", "ok?"))
    _, new = await store.enqueue(KEY, NewEntry("c1", kind="note", args={"text": "hi"}))
    assert new  # a command is accepted while parked (its rule by default) ...
    for refused in (NewEntry("t2", opening("t2")),  # ... it clears nothing: turns still wait
                    NewEntry("c2", kind="note", while_parked="refused")):
        try:
            await store.enqueue(KEY, refused)
        except SessionBusyError:
            pass
        else:
            raise AssertionError(f"a parked session accepted {refused.turn_id}")
    rec, new = await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    assert not new and rec.status == "suspended" and rec.request == InputRequest("approve", "ok?")
    assert [t.turn_id for t in await store.entries(KEY, unfinished=True)] == ["t1", "c1"]
    assert await store.find_sessions("parked") == [KEY]


async def check_supersede_cancels_unfinished_turns_but_not_a_park(store: SessionStore) -> None:
    """A superseding entry asks the queued and running turns to cancel, never a parked one;
    commands are accepted while parked."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    await store.enqueue(KEY, NewEntry("t2", opening("t2")))
    await store.enqueue(KEY, NewEntry("t3", opening("t3"), supersede="superseded by turn t3"))
    for turn_id, cancel in (("t1", "superseded by turn t3"), ("t2", "superseded by turn t3"),
                            ("t3", None)):
        rec = await get_turn(store, KEY, turn_id)
        assert rec is not None and rec.cancel == cancel, (turn_id, rec)
    # A parked turn is never superseded: a new turn is refused instead.
    other = SessionKey("agent", "parked")
    await park(store, other, "p1")
    with contextlib.suppress(SessionBusyError):
        await store.enqueue(other, NewEntry("p2", opening("p2"), supersede="replace"))
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


async def check_turn_data_commits_with_any_step(store: SessionStore) -> None:
    """A name of a turn's data set in a step that only logs events (the commonest step, which
    a store may write in a shorter way) commits with it, like any other write of the step."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        tx.add_message(Message("assistant", "thinking", turn_id="t1"))
        tx.add_event(MessageCompleted(**event_ids("t1"), text="thinking"))
        tx.set_turn_data("t1", "trace", {"spans": 1})
    await lease.release()
    t1 = await get_turn(store, KEY, "t1")
    assert t1 is not None and t1.data == {"trace": {"spans": 1}}, t1
    assert len(await store.read_events(KEY)) == 1


__all__ = [
    "check_a_cancel_withdraws_a_park",
    "check_cancel_requests_are_durable",
    "check_enqueue_is_durable_and_idempotent",
    "check_parked_session_refuses_other_turns",
    "check_supersede_cancels_unfinished_turns_but_not_a_park",
    "check_turn_data_commits_with_any_step",
    "check_turn_data_is_set_without_a_lease",
    "check_turn_data_of_two_writers_merges",
]
