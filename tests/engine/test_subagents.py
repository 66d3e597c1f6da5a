"""Subagents (F13), on every store: a tool that runs another agent's turn as a child."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from durable_turns import (
    Agent,
    InboundEvent,
    MemoryStore,
    ModelReply,
    Runtime,
    Stop,
    TextDelta,
    ToolCall,
    ToolContext,
    scripted,
    subagent,
    tool,
)
from durable_turns.errors import ResumeAuthorizationError, ResumeConflictError
from durable_turns.events import TurnEvent
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.records import Answer, SessionKey, TurnStatus
from durable_turns.scheduling import ClaimingScheduler, NoDriveScheduler
from durable_turns.sessions import AgentSession
from durable_turns.stores import SessionStore
from durable_turns.subagents import find_child, turn_usage
from durable_turns.testing import get_turn, step_result

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""
ASK = ToolCall("c1", "helper", {"task": "What is six times seven?"})


def relay(request: ModelRequest) -> ModelReply:
    """The parent's model: ask the helper, then repeat what it answered."""
    if calls_this_turn(request) == 0:
        return ModelReply("Asking the helper.", [ASK], usage={"output_tokens": 5})
    answer = request.messages[-1].result
    return ModelReply(f"The helper says: {answer}", usage={"output_tokens": 7})


@tool
async def approve(amount: int, ctx: ToolContext) -> str:
    """Ask a person to approve a payment."""
    ok = await ctx.request_input("approve", f"Pay {amount}?", schema={"type": "boolean"})
    return "paid" if ok else "not paid"


async def child_of(parent: AgentSession, turn_id: str, call_id: str) -> tuple[str, str]:
    """The child session and turn the parent's call started (recorded in its steps)."""
    found = await find_child(parent, turn_id, call_id)
    assert found is not None, f"no child of {turn_id}/{call_id} recorded"
    return found


def runtime(store: SessionStore, helper_model: Any, *helper_tools: Any) -> Runtime:
    lead = Agent("lead", "You delegate.", [subagent("helper", description="Does sums.")],
                 model=scripted(relay))
    helper = Agent("helper", "You do sums.", list(helper_tools), model=helper_model)
    return Runtime([lead, helper], store)


async def test_a_parent_gets_its_subagents_answer(store: SessionStore) -> None:
    rt = runtime(store, scripted([ModelReply("42", usage={"output_tokens": 3})]))
    await rt.open()
    s = rt.session("lead", "s1")
    seen: list[TurnEvent] = []
    s.observe(seen.append, turn_id="t1")
    r = await s.turn("Ask the helper", turn_id="t1")
    assert (r.status, r.text) == ("completed", "The helper says: {'answer': '42'}")
    # The child's live text reached the parent's observers, tagged, and was not stored.
    live = [e for e in seen if e.type == "message.delta" and e.child is not None]
    assert "".join(e.text for e in live) == "42"  # type: ignore[attr-defined]
    session_id, child_turn = await child_of(rt.session("lead", "s1"), "t1", "c1")
    child = rt.session("helper", session_id)
    assert [(m.role, m.text) for m in await child.transcript()] == [
        ("user", "What is six times seven?"), ("assistant", "42")]
    assert (await child.result(child_turn)).text == "42"
    # The child was recorded in the parent's steps under the parent's turn and call.
    assert await step_result(store, s.key, "child:t1:c1") is not None
    # Its events are in the parent's stream, tagged with the child, in the child's order.
    events = await s.events()
    tag = {"agent": "helper", "session": session_id, "turn_id": child_turn}
    forwarded = [e for e in events if e.child is not None]
    assert [e.type for e in forwarded] == ["turn.started", "message.completed",
                                           "turn.completed"]
    assert all(e.turn_id == "t1" and e.child and {k: e.child[k] for k in tag} == tag
               for e in forwarded)
    assert [e.type for e in events if e.child is None][-1] == "turn.completed"
    assert forwarded[0].to_dict()["child"]["agent"] == "helper"
    # The parent's usage includes the child's.
    assert turn_usage(events, "t1") == {"output_tokens": 15}
    # A redelivery of the finished parent starts no second child.
    await s.start("Ask the helper", turn_id="t1")
    assert len([t for t in await store.entries(child.key) if t.kind == "turn"]) == 1
    await rt.close()


async def test_cancelling_a_parent_parked_on_its_child_withdraws_both_requests(
        store: SessionStore) -> None:
    helper_model = scripted([ModelReply("", [ToolCall("h1", "approve", {"amount": 42})]),
                             ModelReply("Payment done.")])
    rt = runtime(store, helper_model, approve)
    await rt.open()
    s = rt.session("lead", "s1")
    alice = InboundEvent("web", {"id": "alice", "attested": True}, "Pay the bill")
    t = await s.start(event=alice, turn_id="t1")
    assert (await s.result(t.turn_id, timeout=WAIT)).status == "suspended"
    session_id, child_turn = await child_of(rt.session("lead", "s1"), "t1", "c1")
    child = rt.session("helper", session_id)
    assert await child.pending() is not None
    assert await s.cancel("t1", reason="not needed") == ["t1"]
    r = await s.result("t1", timeout=WAIT)
    assert (r.status, r.reason) == ("cancelled", "not needed")
    c = await child.result(child_turn, timeout=WAIT)
    assert c.status == "cancelled" and "parent turn cancelled: not needed" in (c.reason or "")
    assert await s.pending() is None and await child.pending() is None
    await rt.close()


async def test_a_child_that_parks_parks_the_parent_and_is_answered_through_it(
        store: SessionStore) -> None:
    helper_model = scripted([
        ModelReply("", [ToolCall("h1", "approve", {"amount": 42})]),
        ModelReply("Payment done."),
    ])
    rt = runtime(store, helper_model, approve)
    await rt.open()
    s = rt.session("lead", "s1")
    alice = InboundEvent("web", {"id": "alice", "attested": True}, "Pay the bill")
    t = await s.start(event=alice, turn_id="t1")
    r = await s.result(t.turn_id, timeout=WAIT)
    assert r.status == "suspended" and r.request is not None
    pending = await s.pending()
    assert pending == r.request
    session_id, child_turn = await child_of(rt.session("lead", "s1"), "t1", "c1")
    assert pending.prompt == "Pay 42?" and pending.schema == {"type": "boolean"}
    assert pending.answerers == {"user": "web:alice"}  # the child's rule: the speaker
    assert pending.child == {"agent": "helper", "session": session_id,
                             "turn_id": child_turn, "input_id": "approve"}
    assert (pending.turn_id, pending.call_id) == ("t1", "c1")
    child = rt.session("helper", session_id)
    assert (await child.pending()) is not None
    # The parent cannot be used to get round the child's approval gate.
    with pytest.raises(ResumeAuthorizationError):
        await s.resume("t1", pending.id, True, by="mallory")
    assert await step_result(store, child.key, f"input:{child_turn}:approve") is None
    await s.resume("t1", pending.id, True, by="alice")
    done = await s.result("t1", timeout=WAIT)
    assert (done.status, done.text) == (
        "completed", "The helper says: {'answer': 'Payment done.'}")
    assert await step_result(store, child.key, f"input:{child_turn}:approve") is not None
    assert (await child.result(child_turn)).status == "completed"
    # One child turn, and the park was forwarded once (the replay went on after it).
    forwarded = [e.type for e in await s.events() if e.child is not None]
    assert forwarded.count("input.requested") == 1 and forwarded.count("turn.started") == 1
    await rt.close()


class GatedModel:
    """The children's model: streams a word, then waits for a gate (a long model call);
    ``streaming`` is set once ``calls`` calls are streaming."""

    def __init__(self, calls: int = 1) -> None:
        self.streaming = asyncio.Event()
        self.gate = asyncio.Event()
        self._waiting = calls

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield TextDelta("working")
        self._waiting -= 1
        if self._waiting <= 0:
            self.streaming.set()
        await self.gate.wait()
        yield Stop("end_turn")


@pytest.mark.parametrize("how", ["cancel", "reset"])
async def test_cancelling_or_resetting_the_parent_cancels_its_running_child(
        store: SessionStore, how: str) -> None:
    model = GatedModel()
    rt = runtime(store, model)
    await rt.open()
    s = rt.session("lead", "s1")
    await s.start("Ask the helper", turn_id="t1")
    await asyncio.wait_for(model.streaming.wait(), WAIT)
    if how == "cancel":
        assert await s.cancel("t1", reason="changed my mind") == ["t1"]
    else:
        await asyncio.wait_for(s.reset(), WAIT)
    r = await s.result("t1", timeout=WAIT)
    assert r.status == "cancelled"
    session_id, child_turn = await child_of(rt.session("lead", "s1"), "t1", "c1")
    child = await get_turn(store, rt.key("helper", session_id), child_turn)
    assert child is not None and child.status == TurnStatus.CANCELLED
    assert "parent turn cancelled" in (child.reason or "")
    assert not model.gate.is_set()  # the child stopped mid-call: nothing let it finish
    await rt.close()


async def test_a_child_that_fails_is_an_error_result_for_the_parent(
        store: SessionStore) -> None:
    rt = runtime(store, scripted([]))  # the helper's model has no reply: its turn fails
    await rt.open()
    r = await rt.session("lead", "s1").turn("Ask the helper", turn_id="t1")
    assert r.status == "completed"
    assert "subagent 'helper' failed" in (r.text or "")
    await rt.close()


class FollowedStore(MemoryStore):
    """A memory store that tells when the events of one child turn were read and none was
    new: the parent following that child then waits for the child's next change (a memory
    store read never yields to the event loop, so nothing comes between)."""

    def __init__(self, turn_id: str) -> None:
        super().__init__()
        self.turn_id = turn_id
        self.caught_up = asyncio.Event()

    async def read_events(self, key: SessionKey, *, after_seq: int = 0,
                          turn_id: str | None = None) -> list[TurnEvent]:
        events = await super().read_events(key, after_seq=after_seq, turn_id=turn_id)
        if turn_id == self.turn_id and not events:
            self.caught_up.set()
        return events


async def test_a_cancel_that_comes_as_the_parent_wakes_for_its_child_still_stops_it() -> None:
    # The race seen on PostgreSQL under load, made certain: the parent is cancelled in the
    # very turn of the event loop in which the change it waits for (a step of the child)
    # is reported. On Python 3.11, asyncio.wait_for swallowed that cancel; the parent's
    # cancel is delivered to the waiting call once, so the child ran on and the parent
    # waited for it for ever.
    go, pausing, gate = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @tool
    async def pause() -> str:
        """Wait until the test says go."""
        pausing.set()
        async with asyncio.timeout(WAIT):
            await go.wait()
        return "resumed"

    async def child_reply(request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("", [ToolCall("p1", "pause", {})])
        await gate.wait()  # never opened: only a cancel ends this call
        return ModelReply("done")

    child_turn = "t1:c1"
    store = FollowedStore(child_turn)
    rt = runtime(store, scripted(child_reply), pause)
    await rt.open()
    s = rt.session("lead", "s1")
    await s.start("Ask the helper", turn_id="t1")
    async with asyncio.timeout(WAIT):
        await pausing.wait()
        store.caught_up.clear()
        await store.caught_up.wait()  # the parent has every child event so far, and waits
    session_id, _turn = await child_of(s, "t1", "c1")
    cancels: list[asyncio.Task[list[str]]] = []

    def on_child(events: list[TurnEvent] | None) -> None:
        # Told right after the parent's own watcher of the child, in the same step.
        if events and any(e.type == "action.completed" for e in events) and not cancels:
            cancels.append(asyncio.ensure_future(s.cancel("t1", reason="stop")))

    unwatch = store.watch(rt.key("helper", session_id), on_child)
    go.set()
    r = await s.result("t1", timeout=WAIT)
    unwatch()
    assert cancels and await cancels[0] == ["t1"]
    assert r.status == "cancelled"
    child = await get_turn(store, rt.key("helper", session_id), child_turn)
    assert child is not None and child.status == TurnStatus.CANCELLED
    assert "parent turn cancelled" in (child.reason or "")
    assert not gate.is_set()
    await rt.close()


class HelperModel:
    """A task with "slow" in it streams a word and waits for a gate; any other asks for
    an approval, then answers."""

    def __init__(self) -> None:
        self.streaming = asyncio.Event()
        self.gate = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        opening = next(m for m in reversed(request.messages) if m.is_opening)
        if "slow" in opening.text:
            yield TextDelta("working")
            self.streaming.set()
            await self.gate.wait()
            yield Stop("end_turn")
        elif calls_this_turn(request) == 0:
            yield ToolCall("h1", "approve", {"amount": 7})
            yield Stop("tool_use")
        else:
            yield TextDelta("Payment done.")
            yield Stop("end_turn")


async def test_parks_and_cancels_cross_workers_on_postgres(pg_dsn: str) -> None:
    from durable_turns import PostgresStore

    def lead_reply(request: ModelRequest) -> ModelReply:
        opening = next(m for m in reversed(request.messages) if m.is_opening)
        if calls_this_turn(request) == 0:
            return ModelReply("", [ToolCall("c1", "helper", {"task": opening.text})])
        return ModelReply(f"The helper says: {request.messages[-1].result}")

    helper_model = HelperModel()
    lead = Agent("lead", "", [subagent("helper", description="Pays.")],
                 model=scripted(lead_reply))
    helper = Agent("helper", "", [approve], model=helper_model)
    claims = ClaimingScheduler(poll_interval=0.2)
    worker = Runtime([lead, helper], PostgresStore(pg_dsn, lease_ttl=5.0), scheduler=claims)
    await worker.open()
    # A front that drives nothing: it accepts, answers and cancels; the worker drives.
    front = Runtime([Agent("lead"), Agent("helper")], PostgresStore(pg_dsn),
                    scheduler=NoDriveScheduler())
    await front.open()
    working = asyncio.ensure_future(claims.run())
    try:
        async with asyncio.timeout(WAIT):
            s = front.session("lead", "s1")
            await s.start("pay the bill", turn_id="t1")
            r = await s.result("t1")
            assert r.status == "suspended" and r.request is not None
            assert r.request.child is not None and r.request.prompt == "Pay 7?"
            await s.resume("t1", r.request.id, True)
            done = await s.result("t1")
            assert (done.status, done.text) == (
                "completed", "The helper says: {'answer': 'Payment done.'}")

            s2 = front.session("lead", "s2")
            await s2.start("slow job", turn_id="t2")
            await helper_model.streaming.wait()
            await s2.cancel("t2", reason="enough")
            assert (await s2.result("t2")).status == "cancelled"
            session_id, child_turn = await child_of(s2, "t2", "c1")
            child = await front.session("helper", session_id).result(child_turn)
            assert child.status == "cancelled"
    finally:
        working.cancel()
        await asyncio.gather(working, return_exceptions=True)
        await worker.close()
        await front.close()


def parallel_lead(store: SessionStore, helper_model: Any, *helper_tools: Any) -> Runtime:
    def reply(request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("", [ToolCall("a", "helper", {"task": "pay alice"}),
                                   ToolCall("b", "helper", {"task": "pay bob"})])
        return ModelReply("; ".join(str(m.result) for m in request.messages if m.call_id))

    lead = Agent("lead", "", [subagent("helper", description="Pays.")], model=scripted(reply),
                 parallel_tools=True)
    helper = Agent("helper", "", list(helper_tools), model=helper_model)
    return Runtime([lead, helper], store)


async def test_resetting_a_parent_parked_on_its_children_withdraws_their_requests(
        store: SessionStore) -> None:
    rt = parallel_lead(store, HelperModel(), approve)
    await rt.open()
    s = rt.session("lead", "s1")
    await s.start("pay both", turn_id="t1")
    r = await s.result("t1", timeout=WAIT)
    assert r.status == "suspended" and r.request is not None and len(r.request.all) == 2
    children = [await child_of(s, "t1", call) for call in ("a", "b")]
    for session_id, _turn in children:
        assert await rt.session("helper", session_id).pending() is not None
    await asyncio.wait_for(s.reset(), WAIT)
    assert await s.pending() is None
    assert (await s.result("t1")).status == "cancelled"
    (reset,) = [t.turn_id for t in await store.entries(s.key) if t.kind == "reset"]
    for session_id, turn_id in children:
        child = rt.session("helper", session_id)
        # Reset by an entry with the parent's reset's id: a replay of it adds no second one.
        assert [t.turn_id for t in await store.entries(child.key) if t.kind == "reset"] == [reset]
        assert await child.pending() is None  # no stale approval left open
        rec = await get_turn(store, child.key, turn_id)
        assert rec is not None and rec.status == TurnStatus.CANCELLED and rec.request is None
        with pytest.raises(ResumeConflictError):
            await child.resume(turn_id, "approve", True)
        # The child's history is archived, as a reset's is: still there to read.
        assert [m.text for m in (await child.archive(0)).messages][:1] == [
            "pay alice" if turn_id.endswith(":a") else "pay bob"]
    await rt.close()


async def test_two_subagents_of_one_batch_park_and_are_answered_one_by_one(
        store: SessionStore) -> None:
    rt = parallel_lead(store, HelperModel(), approve)
    await rt.open()
    s = rt.session("lead", "s1")
    await s.start("pay both", turn_id="t1")
    r = await s.result("t1", timeout=WAIT)
    assert r.status == "suspended" and r.request is not None
    asked = r.request.all
    assert [(q.call_id, q.child and q.child["input_id"]) for q in asked] == [
        ("a", "approve"), ("b", "approve")]
    await s.resume("t1", asked[1].id, False)
    r = await s.result("t1", timeout=WAIT)
    assert r.request is not None and [q.id for q in r.request.all] == [asked[0].id]
    await s.resume("t1", asked[0].id, True)
    r = await s.result("t1", timeout=WAIT)
    assert (r.status, r.text) == (
        "completed", "{'answer': 'Payment done.'}; {'answer': 'Payment done.'}")
    a_session, a_turn = await child_of(rt.session("lead", "s1"), "t1", "a")
    b_session, b_turn = await child_of(rt.session("lead", "s1"), "t1", "b")
    assert await step_result(store, rt.key("helper", a_session), f"input:{a_turn}:approve") \
        == Answer(True)
    assert await step_result(store, rt.key("helper", b_session), f"input:{b_turn}:approve") \
        == Answer(False)
    await rt.close()


async def test_cancelling_a_parent_cancels_every_child_of_its_batch(
        store: SessionStore) -> None:
    model = GatedModel(calls=2)  # both children started: each has a turn to cancel
    rt = parallel_lead(store, model)
    await rt.open()
    s = rt.session("lead", "s1")
    await s.start("pay both", turn_id="t1")
    await asyncio.wait_for(model.streaming.wait(), WAIT)
    await s.cancel("t1", reason="stop")
    assert (await s.result("t1", timeout=WAIT)).status == "cancelled"
    for call in ("a", "b"):
        session_id, turn_id = await child_of(rt.session("lead", "s1"), "t1", call)
        rec = await get_turn(store, rt.key("helper", session_id), turn_id)
        assert rec is not None and rec.status == TurnStatus.CANCELLED
    assert [m.result for m in await s.transcript() if m.role == "tool"] == [
        {"cancelled": True}, {"cancelled": True}]
    await rt.close()


async def test_a_parents_stream_shows_the_child_and_ends_with_the_parent(
        store: SessionStore) -> None:
    from durable_turns.channels import ChannelContext

    rt = runtime(store, scripted([ModelReply("42")]))
    await rt.open()
    ctx = ChannelContext(rt.agents["lead"], rt)
    seen = [(e.type, e.child["agent"] if e.child else None) async for e in
            ctx.run_stream("Ask the helper", session="s1", turn_id="t1")]
    assert ("turn.completed", "helper") in seen  # the child's end does not end the stream
    assert seen[-1] == ("turn.completed", None)
    assert seen[-1] != seen[0] and seen.count(("turn.completed", None)) == 1
    await rt.close()


async def test_the_terminal_nests_the_childs_work_and_asks_the_parents_question(
        store: SessionStore) -> None:
    from durable_turns.channels import ChannelContext
    from durable_turns.channels._repl import render

    rt = runtime(store, scripted([ModelReply("", [ToolCall("h1", "approve", {"amount": 3})]),
                                  ModelReply("Paid.")]), approve)
    await rt.open()
    ctx = ChannelContext(rt.agents["lead"], rt)
    printed: list[str] = []
    request = await render(ctx.run_stream("Pay 3", session="s1", turn_id="t1"),
                            printed.append)
    text = "".join(printed)
    assert "    [helper] → approve {\"amount\": 3}\n" in text
    assert request is not None and request.id == "approve@c1" and request.child is not None
    await rt.close()


async def test_a_parent_that_fails_mid_batch_cancels_its_running_child(
        store: SessionStore) -> None:
    from durable_turns import FatalToolError

    model = GatedModel()

    @tool
    async def give_up() -> None:
        """Fail the turn once the child is working."""
        await asyncio.wait_for(model.streaming.wait(), WAIT)
        raise FatalToolError("cannot go on")

    def reply(request: ModelRequest) -> ModelReply:
        return ModelReply("", [ToolCall("a", "helper", {"task": "work"}),
                               ToolCall("b", "give_up", {})])

    lead = Agent("lead", "", [subagent("helper", description="Works."), give_up],
                 model=scripted(reply), parallel_tools=True)
    rt = Runtime([lead, Agent("helper", "", model=model)], store)
    await rt.open()
    r = await rt.session("lead", "s1").turn("go", turn_id="t1")
    assert r.status == "failed" and "cannot go on" in (r.error or "")
    session_id, turn_id = await child_of(rt.session("lead", "s1"), "t1", "a")
    rec = await get_turn(store, rt.key("helper", session_id), turn_id)
    assert rec is not None and rec.status == TurnStatus.CANCELLED
    assert "turn failed" in (rec.reason or "")
    await rt.close()


async def test_a_childs_policy_request_is_granted_by_the_childs_rules_through_the_parent(
        store: SessionStore) -> None:
    from durable_turns import grant_answer

    @tool
    async def wire(amount: int, ctx: ToolContext) -> str:
        """Wire money once finance approves."""
        ok = await ctx.request_input("wire", f"Wire {amount}?",
                                     answerers={"policy": "finance", "scope": "eu"})
        return "wired" if ok else "not wired"

    async def finance(d: Any) -> bool:
        return bool(d["policy"] == "finance" and d["by"] == "fiona")

    async def nobody(d: Any) -> bool:
        return False

    lead = Agent("lead", "", [subagent("helper", description="Wires.")],
                 model=scripted(relay), authorize_answer=nobody)
    helper = Agent("helper", "", [wire], authorize_answer=finance, model=scripted([
        ModelReply("", [ToolCall("h1", "wire", {"amount": 5})]), ModelReply("Wired.")]))
    rt = Runtime([lead, helper], store)
    await rt.open()
    s = rt.session("lead", "s1")
    await s.start("wire it", turn_id="t1")
    r = await s.result("t1", timeout=WAIT)
    assert r.request is not None and r.request.answerers == {"policy": "finance",
                                                              "scope": "eu"}
    resume = {"turn_id": "t1", "input_id": r.request.id, "by": "mallory"}
    with pytest.raises(ResumeAuthorizationError):
        await grant_answer(s, resume)  # the child's rule decides, and says no
    with pytest.raises(ResumeAuthorizationError):
        await s.resume("t1", r.request.id, True, by="fiona")  # a policy needs a grant
    granted = await grant_answer(s, {**resume, "by": "fiona"})
    await s.resume("t1", r.request.id, True, by="fiona", granted=granted)
    done = await s.result("t1", timeout=WAIT)
    assert done.text == "The helper says: {'answer': 'Wired.'}"
    await rt.close()
