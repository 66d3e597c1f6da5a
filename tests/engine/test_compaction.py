"""F23 long sessions: a compaction step keeps every model request under the window.

A 200-turn session whose every turn fetches a large tool result runs to its end with each
request (measured here, independently of the engine's estimate) under the limit; the summary
model is called once per summarising compaction and never again on replay (SIGKILL right
after a compaction step committed, then inside the next model step; a SIGKILL inside the
summary call leaves nothing and that compaction is made once more); no request holds a
tool call without its result; every message stays in the store; ``context()`` is what the
next request sends; ``history()`` shows the compaction steps. Memory, SQLite, PostgreSQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from durable_turns import (
    Agent,
    Compaction,
    MemoryStore,
    Runtime,
    SqliteStore,
    Stop,
    TextDelta,
    ToolCall,
    tool,
)
from durable_turns.compaction import DEFAULT_INSTRUCTIONS, SUMMARY_PREFIX
from durable_turns.messages import Message
from durable_turns.model import ModelEvent, ModelRequest
from durable_turns.models.anthropic_messages import anthropic
from durable_turns.models.openai_compat import openai_compatible
from durable_turns.stores import SessionStore
from fakes import openai_api as oa
from fakes.anthropic_api import Fail, Reply, Text, ToolUse, anthropic_app
from fakes.serving import serving

WAIT = 60.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""
LIMIT = 4000
"""The window the fake model enforces, in tokens (JSON length over four, its own count)."""
BIG = "x" * 2400


def size_of(request: ModelRequest) -> int:
    body = [dataclasses.asdict(m) for m in request.messages]
    return len(json.dumps([request.system, body], default=str)) // 4


def check_pairs(request: ModelRequest) -> None:
    """Every tool call of the request has its result right after it, and no result is
    without its call or sent twice."""
    msgs = request.messages
    answered = [m.call_id for m in msgs if m.role == "tool"]
    assert len(answered) == len(set(answered)), "a tool result sent twice"
    for i, m in enumerate(msgs):
        if m.role == "tool":
            owner = next(p for p in reversed(msgs[:i]) if p.role != "tool")
            assert owner.role == "assistant" and m.call_id in {c.id for c in owner.tool_calls}
        for c in m.tool_calls:
            answers = [r.call_id for r in msgs[i + 1:i + 1 + len(m.tool_calls)]]
            assert c.id in answers, f"tool call {c.id} sent without its result"


@tool
async def fetch(n: int) -> str:
    """A large document."""
    return f"{n}:{BIG}"


class Windowed:
    """Refuses (fails the test) any request over :data:`LIMIT`; asks for ``fetch`` once a
    turn, then answers."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.first: list[str] = []
        """The text of each request's first message."""
        self.last: ModelRequest | None = None
        self.sent: list[list[Message]] = []
        """Every request's messages."""
        self.prefix = f"c{uuid.uuid4().hex[:6]}-"
        """Its calls' ids begin so: another instance (a process after a crash) makes others."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        size = size_of(request)
        self.sizes.append(size)
        self.first.append(request.messages[0].text)
        self.last = request
        self.sent.append(list(request.messages))
        assert size <= LIMIT, f"a request of {size} tokens, over the window of {LIMIT}"
        check_pairs(request)
        last = request.messages[-1]
        if last.role == "user":
            yield ToolCall(f"{self.prefix}{len(self.sizes)}", "fetch", {"n": len(self.sizes)})
            yield Stop("tool_use", {"input_tokens": size, "output_tokens": 10})
        else:
            yield TextDelta("done")
            yield Stop("end_turn", {"input_tokens": size, "output_tokens": 2})


class Summariser:
    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        check_pairs(request)
        yield TextDelta(f"summary {self.calls} of {len(request.messages)} messages")
        yield Stop("end_turn", {"input_tokens": 100, "output_tokens": 10})


def agent(summariser: Summariser) -> Agent:
    return Agent("ops", "You run ops.", [fetch], context=Compaction(
        trigger_tokens=3000, keep_recent=6, model=summariser))


async def test_a_long_session_stays_under_the_window(store: SessionStore) -> None:
    model, summariser = Windowed(), Summariser()
    async with Runtime([agent(summariser)], store, model) as rt:
        s = rt.session("ops", "long")
        for i in range(200):
            r = await s.turn(f"turn {i}")
            assert r.status == "completed", r.error
        transcript = await s.transcript()
        context = await s.context()
        history = await s.history()
        events = await s.events()
    assert len(transcript) == 800  # every message stays in the store
    whole = size_of(ModelRequest("You run ops.", transcript, []))
    assert whole > 20 * LIMIT  # without compaction the session would have overflowed
    assert len(model.sizes) == 400 and max(model.sizes) <= LIMIT
    compacted = [e for e in events if e.type == "context.compacted"]
    summarised = [e for e in compacted if e.to_dict()["summarised"]]
    assert summarised and summariser.calls == len(summarised)
    assert all(e.to_dict()["tokens_after"] < e.to_dict()["tokens_before"] for e in compacted)
    steps = [st for c in history for st in c.steps if st.kind == "compact"]
    assert [st.id for st in steps] == [e.to_dict()["step"] for e in compacted]
    assert context.messages[0].text.startswith(SUMMARY_PREFIX)
    assert context.messages[-1] == transcript[-1] and size_of(context) <= LIMIT
    # Between two compactions each request begins with the one before it, message for
    # message (the system prompt and the summary a stable prefix: prompt caching works).
    changed = sum(1 for a, b in zip(model.sent, model.sent[1:], strict=False)
                  if b[:len(a)] != a)
    assert changed == len(compacted)
    # The last request sent was that context but for the reply it got, message for message.
    assert model.last is not None and model.last.messages == context.messages[:-1]


CHILD = """
import asyncio, os, pathlib, signal, sys
sys.path[:0] = [sys.argv[4], str(pathlib.Path(sys.argv[4]).parent)]
import test_compaction as tc
from durable_turns import Runtime, SqliteStore, PostgresStore

kind, url, marks, mode = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), sys.argv[5]
store = SqliteStore(url) if kind == "sqlite" else PostgresStore(url, lease_ttl=1.0)

class Counted(tc.Summariser):
    async def stream(self, request):
        with (marks / "summaries").open("a") as f:
            f.write("1\\n")
        if mode == "in-summary":  # inside the compaction step: nothing of it committed
            os.kill(os.getpid(), signal.SIGKILL)
        async for ev in super().stream(request):
            yield ev

class Dying(tc.Windowed):
    async def stream(self, request):
        if mode == "in-model" and request.messages[0].text.startswith(tc.SUMMARY_PREFIX):
            os.kill(os.getpid(), signal.SIGKILL)
        async for ev in super().stream(request):
            yield ev

class Sink:
    def emit(self, event):
        if mode == "after-compact" and event.type == "context.compacted" \\
                and event.to_dict()["summarised"]:
            os.kill(os.getpid(), signal.SIGKILL)

async def main():
    async with Runtime([tc.agent(Counted())], store, Dying(), Sink()) as rt:
        s = rt.session("ops", "long")
        for i in range(40):
            await s.start(f"turn {i}", turn_id=f"t{i}")
            r = await s.result(f"t{i}", timeout=60)
            assert r.status == "completed", r.error

asyncio.run(main())
"""


async def _run(kind: str, url: str, marks: Path, mode: str) -> int:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, kind, url, str(marks),
                             str(Path(__file__).parent), mode])
    return await asyncio.to_thread(proc.wait, WAIT)


async def test_a_replay_never_summarises_again(tmp_path: Path) -> None:
    for kind in ("sqlite", "postgres"):
        if kind == "postgres":
            from conftest import PG_DSN, pg_schema_dsn
            if PG_DSN is None:
                continue
            url = pg_schema_dsn()
        else:
            url = str(tmp_path / "db.sqlite")
        marks = tmp_path / kind
        marks.mkdir()
        assert await _run(kind, url, marks, "after-compact") == -signal.SIGKILL
        once = (marks / "summaries").read_text().count("1")
        assert once == 1
        assert await _run(kind, url, marks, "in-model") == -signal.SIGKILL
        assert (marks / "summaries").read_text().count("1") == once  # reused, not redone
        assert await _run(kind, url, marks, "finish") == 0
        store: SessionStore
        if kind == "sqlite":
            store = SqliteStore(url)
        else:
            from durable_turns import PostgresStore
            store = PostgresStore(url)
        async with Runtime([agent(Summariser())], store, Windowed()) as rt:
            s = rt.session("ops", "long")
            events = await s.events()
            assert len(await s.transcript()) == 160
        summarised = [e for e in events if e.type == "context.compacted"
                      and e.to_dict()["summarised"]]
        assert (marks / "summaries").read_text().count("1") == len(summarised) > 1


# -- the reactive path: the provider refuses a request as over its window ---------------------

WINDOW = 3000
"""The window the fake Anthropic API enforces (JSON length of the body over four)."""


def windowed_api(summaries: list[str]) -> Callable[[dict[str, Any]], Reply | Fail]:
    def answer(body: dict[str, Any]) -> Reply | Fail:
        tokens = len(json.dumps(body)) // 4
        if tokens > WINDOW:  # Anthropic's own refusal, word for word in shape
            return Fail(400, f"prompt is too long: {tokens} tokens > {WINDOW} maximum",
                        error_type="invalid_request_error")
        last = body["messages"][-1]["content"]
        blocks = [{"type": "text", "text": last}] if isinstance(last, str) else last
        text = " ".join(b.get("text", "") for b in blocks)
        if DEFAULT_INSTRUCTIONS in text:
            summaries.append(text)
            return Reply([Text(f"summary {len(summaries)}")])
        if any(b["type"] == "tool_result" for b in blocks):
            return Reply([Text("done")])
        return Reply([ToolUse("fetch", {"n": len(body["messages"])})])

    return answer


async def test_a_refusal_as_too_long_compacts_once_then_goes_on() -> None:
    summaries: list[str] = []
    answer = windowed_api(summaries)
    app = anthropic_app([answer] * 400)
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0)
        agent = Agent("ops", "You run ops.", [fetch], model=model, context=Compaction(
            trigger_tokens=10 ** 9, keep_recent=4))  # only the provider's refusal triggers it
        async with Runtime([agent], MemoryStore()) as rt:
            s = rt.session("ops", "s1")
            for i in range(12):
                done = await asyncio.wait_for(s.turn(f"turn {i}"), WAIT)
                assert done.status == "completed", done.error
            events = await s.events()
        await model.aclose()
    refused = [r for r in app.state.requests if len(json.dumps(r["body"])) // 4 > WINDOW]
    compacted = [e for e in events if e.type == "context.compacted"]
    assert refused and len(compacted) == len(refused)  # each refusal: one compaction
    assert len(summaries) == sum(1 for e in compacted if e.to_dict()["summarised"])


async def test_still_too_long_after_compaction_fails_naming_the_window() -> None:
    summaries: list[str] = []
    app = anthropic_app([windowed_api(summaries)] * 20)
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0)
        agent = Agent("ops", "You run ops. " * 4000, [fetch], model=model,
                      context=Compaction(trigger_tokens=10 ** 9, keep_recent=4))
        async with Runtime([agent], MemoryStore()) as rt:
            done = await asyncio.wait_for(rt.session("ops", "s1").turn("hello"), WAIT)
        await model.aclose()
    assert done.status == "failed" and done.error is not None
    assert "over the model's context window even after compaction" in done.error
    assert "prompt is too long" in done.error and "trigger_tokens=" in done.error


async def test_openai_context_length_exceeded_compacts_too() -> None:
    summaries: list[str] = []

    def answer(body: dict[str, Any]) -> oa.Completion | oa.Fail:
        tokens = len(json.dumps(body)) // 4
        if tokens > WINDOW:  # OpenAI's refusal: its code, its message
            return oa.Fail(400, f"This model's maximum context length is {WINDOW} tokens. "
                           f"However, your messages resulted in {tokens} tokens.",
                           "invalid_request_error", "context_length_exceeded")
        last = body["messages"][-1]
        if last["role"] == "user" and DEFAULT_INSTRUCTIONS in str(last["content"]):
            summaries.append(str(last["content"]))
            return oa.Completion(f"summary {len(summaries)}")
        if last["role"] == "tool":
            return oa.Completion("done")
        return oa.Completion(calls=[oa.Call("fetch", {"n": len(body["messages"])})])

    app = oa.openai_app([answer] * 400)
    async with serving(app) as url:
        model = openai_compatible("gpt-test", api_key="sk-test", base_url=f"{url}/v1",
                                  max_retries=0)
        agent = Agent("ops", "You run ops.", [fetch], model=model,
                      context=Compaction(trigger_tokens=10 ** 9, keep_recent=4))
        async with Runtime([agent], MemoryStore()) as rt:
            s = rt.session("ops", "s1")
            for i in range(12):
                done = await asyncio.wait_for(s.turn(f"turn {i}"), WAIT)
                assert done.status == "completed", done.error
            events = await s.events()
        await model.aclose()
    compacted = [e for e in events if e.type == "context.compacted"]
    assert compacted and summaries
    assert len(summaries) == sum(1 for e in compacted if e.to_dict()["summarised"])


def _store(kind: str, url: str) -> SessionStore:
    if kind == "postgres":
        from durable_turns import PostgresStore
        return PostgresStore(url)
    return SqliteStore(url)


async def test_a_crash_inside_the_compaction_step_replays_it_like_any_step(
        tmp_path: Path) -> None:
    """SIGKILL inside the summary call: nothing of the step committed; the next run makes
    that compaction (its summary once more, and only that one) and goes on."""
    for kind in ("sqlite", "postgres"):
        if kind == "postgres":
            from conftest import PG_DSN, pg_schema_dsn
            if PG_DSN is None:
                continue
            url = pg_schema_dsn()
        else:
            url = str(tmp_path / "db.sqlite")
        marks = tmp_path / kind
        marks.mkdir()
        assert await _run(kind, url, marks, "in-summary") == -signal.SIGKILL
        assert (marks / "summaries").read_text().count("1") == 1
        async with Runtime([agent(Summariser())], _store(kind, url), Windowed()) as rt:
            events = await rt.session("ops", "long").events()
        assert not any(e.type == "context.compacted" and e.to_dict()["summarised"]
                       for e in events)  # the killed step left no trace
        assert await _run(kind, url, marks, "finish") == 0
        async with Runtime([agent(Summariser())], _store(kind, url), Windowed()) as rt:
            s = rt.session("ops", "long")
            events = await s.events()
            assert len(await s.transcript()) == 160
        summarised = [e for e in events if e.type == "context.compacted"
                      and e.to_dict()["summarised"]]
        assert (marks / "summaries").read_text().count("1") == len(summarised) + 1
