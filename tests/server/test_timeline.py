"""A turn's timeline (F12, the console's timeline view and ``GET …/timeline``), on every store.

The rows are read off the durable events' ``at``: these tests run real turns and check the
rows' kinds, statuses and the order of their times; no test asserts how long a step took,
only what the events prove (a wait the test itself made is inside the input row).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from durable_turns import (
    Agent,
    Compaction,
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
from durable_turns.events import TurnEvent, event_from_fields
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.server import create_app
from durable_turns.server._timeline import read_timeline
from durable_turns.stores import SessionStore


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once a person approves it."""
    ok = await ctx.request_input("approve", f"Refund {order_id}?", schema={"type": "boolean"},
                                 answerers={"user": "alice"})
    return {"refunded": ok}


@tool
def explode() -> str:
    """Fails the whole turn."""
    raise FatalToolError("the ledger is gone")


def chained(rows: list[dict[str, Any]]) -> bool:
    """Every row starts no earlier than the one before it ended, and ends after it starts."""
    last = 0.0
    for r in rows:
        if r["started_at"] < last or (r["ended_at"] is not None
                                      and r["ended_at"] < r["started_at"]):
            return False
        last = r["ended_at"] if r["ended_at"] is not None else r["started_at"]
    return True


async def test_a_parked_then_answered_turn_reads_as_timed_rows(store: SessionStore) -> None:
    replies = [ModelReply("Asking.", [ToolCall("c1", "refund", {"order_id": "42"})]),
               ModelReply("Refunded.")]
    rt = Runtime([Agent("desk", "", [refund])], store, scripted(replies))
    await rt.open()
    s = rt.session("desk", "s1")
    started = await s.start("refund 42")
    parked = await s.result(started.turn_id)
    assert parked.status == "suspended"
    waited_from = time.time()

    snap = await read_timeline(s)
    (turn,) = snap["turns"]
    assert turn["status"] == "suspended"
    assert [(r["kind"], r["status"]) for r in turn["steps"]] == [
        ("model", "done"), ("tool", "parked"), ("input", "waiting")]
    assert turn["steps"][1]["id"] == "tool:1:c1"
    assert turn["steps"][2]["id"] == f"input:{started.turn_id}:approve"
    assert turn["steps"][2]["answerers"] == {"user": "alice"}
    assert snap["seq"] == max(e.seq for e in await store.read_events(s.key))

    waited_to = time.time()
    await s.resume(started.turn_id, "approve", True, by="alice")
    done = await s.result(started.turn_id)
    assert done.status == "completed"
    snap = await read_timeline(s)
    (turn,) = snap["turns"]
    rows = turn["steps"]
    assert [(r["kind"], r["status"], r.get("resumed")) for r in rows] == [
        ("model", "done", None), ("tool", "parked", False), ("input", "answered", None),
        ("tool", "done", True), ("model", "done", None)]
    assert (rows[2]["value"], rows[2]["by"]) == (True, "alice")
    assert rows[3]["id"] == "tool:1:c1" and rows[3]["result"] == {"refunded": True}
    assert chained(rows) and all(r["duration"] >= 0 for r in rows)
    # The person's wait (which this test made) is in the input row, not in a tool's time.
    assert rows[2]["duration"] >= waited_to - waited_from
    assert turn["duration"] >= rows[2]["duration"]
    assert (turn["result"], turn["by"], turn["role"]) == ("Refunded.", None, "user")
    await rt.close()


class _Stream:
    def __init__(self, *events: ModelEvent) -> None:
        self.events = events

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        for e in self.events:
            yield e


async def test_a_failed_model_call_is_the_failed_row(store: SessionStore) -> None:
    rt = Runtime([Agent("desk", "", model_retries=0)], store, _Stream(TextDelta("cut off")))
    await rt.open()
    s = rt.session("desk", "s1")
    assert (await s.turn("go")).status == "failed"
    (turn,) = (await read_timeline(s))["turns"]
    assert turn["status"] == "failed" and "without a Stop" in turn["error"]
    assert [(r["kind"], r["status"]) for r in turn["steps"]] == [("model", "failed")]
    assert turn["steps"][0]["error"] == turn["error"]
    await rt.close()


async def test_a_fatal_tool_is_where_the_turn_failed(store: SessionStore) -> None:
    model = scripted([ModelReply("", [ToolCall("c1", "explode", {})])])
    rt = Runtime([Agent("desk", "", [explode])], store, model)
    await rt.open()
    s = rt.session("desk", "s1")
    assert (await s.turn("go")).status == "failed"
    (turn,) = (await read_timeline(s))["turns"]
    assert [(r["kind"], r["status"]) for r in turn["steps"]] == [
        ("model", "done"), ("tool", "failed")]
    assert "the ledger is gone" in turn["steps"][1]["error"]
    await rt.close()


async def test_a_reset_leaves_the_archived_turns_out(store: SessionStore) -> None:
    rt = Runtime([Agent("desk", "")], store, scripted(lambda _r: ModelReply("ok")))
    await rt.open()
    s = rt.session("desk", "s1")
    await s.turn("first")
    before = (await read_timeline(s))["seq"]
    await s.reset()
    assert (await read_timeline(s)) == {"seq": before, "earlier": 0, "turns": []}
    await s.turn("second")
    snap = await read_timeline(s)
    assert [t["text"] for t in snap["turns"]] == ["second"] and snap["seq"] > before
    await rt.close()


async def test_an_events_time_is_stored_and_an_old_event_has_none(store: SessionStore) -> None:
    rt = Runtime([Agent("desk", "")], store, scripted(lambda _r: ModelReply("ok")))
    await rt.open()
    s = rt.session("desk", "s1")
    live: list[TurnEvent] = []
    s.observe(live.append)
    await s.turn("hi")
    stored = await s.events()
    await rt.close()
    assert all(e.at is not None and abs(e.at - time.time()) < 3600 for e in stored)
    assert [e.to_dict() for e in stored] == [
        e.to_dict() for e in live if e.type != "message.delta"]
    # Stored before events carried their time: its fields alone.
    old = event_from_fields("desk", "s1", 1, stored[0].turn_id, "turn.started", {"text": "hi"})
    assert old.at is None and old == stored[0]  # times are not compared


async def test_the_sessions_list_says_when_each_was_last_active(store: SessionStore) -> None:
    rt = Runtime([Agent("desk", "")], store, scripted(lambda _r: ModelReply("ok")))
    async with rt:
        await rt.session("desk", "older").turn("one")
        await rt.session("desk", "newer").turn("two")
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            listed = (await c.get("/agents/desk/sessions")).json()["sessions"]
            new = (await c.get("/agents/desk/sessions/never/timeline")).json()
        latest = {k: max(e.at for e in await store.read_events(rt.session("desk", k).key)
                         if e.at is not None) for k in ("older", "newer")}
        assert [(x["session"], x["last_activity"]) for x in listed] == [
            ("newer", latest["newer"]), ("older", latest["older"])]
        assert latest["newer"] >= latest["older"]
        assert (new["status"], new["seq"], new["turns"], new["pending"]) == ("new", 0, [], None)


async def test_the_last_turns_only_read_from_their_first_event_on(store: SessionStore) -> None:
    rt = Runtime([Agent("desk", "")], store, scripted(lambda r: ModelReply(
        f"ok {r.messages[-1].text}")))
    await rt.open()
    s = rt.session("desk", "s1")
    for n in range(5):
        await s.turn(f"turn {n}")
    whole = await read_timeline(s)
    tail = await read_timeline(s, last=2)
    assert (whole["earlier"], tail["earlier"]) == (0, 3)
    assert tail["seq"] == whole["seq"]
    assert tail["turns"] == whole["turns"][-2:]
    assert [t["result"] for t in tail["turns"]] == ["ok turn 3", "ok turn 4"]
    assert await read_timeline(s, last=9) == whole
    transport = httpx.ASGITransport(app=create_app(rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        got = (await c.get("/agents/desk/sessions/s1/timeline?last=1")).json()
        assert [t["text"] for t in got["turns"]] == ["turn 4"] and got["earlier"] == 4
        for bad in ("0", "-1", "x", "²"):
            refused = await c.get(f"/agents/desk/sessions/s1/timeline?last={bad}")
            assert refused.status_code == 400, bad
            assert refused.json()["error"]["type"] == "MalformedQuery"
    await rt.close()


async def test_a_reset_leaves_the_archived_turns_out_of_the_session_s_turns(
        store: SessionStore) -> None:
    rt = Runtime([Agent("ops", "You help.")], store,
                 scripted(lambda request: ModelReply("Hi.")))
    app = create_app(rt)
    async with rt, httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as client:
        s1 = "/agents/ops/sessions/s1"
        assert (await client.post(f"{s1}/chat", json={"text": "before"})).status_code == 200
        assert (await client.post(f"{s1}/reset", json={})).status_code == 200
        shown = (await client.get(s1)).json()
        assert (shown["status"], shown["transcript"], shown["turns"]) == ("new", [], [])
        assert (await client.get(f"{s1}/timeline")).json()["turns"] == []
        archived = await rt.session("ops", "s1").archive(0)
        assert [m.text for m in archived.messages] == ["before", "Hi."]
        await client.post(f"{s1}/chat", json={"text": "after"})
        shown = (await client.get(s1)).json()
        assert [t["opening"] for t in shown["turns"]] == ["after"]
        assert [t.opening.text for t in await rt.session("ops", "s1").turns()
                if t.opening] == ["after"]


class Pages:
    """Fetches a page per question, then answers; reports the request's size as usage."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        size = sum(len(m.text) + len(str(m.result or "")) for m in request.messages) // 4
        if request.messages[-1].role == "user":
            yield ToolCall(f"c{len(request.messages)}", "page", {"n": len(request.messages)})
            yield Stop("tool_use", {"input_tokens": size, "output_tokens": 5})
        else:
            yield TextDelta("read it")
            yield Stop("end_turn", {"input_tokens": size, "output_tokens": 2})


class Summary:
    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield TextDelta(f"The user read {len(request.messages)} messages' worth of pages.")
        yield Stop("end_turn")


@tool
async def page(n: int) -> str:
    """A page of a long document."""
    return f"page {n}: " + "lorem ipsum " * 200


def reader() -> Agent:
    return Agent("reader", "You read.", [page], context=Compaction(
        trigger_tokens=1500, keep_recent=4, model=Summary()))


async def test_a_compaction_is_a_row_with_its_tokens_and_summary(store: SessionStore) -> None:
    """F23: where the session was compacted reads as a ``compact`` row (its step id, the
    tokens before and after, the summary), before the model row it made room for."""
    async with Runtime([reader()], store, Pages()) as rt:
        s = rt.session("reader", "s1")
        for i in range(8):
            assert (await s.turn(f"read {i}")).status == "completed"
        snap = await read_timeline(s)
        events = [e.to_dict() for e in await s.events() if e.type == "context.compacted"]
    rows = [r for t in snap["turns"] for r in t["steps"]]
    compact = [r for r in rows if r["kind"] == "compact"]
    assert [r["id"] for r in compact] == [e["step"] for e in events] and compact
    for r, e in zip(compact, events, strict=True):
        assert (r["tokens_before"], r["tokens_after"], r["summary"], r["summarised"]) == (
            e["tokens_before"], e["tokens_after"], e["summary"], e["summarised"])
        after = rows[rows.index(r) + 1]
        assert after["kind"] == "model" and after["id"] == "model:" + r["id"].split(":")[1]
    summarised = [r for r in compact if r["summarised"]]
    assert summarised and summarised[-1]["summary"].startswith("The user read ")
    assert chained([r for t in snap["turns"] for r in t["steps"]])
