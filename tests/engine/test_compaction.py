"""F23 long sessions: a compaction step keeps every model request under the window.

A 200-turn session whose every turn fetches a large tool result runs to its end with each
request (measured here, independently of the engine's estimate) under the limit; the summary
model is called once per summarising compaction and never again on replay (SIGKILL right
after a compaction step committed, then inside the next model step); no request holds a
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
from collections.abc import AsyncIterator
from pathlib import Path

from durable_turns import Agent, Compaction, Runtime, SqliteStore, Stop, TextDelta, ToolCall, tool
from durable_turns.compaction import SUMMARY_PREFIX
from durable_turns.model import ModelEvent, ModelRequest
from durable_turns.stores import SessionStore

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
    without its call."""
    msgs = request.messages
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

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        size = size_of(request)
        self.sizes.append(size)
        assert size <= LIMIT, f"a request of {size} tokens, over the window of {LIMIT}"
        check_pairs(request)
        last = request.messages[-1]
        if last.role == "user":
            yield ToolCall(f"c{len(self.sizes)}", "fetch", {"n": len(self.sizes)})
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


CHILD = """
import asyncio, os, pathlib, signal, sys
sys.path.insert(0, sys.argv[4])
import test_compaction as tc
from durable_turns import Runtime, SqliteStore, PostgresStore

kind, url, marks, mode = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), sys.argv[5]
store = SqliteStore(url) if kind == "sqlite" else PostgresStore(url, lease_ttl=1.0)

class Counted(tc.Summariser):
    async def stream(self, request):
        with (marks / "summaries").open("a") as f:
            f.write("1\\n")
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
