"""Checks of the queries hosts read: sessions found, listed and summarised, owed deliveries."""

from __future__ import annotations

from ..records import (
    InputRequest,
    NewEntry,
    SessionKey,
    TurnResult,
    TurnStatus,
    Visibility,
)
from ..stores import SessionStore
from .helpers import KEY, get_turn, opening, park


async def check_sessions_are_found_by_turn_id(store: SessionStore) -> None:
    """Sessions are found by the id of a turn (not of a command)."""
    other = SessionKey("agent", "s2")
    await store.enqueue(KEY, NewEntry("shared", opening("shared")))
    await store.enqueue(other, NewEntry("shared", opening("shared")))
    await store.enqueue(other, NewEntry("own", opening("own")))
    await store.enqueue(other, NewEntry("r1", kind="reset"))
    assert await store.find_sessions(turn_id="shared") == [KEY, other]
    assert await store.find_sessions(turn_id="own") == [other]
    assert await store.find_sessions(turn_id="r1") == []  # chain entries that are not turns
    assert await store.find_sessions(turn_id="nope") == []
    assert await store.find_sessions("parked") == []


async def check_sessions_are_listed_newest_first(store: SessionStore) -> None:
    """An agent's sessions are listed newest first; a reset keeps a session's place."""
    names = ["b", "a", "c"]
    for name in names:
        await store.enqueue(SessionKey("agent", name), NewEntry(f"t-{name}", opening(f"t-{name}")))
    await store.enqueue(SessionKey("other", "z"), NewEntry("t-z", opening("t-z")))
    await store.enqueue(SessionKey("agent", "b"), NewEntry("t-b2", opening("t-b2")))
    await store.enqueue(SessionKey("agent", "a"), NewEntry("r", kind="reset"))
    assert await store.list_sessions("agent") == [SessionKey("agent", n) for n in "cab"]
    assert await store.list_sessions("other") == [SessionKey("other", "z")]
    assert await store.list_sessions("nobody") == []


async def check_sessions_are_summarised_with_what_they_wait_for(store: SessionStore) -> None:
    """``session_summaries``: every session of an agent, newest first, with its status,
    generation and the request of its parked turn; ``parked_only`` is the inbox (a parked
    turn whose request a cancel withdrew is not in it)."""
    asked, withdrawn = InputRequest("ok", "Refund?", turn_id="p1"), InputRequest("go", "Go?")
    assert await store.session_summaries("agent") == []
    await park(store, SessionKey("agent", "a"), "p1", asked)
    await store.enqueue(SessionKey("agent", "b"), NewEntry("t1", opening("t1")))
    await park(store, SessionKey("agent", "c"), "p2", withdrawn)
    await store.request_cancel(SessionKey("agent", "c"), "p2", "withdrawn")
    await store.enqueue(SessionKey("other", "z"), NewEntry("t1", opening("t1")))
    reset = SessionKey("agent", "a")
    summaries = await store.session_summaries("agent")
    assert [s.key.session for s in summaries] == ["c", "b", "a"]
    c, b, a = summaries
    assert (a.status, a.generation, a.pending) == ("suspended", 0, asked)
    assert (b.status, b.generation, b.pending) == ("new", 0, None)
    assert (c.status, c.pending) == ("suspended", None)
    assert await store.session_summaries("agent", parked_only=True) == [a]
    assert await store.session_summaries("nobody") == []
    # Answered (the turn ends) and reset: no longer parked, and the generation moves on.
    lease = await store.claim(reset)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("p1", TurnStatus.COMPLETED, text="done"))
        tx.set_status("idle")
        tx.new_generation()
    await lease.release()
    (after,) = [s for s in await store.session_summaries("agent") if s.key == reset]
    assert (after.status, after.generation, after.pending) == ("new", 1, None)
    assert await store.session_summaries("agent", parked_only=True) == []


async def check_a_session_is_owned_once(store: SessionStore) -> None:
    """``own_session``: the first principal to ask owns a session the store did not have; an
    owner is never replaced; a session made otherwise stays without one."""
    a, b = SessionKey("agent", "a"), SessionKey("agent", "b")
    assert await store.session_info(a) is None
    assert await store.own_session(a, "ann") == "ann"
    info = await store.session_info(a)
    assert info is not None and (info.owner, info.status, info.generation) == ("ann", "new", 0)
    assert await store.own_session(a, "bob") == "ann"  # taken: the owner stays
    await store.enqueue(a, NewEntry("t1", opening("t1")))
    assert await store.own_session(a, "bob") == "ann"
    await store.enqueue(b, NewEntry("t1", opening("t1")))  # made without an owner
    assert await store.own_session(b, "bob") is None
    info = await store.session_info(b)
    assert info is not None and info.owner is None
    assert {s.key.session: s.owner for s in await store.session_summaries("agent")} == {
        "a": "ann", "b": None}


async def check_listings_show_what_a_principal_may_see(store: SessionStore) -> None:
    """``session_summaries(visible=…)``: the sessions a principal owns, and those parked on a
    request it may answer (as the user named, under a policy it holds, or in a parallel
    batch's ``more``); nothing else, whatever the ids hold (quotes, ``%``, ``_``) and
    however long they are."""
    odd = 'a"%_!\\b'  # LIKE's wildcards, its escape, JSON's escapes
    carl = "carl@7f3c2a90-5b1e-4d8a-9c6f-2e4b8a1d0c3f"  # an id as long as an OIDC subject
    for name, owner in [("mine", "ann"), ("theirs", "bob"), ("odd", odd), ("none", None)]:
        key = SessionKey("agent", name)
        if owner is not None:
            await store.own_session(key, owner)
        await store.enqueue(key, NewEntry("t0", opening("t0")))
    await park(store, SessionKey("agent", "ask-ann"), "p1", InputRequest(
        "ok", 'Mention {"user":"bob"} in a prompt', answerers={"user": "ann"}, turn_id="p1"))
    await park(store, SessionKey("agent", "batch"), "p2", InputRequest(
        "a", "A?", answerers={"user": carl}, turn_id="p2",
        more=(InputRequest("b", "B?", answerers={"user": odd}, turn_id="p2"),)))
    await park(store, SessionKey("agent", "policy"), "p3", InputRequest(
        "ok", "Refund?", answerers={"policy": "refunds", "scope": "eu"}, turn_id="p3"))
    await park(store, SessionKey("agent", "prefix"), "p4", InputRequest(
        "ok", "Refund?", answerers={"user": "ann2"}, turn_id="p4"))

    async def shown(visible: Visibility, parked_only: bool = False) -> list[str]:
        found = await store.session_summaries("agent", parked_only=parked_only,
                                              visible=visible)
        return sorted(s.key.session for s in found)

    assert await shown(Visibility(owner="ann")) == ["mine"]
    assert await shown(Visibility(owner=odd)) == ["odd"]
    assert await shown(Visibility(owner="ann", answerer="ann")) == ["ask-ann", "mine"]
    assert await shown(Visibility(owner="ann", answerer="ann"), parked_only=True) == ["ask-ann"]
    assert await shown(Visibility(answerer="bob")) == []  # a prompt's text is not answerers
    assert await shown(Visibility(answerer=odd)) == ["batch"]
    assert await shown(Visibility(answerer=carl)) == ["batch"]
    assert await shown(Visibility(answerer=carl[:-1])) == []
    assert await shown(Visibility(answerer="an")) == []
    assert await shown(Visibility(policies=("refunds",))) == ["policy"]
    assert await shown(Visibility(policies=("refund", "other"))) == []
    assert await shown(Visibility()) == []
    assert len(await store.session_summaries("agent")) == 8


async def check_owed_deliveries_are_an_outbox(store: SessionStore) -> None:
    """``owed_deliveries``: the entries accepted with ``deliver`` set to a channel, in the
    order they were accepted, whatever their status, until ``settle_delivery``; each settled
    once."""
    s1, s2 = SessionKey("agent", "s1"), SessionKey("agent", "s2")
    first, _ = await store.enqueue(s1, NewEntry("t1", opening("t1"), deliver="slack"))
    await store.enqueue(s2, NewEntry("t2", opening("t2"), deliver="slack"))
    await store.enqueue(s1, NewEntry("t3", opening("t3"), deliver="slack"))  # a known session
    await store.enqueue(s1, NewEntry("t4", opening("t4"), deliver="repl"))
    await store.enqueue(s1, NewEntry("t5", opening("t5")))
    await store.enqueue(s2, NewEntry("t6", opening("t6"), deliver="slack", supersede="new"))
    assert first.deliver == "slack"
    lease = await store.claim(s2)  # an ended turn is still owed its delivery
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult("t2", TurnStatus.CANCELLED, reason="new"))
    await lease.release()
    owed = await store.owed_deliveries("slack")
    assert [(k, t.turn_id) for k, t in owed] == [(s1, "t1"), (s2, "t2"), (s1, "t3"), (s2, "t6")]
    assert {t.deliver for _, t in owed} == {"slack"}
    assert owed[1][1].status == "cancelled" and owed[0][1].opening == opening("t1")
    assert [t.turn_id for _, t in await store.owed_deliveries("repl")] == ["t4"]
    assert await store.owed_deliveries("nobody") == []
    assert await store.settle_delivery(s1, "t1") is True
    assert await store.settle_delivery(s1, "t1") is False  # settled once
    assert await store.settle_delivery(s1, "t5") is False  # never owed
    assert await store.settle_delivery(s2, "t1") is False  # no such entry there
    assert await store.settle_delivery(SessionKey("agent", "none"), "t1") is False
    assert [t.turn_id for _, t in await store.owed_deliveries("slack")] == ["t2", "t3", "t6"]
    t1 = await get_turn(store, s1, "t1")
    assert t1 is not None and t1.deliver is None and t1.status == "queued"
    # A redelivered accept of a settled entry does not owe it again.
    again, new = await store.enqueue(s1, NewEntry("t1", opening("t1"), deliver="slack"))
    assert not new and again.deliver is None
    assert [t.turn_id for _, t in await store.owed_deliveries("slack")] == ["t2", "t3", "t6"]
