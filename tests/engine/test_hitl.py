"""Human in the loop (F6) and per-source policies (F10), on every store."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from durable_turns import (
    Agent,
    InboundEvent,
    ModelReply,
    Runtime,
    SurfacePolicy,
    ToolCall,
    ToolContext,
    grant_answer,
    scripted,
    tool,
)
from durable_turns._hitl import Grant
from durable_turns.commands import Reset
from durable_turns.errors import (
    InvalidInputError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionBusyError,
    TurnSuspendedError,
)
from durable_turns.events import TurnEvent
from durable_turns.models import ModelRequest
from durable_turns.stores import SessionStore
from durable_turns.testing import get_turn, step_result

log: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    log.clear()


@tool
async def issue_refund(order_id: str, ctx: ToolContext) -> dict[str, bool]:
    """Refund an order once a person approves it."""
    log.append(f"asked {order_id}")
    answerers = ctx.event.meta.get("answerers") if ctx.event else None
    approved = await ctx.request_input("approve-refund", f"Refund order {order_id}?",
                                       schema={"type": "boolean"}, answerers=answerers)
    if approved is not True:
        return {"refunded": False}
    log.append(f"refunded {order_id}")
    return {"refunded": True}


@tool
def local_asks(ctx: ToolContext) -> None:
    """A local tool cannot park."""
    ctx.request_input("x", "?")


@tool
async def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}"


REFUND = [ModelReply("", [ToolCall("c1", "issue_refund", {"order_id": "42"})]),
          ModelReply("Refund handled.")]


def make(store: SessionStore, replies: Any = REFUND, **agent: Any) -> Runtime:
    async def authorize(d: Any) -> bool:
        if d["by"] == "boom":
            raise RuntimeError("directory is down")
        return bool(d["policy"] == "operator" and d["scope"] == "eu" and d["by"] == "op1")

    agent.setdefault("authorize_answer", authorize)
    return Runtime([Agent("ops", "Base.", [issue_refund, local_asks, lookup], **agent)], store,
                   scripted(replies))


def slack(user: str = "U1", attested: bool = True, **meta: Any) -> InboundEvent:
    return InboundEvent("slack", {"id": user, "attested": attested}, "refund 42", raw={"x": 1},
                        meta=meta)


async def test_park_then_resume_runs_the_tool_again_from_the_top(store: SessionStore) -> None:
    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    seen: list[TurnEvent] = []
    s.observe(seen.append)
    t = await s.start("refund order 42")
    r = await s.result(t.turn_id)
    assert r.status == "suspended"
    assert r.request == await s.pending()
    assert r.request is not None
    assert r.request.id == "approve-refund" and r.request.call_id == "c1"
    assert r.request.answerers is None  # no inbound event: no restriction
    assert await s.status() == "suspended"
    assert seen[-1].type == "input.requested"
    assert [e.type for e in await s.events()][-1] == "input.requested"
    await s.resume(t.turn_id, "approve-refund", True)
    done = await s.result(t.turn_id)
    assert (done.status, done.text) == ("completed", "Refund handled.")
    assert log == ["asked 42", "asked 42", "refunded 42"]
    assert await s.pending() is None and await s.status() == "idle"
    assert await step_result(store, s.key, f"input:{t.turn_id}:approve-refund") is not None
    with pytest.raises(TurnSuspendedError):
        await s.turn("refund again")
    await rt.close()


async def test_the_attested_speaker_is_the_default_answerer(store: SessionStore) -> None:
    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start(event=slack("U1"))
    r = await s.result(t.turn_id)
    # Qualified by where it was verified: Slack's U1, not an HTTP principal of that name.
    assert r.request is not None and r.request.answerers == {"user": "slack:U1"}
    with pytest.raises(ResumeAuthorizationError, match="only user 'slack:U1'"):
        await s.resume(t.turn_id, "approve-refund", True, by="U2")
    with pytest.raises(ResumeAuthorizationError, match="named nobody"):
        await s.resume(t.turn_id, "approve-refund", True)
    with pytest.raises(ResumeAuthorizationError):
        await s.resume(t.turn_id, "approve-refund", True, by="")
    await s.resume(t.turn_id, "approve-refund", False, by="U1")
    assert (await s.result(t.turn_id)).status == "completed"
    assert log == ["asked 42", "asked 42"]  # denied: nothing refunded
    # the inbound event is stored without its raw payload
    rec = await get_turn(store, s.key, t.turn_id)
    assert rec is not None and rec.event is not None and "raw" not in rec.event
    await rt.close()


async def test_an_unattested_speaker_cannot_park(store: SessionStore) -> None:
    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    r = await s.turn(event=slack("someone@example.com", attested=False))
    assert r.status == "failed" and "name an answerer" in (r.error or "")
    assert await s.status() == "idle"
    await rt.close()


async def test_policy_answerers_need_a_grant(store: SessionStore) -> None:
    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    ev = slack("U1", answerers={"policy": "operator", "scope": "eu"})
    t = await s.start(event=ev)
    req = (await s.result(t.turn_id)).request
    assert req is not None and req.answerers == {"policy": "operator", "scope": "eu"}
    resume = {"turn_id": t.turn_id, "input_id": "approve-refund", "by": "op1", "principal": {}}
    with pytest.raises(ResumeAuthorizationError, match="by alone never answers"):
        await s.resume(t.turn_id, "approve-refund", True, by="op1")
    with pytest.raises(ResumeAuthorizationError, match="may not answer"):
        await grant_answer(s, {**resume, "by": "intruder"})
    # authorize_answer raising: nothing is applied, and the same answer can be retried
    with pytest.raises(RuntimeError, match="directory is down"):
        await grant_answer(s, {**resume, "by": "boom"})
    assert await s.pending() == req
    grant = await grant_answer(s, resume)
    forged = Grant(str(s.key), t.turn_id, "approve-refund", "operator", "eu", "op1", "0" * 64)
    other_scope = dataclasses.replace(grant, scope="us")
    foreign = await grant_answer(s, resume, authorize_answer=_yes)
    foreign = dataclasses.replace(foreign, signature="f" * 64)
    for bad in (forged, other_scope, foreign):
        with pytest.raises(ResumeAuthorizationError):
            await s.resume(t.turn_id, "approve-refund", True, by="op1", granted=bad)
    with pytest.raises(ResumeAuthorizationError, match="another request"):
        await s.resume(t.turn_id, "approve-refund", True, by="op2", granted=grant)
    await s.resume(t.turn_id, "approve-refund", True, by="op1", granted=grant)
    assert (await s.result(t.turn_id)).status == "completed"
    assert log[-1] == "refunded 42"
    await rt.close()


async def _yes(d: Any) -> bool:
    return True


async def test_a_grant_never_answers_a_user_and_a_user_needs_no_grant(
    store: SessionStore,
) -> None:
    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start(event=slack("U1"))
    await s.result(t.turn_id)
    with pytest.raises(ResumeAuthorizationError, match="not answered under a policy"):
        await grant_answer(s, {"turn_id": t.turn_id, "input_id": "approve-refund", "by": "U2"})
    await rt.close()


async def test_bad_resumes_are_refused_and_store_nothing(store: SessionStore) -> None:
    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("refund 42")
    await s.result(t.turn_id)
    with pytest.raises(InvalidInputError, match="is not of type 'boolean'"):
        await s.resume(t.turn_id, "approve-refund", "yes please")
    assert await step_result(store, s.key, f"input:{t.turn_id}:approve-refund") is None
    assert await s.status() == "suspended"
    with pytest.raises(ResumeConflictError, match="parked on turn"):
        await s.resume("other-turn", "approve-refund", True)
    with pytest.raises(ResumeConflictError, match="waits for input 'approve-refund'"):
        await s.resume(t.turn_id, "approve-shipping", True)
    await s.resume(t.turn_id, "approve-refund", True)
    await s.result(t.turn_id)
    await s.resume(t.turn_id, "approve-refund", True)  # the same answer again: one answer
    with pytest.raises(ResumeConflictError, match="answered already") as refused:
        await s.resume(t.turn_id, "approve-refund", False)
    assert (refused.value.turn_id, refused.value.input_id) == (t.turn_id, "approve-refund")
    with pytest.raises(ResumeConflictError, match="not waiting for input"):
        await s.resume(t.turn_id, "approve-other", True)
    await rt.close()


async def test_one_park_at_a_time(store: SessionStore) -> None:
    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("refund 42", turn_id="t1")
    await s.result("t1")
    with pytest.raises(SessionBusyError, match="parked on turn 't1'"):
        await s.start("something else")
    with pytest.raises(SessionBusyError):
        await s.start("something else", replace=True)
    again = await s.start("refund 42", turn_id="t1")  # redelivery of the parked turn
    assert not again.new and (await s.result("t1")).status == "suspended"
    assert (await s.result(t.turn_id)).status == "suspended"  # replace never cancelled it
    await rt.close()


async def test_answers_are_turn_scoped(store: SessionStore) -> None:
    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    t1 = await s.start("refund 42")
    await s.result(t1.turn_id)
    await s.resume(t1.turn_id, "approve-refund", True)
    await s.result(t1.turn_id)
    t2 = await s.start("refund 42 again")
    assert (await s.result(t2.turn_id)).status == "suspended"  # the old approval is not reused
    await rt.close()


async def test_a_local_tool_cannot_park(store: SessionStore) -> None:
    rt = make(store, [ModelReply("", [ToolCall("c1", "local_asks", {})])])
    await rt.open()
    r = await rt.session("ops", "s1").turn("go")
    assert r.status == "failed" and "declare the tool `async def`" in (r.error or "")
    await rt.close()


async def test_reset_archives_a_stale_park_and_resume_refuses_while_it_is_pending(
    store: SessionStore,
) -> None:
    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("refund 42")
    await s.result(t.turn_id)
    # another process accepted a reset that has not run yet
    await store.enqueue(s.key, Reset("reset:other").entry())
    with pytest.raises(ResumeConflictError, match=r"reset .* is pending"):
        await s.resume(t.turn_id, "approve-refund", True)
    res = await s.reset()  # runs after the pending one: two generations archived
    assert (res.previous_session, res.generation) == ("s1#g1", 2)
    assert (await s.result(t.turn_id)).reason == "reset"
    assert await s.pending() is None and await s.status() == "new"
    fresh = await s.start("refund 7", turn_id="fresh")  # the session takes turns again
    assert (await s.result(fresh.turn_id)).status == "suspended"
    await rt.close()


# -- per-source policies -------------------------------------------------------------------


class Recorder:
    def __init__(self, replies: list[ModelReply]) -> None:
        self.requests: list[ModelRequest] = []
        self.inner = scripted(replies)

    def stream(self, request: ModelRequest) -> Any:
        self.requests.append(request)
        return self.inner.stream(request)


async def test_surface_policy_overlays_the_prompt_and_denies_tools(store: SessionStore) -> None:
    model = Recorder([ModelReply("", [ToolCall("c1", "issue_refund", {"order_id": "1"})]),
                      ModelReply("no refunds from slack")])
    surfaces = {"slack": SurfacePolicy("replace", ("issue_refund",), "Slack only."),
                "email": SurfacePolicy("append", (), "Be formal.")}
    rt = Runtime([Agent("ops", "Base.", [issue_refund, lookup], surfaces=surfaces)], store, model)
    await rt.open()
    s = rt.session("ops", "s1")
    r = await s.turn(event=slack())
    assert r.status == "completed"
    req = model.requests[0]
    assert req.system == "Slack only."
    assert [t.name for t in req.tools] == ["lookup"]
    results = [m.result for m in await s.transcript() if m.role == "tool"]
    assert results == [{"error": "unknown tool: issue_refund"}]  # enforced in code
    assert log == []
    model.requests.clear()
    model.inner = scripted([ModelReply("ok")])
    await rt.session("ops", "s2").turn(
        event=InboundEvent("email", {"id": "a@b"}, "hi"))
    assert model.requests[0].system == "Base.\n\nBe formal."
    await rt.session("ops", "s3").turn("no event")
    assert model.requests[-1].system == "Base."
    await rt.close()


async def test_a_resumed_turn_keeps_the_policy_it_parked_with(store: SessionStore) -> None:
    model = Recorder(REFUND)
    agent = Agent("ops", "Base.", [issue_refund],
                  surfaces={"slack": SurfacePolicy("append", (), "Overlay A.")})
    rt = Runtime([agent], store, model)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start(event=slack())
    await s.result(t.turn_id)
    await rt.close()
    # the app was redeployed with another overlay while the turn waited
    changed = Agent("ops", "Base.", [issue_refund],
                    surfaces={"slack": SurfacePolicy("append", (), "Overlay B.")})
    rt2 = Runtime([changed], store, model)
    await rt2.open()
    s2 = rt2.session("ops", "s1")
    await s2.resume(t.turn_id, "approve-refund", True, by="U1")
    assert (await s2.result(t.turn_id)).status == "completed"
    assert model.requests[-1].system == "Base.\n\nOverlay A."
    await rt2.close()


@tool
async def swallows(ctx: ToolContext) -> str:
    """A tool whose broad except must not swallow the runtime's park signal."""
    try:
        await ctx.request_input("ok", "Proceed?")
    except Exception:  # the point of the test: a park is not an Exception
        log.append("swallowed")
        return "swallowed"
    return "proceeded"


async def test_a_broad_except_in_a_tool_cannot_swallow_the_park(store: SessionStore) -> None:
    rt = Runtime([Agent("ops", "", [swallows])], store,
                 scripted([ModelReply("", [ToolCall("c1", "swallows", {})]), ModelReply("ok")]))
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("go")
    assert (await s.result(t.turn_id)).status == "suspended"
    await s.resume(t.turn_id, "ok", "yes")
    assert (await s.result(t.turn_id)).status == "completed"
    assert log == []
    results = [m.result for m in await s.transcript() if m.role == "tool"]
    assert results == ["proceeded"]
    await rt.close()


async def test_a_trigger_turn_has_no_person_and_no_answerer_restriction(
    store: SessionStore,
) -> None:
    from durable_turns import Trigger

    rt = make(store)
    await rt.open()
    s = rt.session("ops", "s1")
    t = await s.start("Refund order 42 as scheduled.",
                      trigger=Trigger(kind="proactive", by="cron:daily"))
    r = await s.result(t.turn_id)
    assert r.status == "suspended" and r.request is not None and r.request.answerers is None
    opening = (await s.transcript())[0]
    assert (opening.role, opening.by) == ("trigger", "cron:daily")
    await s.resume(t.turn_id, "approve-refund", True)  # the app drives its own resume
    assert (await s.result(t.turn_id)).status == "completed"
    await rt.close()
