"""F25 limits: a turn's spend (model calls, tool calls, tokens, cost) is counted from its stored
steps and checked before each model call. ``fail`` ends the turn ``failed`` naming the limit
(its transcript valid); ``ask`` parks it on ``limit:<n>`` (yes grants as much again, no
fails) — answered here or from another process; a SIGKILLed worker's replay counts the spend
the first run stored. Cost is priced from the usage the fake Anthropic server reports.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crashkit import wait_for_child_file
from durable_turns import (
    Agent,
    LimitExceeded,
    Limits,
    MemoryStore,
    Price,
    Runtime,
    SqliteStore,
    Stop,
    ToolCall,
    tool,
)
from durable_turns.errors import ConfigurationError
from durable_turns.messages import Message, owed_calls
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.models.anthropic_messages import anthropic
from durable_turns.stores import SessionStore
from fakes.anthropic_api import Reply, Text, ToolUse, anthropic_app
from fakes.serving import serving

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""


@tool
async def step(n: int) -> int:
    """One more step of the work (a remote tool)."""
    return n


class Endless:
    """Always asks for one more ``step``: only a limit ends its turn."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        n = sum(1 for m in request.messages if m.role == "assistant")
        yield ToolCall(f"c{n}", "step", {"n": n})
        yield Stop("tool_use", {"input_tokens": 10, "output_tokens": 5})


def valid(transcript: list[Message]) -> bool:
    """Every call the log's replies made is answered."""
    return not owed_calls(transcript)[1]


async def test_a_model_call_limit_that_asks_parks_at_the_fourth_call_and_extends(
    store: SessionStore,
) -> None:
    model = Endless()
    agent = Agent("ops", "", [step], limits=Limits(model_calls=3, on_exceed="ask"))
    async with Runtime([agent], store, model) as rt:
        s = rt.session("ops", "s1")
        t = await s.start("work")
        parked = await asyncio.wait_for(s.result(t.turn_id), WAIT)
        assert parked.status == "suspended" and model.calls == 3  # the 4th was not asked
        assert parked.request is not None and parked.request.id == "limit:1"
        assert parked.request.schema == {"type": "boolean"}
        assert "model_calls limit (3)" in parked.request.prompt
        assert "3 model calls" in parked.request.prompt
        await s.resume(t.turn_id, "limit:1", True)
        again = await asyncio.wait_for(s.result(t.turn_id), WAIT)
        assert again.status == "suspended" and model.calls == 6
        assert again.request is not None and again.request.id == "limit:2"
        await s.resume(t.turn_id, "limit:2", False)
        done = await asyncio.wait_for(s.result(t.turn_id), WAIT)
        assert done.status == "failed" and done.error is not None
        assert done.error.startswith("LimitExceeded: the turn reached its model_calls limit (6)")
        assert model.calls == 6
        assert valid(await s.transcript())


async def test_a_tool_call_limit_that_fails_names_it_and_leaves_a_valid_transcript(
    store: SessionStore,
) -> None:
    model = Endless()
    async with Runtime([Agent("ops", "", [step])], store, model) as rt:
        s = rt.session("ops", "s1")
        t = await s.start("work", limits=Limits(tool_calls=2))  # this turn's own
        done = await asyncio.wait_for(s.result(t.turn_id), WAIT)
        assert (done.status, model.calls) == ("failed", 2)
        assert done.error is not None and "tool_calls limit (2)" in done.error
        assert valid(await s.transcript())
        # The next turn has no limit of its own and its agent none: it would run on, so
        # it gets one to end it.
        t2 = await s.start("more", limits=Limits(input_tokens=15))
        done2 = await asyncio.wait_for(s.result(t2.turn_id), WAIT)
        assert done2.error is not None and "input_tokens limit (15)" in done2.error


def test_limits_are_checked_when_made() -> None:
    with pytest.raises(ConfigurationError):
        Limits(model_calls=0)
    with pytest.raises(ConfigurationError):
        Limits(on_exceed="later")  # type: ignore[arg-type]
    assert str(LimitExceeded("cost_usd", 0.5, "x")).startswith(
        "LimitExceeded: the turn reached its cost_usd limit (0.5)")


async def test_cost_is_priced_from_the_usage_the_anthropic_api_reports() -> None:
    # Each reply reports 1,000 input and 500 output tokens: $0.003 + $0.0075 = $0.0105.
    script = [Reply([ToolUse("step", {"n": i})], input_tokens=1000, output_tokens=500)
              for i in range(3)] + [Reply([Text("never")])]
    app = anthropic_app(script)
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0)
        agent = Agent("ops", "", [step], model=model,
                      limits=Limits(cost_usd=0.02), prices={"claude-test": Price(3.0, 15.0)})
        async with Runtime([agent], MemoryStore()) as rt:
            s = rt.session("ops", "s1")
            done = await asyncio.wait_for(s.turn("work"), WAIT)
        await model.aclose()
    assert done.status == "failed" and done.error is not None
    assert "cost_usd limit (0.02)" in done.error and "$0.0210" in done.error
    assert len(app.state.requests) == 2  # the third call would have passed the cap


# -- another process, and a SIGKILL --------------------------------------------------------

CHILD = """
import asyncio, pathlib, sys
from durable_turns import Agent, Limits, Runtime, SqliteStore, PostgresStore, Stop, ToolCall, tool

kind, url, marks, role = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), sys.argv[4]
store = SqliteStore(url) if kind == "sqlite" else PostgresStore(url, lease_ttl=1.0)

@tool
async def step(n: int) -> int:
    '''One more step.'''
    return n

class Endless:
    async def stream(self, request):
        n = sum(1 for m in request.messages if m.role == "assistant")
        with (marks / "calls").open("a") as f:
            f.write(f"{role} {n}\\n")
        if role == "answerer" and n == 4:  # after the grant: the test SIGKILLs us here
            (marks / "in-call-4").write_text("yes")
            await asyncio.sleep(120)
        yield ToolCall(f"c{n}", "step", {"n": n})
        yield Stop("tool_use", {"input_tokens": 10, "output_tokens": 5})

async def main():
    agent = Agent("ops", "", [step], limits=Limits(model_calls=3, on_exceed="ask"))
    async with Runtime([agent], store, Endless()) as rt:
        s = rt.session("ops", "s1")
        if role == "worker":
            await s.start("work", turn_id="t1")
            r = await s.result("t1", timeout=60)
            (marks / "parked").write_text(r.request.id)
        else:  # grants it, and drives the turn on from here
            await s.resume("t1", "limit:1", True)
            await s.result("t1", timeout=60)

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_an_ask_extended_from_another_process_and_replayed_counts_the_same(
    kind: str, tmp_path: Path,
) -> None:
    from conftest import pg_schema_dsn

    url = str(tmp_path / "db.sqlite") if kind == "sqlite" else pg_schema_dsn()
    marks = tmp_path / "marks"
    marks.mkdir()

    def child(role: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", CHILD, kind, url, str(marks), role])

    worker = child("worker")
    answerer = None
    try:
        assert await asyncio.to_thread(worker.wait, WAIT) == 0
        assert (marks / "parked").read_text() == "limit:1"
        answerer = child("answerer")  # another process grants it and drives on
        # it dies in the call after the grant
        await wait_for_child_file(marks / "in-call-4", answerer)
        answerer.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(answerer.wait, WAIT) == -signal.SIGKILL
        store: SessionStore
        if kind == "sqlite":
            store = SqliteStore(url)
        else:
            from durable_turns import PostgresStore

            store = PostgresStore(url, lease_ttl=1.0)
        model = Endless()
        agent = Agent("ops", "", [step], limits=Limits(model_calls=3, on_exceed="ask"))
        async with Runtime([agent], store, model) as rt:
            await rt.recover()
            s = rt.session("ops", "s1")
            r = await asyncio.wait_for(s.result("t1"), WAIT)
            # The replay counted the 4 stored calls (3, then 1 after the grant) and parks
            # after 2 more: 6 in all, as a run with no crash would.
            assert r.status == "suspended" and r.request is not None
            assert r.request.id == "limit:2" and model.calls == 2
            replies = [m for m in await s.transcript() if m.role == "assistant"]
            assert len(replies) == 6 and valid(await s.transcript())
            usage = sum(m.usage["input_tokens"] for m in replies)
            assert usage == 60
        seen = (marks / "calls").read_text().splitlines()
        assert seen == ["worker 0", "worker 1", "worker 2", "answerer 3", "answerer 4"]
    finally:
        for p in (worker, answerer):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait(WAIT)
