"""Tracing with OpenTelemetry (F17): the span tree of a turn, its links, its errors.

The OpenTelemetry API takes one global tracer provider per process, so this module sets it
once, with a span processor that hands finished spans to the exporter of the test that runs
(and drops them when none does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.errors import ModelError
from durable_turns.stores import SessionStore

HERE = Path(__file__).resolve().parents[1]
WAIT = 30.0


class Forward(SpanProcessor):
    """Hands finished spans to whichever exporter a test installed."""

    def __init__(self) -> None:
        self.exporter: InMemorySpanExporter | None = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.exporter is not None:
            self.exporter.export([span])


FORWARD = Forward()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(FORWARD)
        trace.set_tracer_provider(provider)
    FORWARD.exporter = exporter = InMemorySpanExporter()
    try:
        yield exporter
    finally:
        FORWARD.exporter = None


def tree(finished: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> list[tuple[Any, ...]]:
    """Each span as (turn span #, name, step id, replayed, attempt), children by start order."""
    turns = [s for s in finished if s.name == "durable_turns.turn"]
    turns.sort(key=lambda s: s.start_time or 0)
    index = {s.context.span_id: i for i, s in enumerate(turns) if s.context is not None}
    rows = []
    for s in sorted(finished, key=lambda s: (s.start_time or 0, s.end_time or 0)):
        if s.name == "durable_turns.turn":
            continue
        attrs = s.attributes or {}
        assert s.parent is not None
        rows.append((index[s.parent.span_id], s.name, attrs.get("durable_turns.step_id"),
                     attrs.get("durable_turns.replayed", False),
                     attrs.get("durable_turns.attempt")))
    return rows


def refund_agent() -> tuple[Agent, Any]:
    failures = {"n": 0}

    @tool(retries=1, retry_delay=0.001)
    async def lookup(order: str, ctx: ToolContext) -> dict[str, Any]:
        """Look an order up."""
        if failures["n"] == 0:
            failures["n"] += 1
            raise ConnectionError("orders API reset")
        return {"order": order, "paid": 30}

    @tool
    async def refund(order: str, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order once a person approves."""
        ok = await ctx.request_input("approve", f"Refund order {order}?",
                                     schema={"type": "boolean"})
        return {"refunded": ok is True}

    model = scripted([
        ModelReply("Looking.", [ToolCall("c1", "lookup", {"order": "42"})],
                   usage={"input_tokens": 11, "output_tokens": 3}),
        ModelReply("Refunding.", [ToolCall("c2", "refund", {"order": "42"})],
                   usage={"input_tokens": 20, "output_tokens": 4}),
        ModelReply("Refunded.", usage={"input_tokens": 30, "output_tokens": 2}),
    ])
    return Agent("shop", "You refund orders.", [lookup, refund]), model


async def test_the_span_tree_of_a_turn_with_two_tools_a_retry_and_a_park(
        spans: InMemorySpanExporter, store_factory: Callable[[], SessionStore]) -> None:
    agent, model = refund_agent()
    async with Runtime([agent], store_factory(), model) as rt:
        session = rt.session("shop", "s1")
        parked = await session.result((await session.start("refund 42", turn_id="t1")).turn_id)
        assert parked.status == "suspended" and parked.request is not None
        first = list(spans.get_finished_spans())
        await session.resume("t1", "approve", True, by="alice")
        done = await session.result("t1", timeout=WAIT)
        assert done.status == "completed"
        record = (await rt.store.entries(rt.key("shop", "s1"), turn_id="t1"))[0]
    finished = spans.get_finished_spans()

    # The park ended the first turn span: it was exported before anyone answered.
    assert [s.name for s in first].count("durable_turns.turn") == 1
    turns = sorted((s for s in finished if s.name == "durable_turns.turn"),
                   key=lambda s: s.start_time or 0)
    assert len(turns) == 2
    assert tree(finished) == [
        (0, "chat ScriptedModel", "model:1", False, 1),
        (0, "execute_tool lookup", "tool:1:c1", False, 2),
        (0, "chat ScriptedModel", "model:3", False, 1),
        (0, "execute_tool refund", "tool:3:c2", False, 1),
        (1, "chat ScriptedModel", "model:1", True, None),
        (1, "execute_tool lookup", "tool:1:c1", True, None),
        (1, "chat ScriptedModel", "model:3", True, None),
        (1, "execute_tool refund", "tool:3:c2", False, 1),  # runs again, reads the answer:
        (1, "durable_turns.input", "input:t1:approve", False, None),
        (1, "chat ScriptedModel", "model:5", False, 1),
    ]
    a, b = turns
    assert a.attributes is not None and b.attributes is not None
    assert a.attributes["durable_turns.turn.status"] == "suspended"
    assert a.attributes["durable_turns.input.id"] == "approve"
    assert b.attributes["durable_turns.turn.status"] == "completed"
    for t in turns:
        assert t.attributes is not None
        assert t.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert t.attributes["durable_turns.session"] == "shop/s1"
        assert t.attributes["durable_turns.turn_id"] == "t1"
    # The resumed span is a new trace, linked to the parked one.
    assert a.context is not None and b.context is not None
    assert b.context.trace_id != a.context.trace_id
    assert [(ln.context.trace_id, ln.context.span_id, dict(ln.attributes or {}))
            for ln in b.links] == [(a.context.trace_id, a.context.span_id,
                                    {"durable_turns.link": "resumed"})]

    by_step = {(s.attributes or {}).get("durable_turns.step_id"): s for s in finished
               if s.parent is not None and s.parent.span_id == a.context.span_id}
    chat = by_step["model:1"].attributes or {}
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.request.model"] == "ScriptedModel"
    assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (11, 3)
    lookup = by_step["tool:1:c1"]
    attrs = lookup.attributes or {}
    assert (attrs["gen_ai.operation.name"], attrs["gen_ai.tool.name"],
            attrs["gen_ai.tool.call.id"]) == ("execute_tool", "lookup", "c1")
    assert [(e.name, (e.attributes or {})["durable_turns.attempt"],
             (e.attributes or {})["error.message"]) for e in lookup.events] == [
        ("durable_turns.retry", 1, "ConnectionError: orders API reset")]
    assert lookup.status.status_code == StatusCode.UNSET
    assert (by_step["tool:3:c2"].attributes or {})["durable_turns.parked"] is True
    answer = next(s for s in finished if s.name == "durable_turns.input")
    assert (answer.attributes or {})["durable_turns.input.by"] == "alice"
    # Usage adds up per span of the turn; the replayed steps keep their stored usage.
    assert (a.attributes["gen_ai.usage.input_tokens"], b.attributes[
        "gen_ai.usage.input_tokens"]) == (31, 30)
    replayed = [s for s in finished if (s.attributes or {}).get("durable_turns.replayed")]
    assert (replayed[0].attributes or {})["gen_ai.usage.input_tokens"] == 11
    # The turn's record names the last span, so a later process can link to it.
    assert record.data == {"trace": {"trace_id": f"{b.context.trace_id:032x}",
                                     "span_id": f"{b.context.span_id:016x}",
                                     "ended": "completed"}}


async def test_errors_set_the_span_status(spans: InMemorySpanExporter) -> None:
    @tool
    async def broken(ctx: ToolContext) -> str:
        """Always fails."""
        raise RuntimeError("disk on fire")

    calls = 0

    def reply(_request: Any) -> ModelReply:
        nonlocal calls
        calls += 1
        if calls == 1:
            return ModelReply("", [ToolCall("c1", "broken", {})])
        raise ModelError("provider: bad request", provider="demo")

    async with Runtime([Agent("ops", tools=[broken], model_retries=0)], MemoryStore(),
                       scripted(reply)) as rt:
        result = await rt.session("ops", "s1").turn("go", turn_id="t1")
    assert result.status == "failed"
    by_name = {s.name: s for s in spans.get_finished_spans()}
    tool_span = by_name["execute_tool broken"]
    assert tool_span.status.status_code == StatusCode.ERROR
    assert tool_span.status.description == "RuntimeError: disk on fire"
    turn_span = by_name["durable_turns.turn"]
    assert turn_span.status.status_code == StatusCode.ERROR
    assert "provider: bad request" in (turn_span.status.description or "")
    assert (turn_span.attributes or {})["durable_turns.turn.status"] == "failed"
    failed_chat = [s for s in spans.get_finished_spans()
                   if s.name == "chat ScriptedModel" and s.status.status_code == StatusCode.ERROR]
    assert len(failed_chat) == 1


async def test_spans_follow_the_applications_current_span(spans: InMemorySpanExporter) -> None:
    # A turn driven in the caller's task (here: start() then result()) is not required to
    # nest under the caller; but the turn span always roots its own steps.
    async with Runtime([Agent("ops")], MemoryStore(), scripted([ModelReply("hi")])) as rt:
        await rt.session("ops", "s1").turn("hello", turn_id="t1")
    finished = spans.get_finished_spans()
    turn_span = next(s for s in finished if s.name == "durable_turns.turn")
    chat = next(s for s in finished if s.name.startswith("chat "))
    assert turn_span.context is not None and chat.parent is not None
    assert chat.parent.span_id == turn_span.context.span_id
    assert chat.context is not None and chat.context.trace_id == turn_span.context.trace_id


# -- a replay after a crash, in real processes ---------------------------------------------

CHILD = r'''
import asyncio, json, os, signal, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from durable_turns import (Agent, ModelReply, Runtime, SqliteStore, ToolCall, ToolContext,
                           scripted, tool)

db, out, kill = sys.argv[1], sys.argv[2], sys.argv[3] == "kill"

class ToFile(SpanExporter):
    def export(self, spans):
        with open(out, "a") as f:
            for s in spans:
                f.write(json.dumps({
                    "name": s.name, "trace_id": s.context.trace_id, "span_id": s.context.span_id,
                    "parent": s.parent.span_id if s.parent else None,
                    "links": [[l.context.trace_id, l.context.span_id, dict(l.attributes)]
                              for l in s.links],
                    "attributes": dict(s.attributes), "pid": os.getpid()}) + "\n")
        return SpanExportResult.SUCCESS

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ToFile()))
trace.set_tracer_provider(provider)

@tool
async def notify(text: str, ctx: ToolContext) -> str:
    """Tell the team."""
    if kill:
        os.kill(os.getpid(), signal.SIGKILL)
    return "sent"

model = scripted([ModelReply("Telling them.", [ToolCall("c1", "notify", {"text": "hi"})]),
                  ModelReply("Done.")])

async def main():
    async with Runtime([Agent("ops", tools=[notify])], SqliteStore(db), model) as rt:
        session = rt.session("ops", "s1")
        await session.start("tell the team", turn_id="t1")
        print((await session.result("t1")).status)

asyncio.run(asyncio.wait_for(main(), 30))
'''


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_replay_after_a_crash_links_to_the_crashed_attempt(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    db, out = tmp_path / "db.sqlite", tmp_path / "spans.jsonl"
    crashed = subprocess.run([sys.executable, str(script), str(db), str(out), "kill"],
                             capture_output=True, text=True, timeout=WAIT)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    before = read_spans(out)
    # The crashed attempt's turn span never ended (so was never exported); its model step did.
    assert [s["name"] for s in before] == ["chat ScriptedModel"]
    crashed_turn = before[0]["parent"]
    replay = subprocess.run([sys.executable, str(script), str(db), str(out), "run"],
                            capture_output=True, text=True, timeout=WAIT)
    assert replay.returncode == 0 and replay.stdout.strip() == "completed", replay.stderr
    after = [s for s in read_spans(out) if s["pid"] != before[0]["pid"]]
    turn = next(s for s in after if s["name"] == "durable_turns.turn")
    assert turn["links"] == [[before[0]["trace_id"], crashed_turn,
                              {"durable_turns.link": "replayed"}]]
    steps = [(s["name"], s["attributes"].get("durable_turns.replayed", False))
             for s in after if s["name"] != "durable_turns.turn"]
    assert steps == [("chat ScriptedModel", True), ("execute_tool notify", False),
                     ("chat ScriptedModel", False)]


def test_without_a_tracer_provider_or_the_api_nothing_is_traced(tmp_path: Path) -> None:
    code = r'''
import asyncio, sys
if sys.argv[1] == "no-api":
    sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
from durable_turns import Agent, MemoryStore, ModelReply, Runtime, scripted
from durable_turns._tracing import begin_turn
async def main():
    async with Runtime([Agent("ops")], MemoryStore(), scripted([ModelReply("hi")])) as rt:
        print((await rt.session("ops", "s1").turn("hello")).text)
asyncio.run(main())
loaded = [m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v is not None]
print(loaded == [] or sys.argv[1])
'''
    for mode in ("no-api", "no-provider"):
        proc = subprocess.run([sys.executable, "-c", code, mode], capture_output=True,
                              text=True, timeout=WAIT, env={**os.environ})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["hi", "True" if mode == "no-api" else "no-provider"]


def test_the_turn_record_keeps_no_span_context_when_not_tracing(tmp_path: Path) -> None:
    # This process has a tracer provider once a test above ran: look from a fresh one.
    code = (f"import asyncio, sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE / 'engine')!r}]; "
            f"import test_tracing as t; "
            f"print(asyncio.run(t._untraced_record({str(tmp_path)!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=WAIT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"


async def _untraced_record(tmp: str) -> Any:
    async with Runtime([Agent("ops")], SqliteStore(Path(tmp) / "db.sqlite"),
                       scripted([ModelReply("hi")])) as rt:
        await rt.session("ops", "s1").turn("hello", turn_id="t1")
        found = await rt.store.entries(rt.key("ops", "s1"), turn_id="t1")
        return found[0].data



async def test_a_retried_turn_links_to_its_failed_stretch(spans: InMemorySpanExporter) -> None:
    calls = 0

    def reply(_request: Any) -> ModelReply:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ModelError("provider: overloaded", provider="demo")
        return ModelReply("Back.")

    async with Runtime([Agent("ops", model_retries=0)], MemoryStore(), scripted(reply)) as rt:
        session = rt.session("ops", "s1")
        assert (await session.turn("hi", turn_id="t1")).status == "failed"
        await session.retry("t1")
        assert (await session.result("t1", timeout=WAIT)).status == "completed"
    turns = sorted((s for s in spans.get_finished_spans() if s.name == "durable_turns.turn"),
                   key=lambda s: s.start_time or 0)
    assert [(t.attributes or {})["durable_turns.turn.status"] for t in turns] == [
        "failed", "completed"]
    failed, retried = turns
    assert failed.context is not None
    assert [(ln.context.span_id, dict(ln.attributes or {})) for ln in retried.links] == [
        (failed.context.span_id, {"durable_turns.link": "retried"})]


async def test_turn_data_a_channel_sets_mid_turn_survives_tracing(
    spans: InMemorySpanExporter, store: SessionStore,
) -> None:
    # A channel keeps its delivery state on the turn while it runs; tracing writes its span
    # context on the same entry. Each owns its name: neither write drops the other's.
    key = Runtime([Agent("ops")], store).key("ops", "s1")

    @tool
    async def deliver(ctx: ToolContext) -> str:
        """Post the reply somewhere."""
        await store.set_turn_data(key, ctx.turn_id, "delivery", {"ts": "1.1"})
        return "posted"

    model = scripted([ModelReply("Posting.", [ToolCall("c1", "deliver", {})]),
                      ModelReply("Posted.")])
    async with Runtime([Agent("ops", tools=[deliver])], store, model) as rt:
        assert (await rt.session("ops", "s1").turn("post it", turn_id="t1")).status \
            == "completed"
        (rec,) = await store.entries(key, turn_id="t1")
    assert rec.data is not None and rec.data.get("delivery") == {"ts": "1.1"}
    assert set(rec.data) == {"delivery", "trace"} and rec.data["trace"]["ended"] == "completed"
    assert any(s.name == "durable_turns.turn" for s in spans.get_finished_spans())
