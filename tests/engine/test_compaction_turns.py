"""F23 long sessions, the harder cases: one long turn outgrowing the window mid-turn (on the
fake Anthropic API, which refuses a ``tool_use`` without its ``tool_result`` as the real one
does), a head too big for one summary request (summarised in parts; one message too big by
itself cut down; a summary model that refuses as over its own window), forks of a
compacted session (each sees the context of its own checkpoint), and a compaction another
runtime committed while this one kept the session's log (found, sent, not made again).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
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
    replay,
    tool,
)
from durable_turns.compaction import (
    DEFAULT_INSTRUCTIONS,
    SUMMARY_PREFIX,
    CompactionMemo,
    request_view,
)
from durable_turns.errors import ModelError
from durable_turns.model import ModelEvent, ModelRequest
from durable_turns.models.anthropic_messages import anthropic, to_messages
from durable_turns.stores import SessionStore
from fakes.anthropic_api import Fail, Reply, Text, ToolUse, anthropic_app, check_request
from fakes.serving import serving
from test_compaction import LIMIT, Summariser, Windowed, check_pairs, fetch, size_of

WAIT = 60.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""


# -- one long turn ---------------------------------------------------------------------------

WINDOW = 3000
"""The window the fake Anthropic API enforces (JSON length of the body over four)."""
CALLS = 120
"""The long turn's tool calls: about twice the window even with every result cleared."""


@tool
async def probe(n: int) -> str:
    """Probe one host."""
    return f"host {n}: " + "ok " * 300


async def test_one_long_turn_is_compacted_mid_turn_without_cutting_a_call_from_its_result(
        ) -> None:
    summaries: list[dict[str, Any]] = []
    made = [0]

    def answer(body: dict[str, Any]) -> Reply | Fail:
        tokens = len(json.dumps(body)) // 4
        if tokens > WINDOW:
            return Fail(400, f"prompt is too long: {tokens} tokens > {WINDOW} maximum",
                        error_type="invalid_request_error")
        last = body["messages"][-1]["content"]
        blocks = [{"type": "text", "text": last}] if isinstance(last, str) else last
        if any(DEFAULT_INSTRUCTIONS in b.get("text", "") for b in blocks):
            summaries.append(body)
            return Reply([Text(f"summary {len(summaries)}: probed up to host {made[0]}")],
                         input_tokens=tokens)
        if any(b["type"] == "text" and b["text"] == "warm up" for b in blocks):
            return Reply([Text("ready")], input_tokens=tokens)
        if made[0] == CALLS:
            return Reply([Text("all hosts probed")], input_tokens=tokens)
        made[0] += 1
        return Reply([ToolUse("probe", {"n": made[0]})], input_tokens=tokens)

    app = anthropic_app([answer] * (3 * CALLS))
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0)
        agent = Agent("ops", "You probe hosts.", [probe], model=model, context=Compaction(
            trigger_tokens=2000, keep_recent=6, model=model))
        async with Runtime([agent], MemoryStore()) as rt:
            s = rt.session("ops", "s1")
            assert (await asyncio.wait_for(s.turn("warm up"), WAIT)).status == "completed"
            done = await asyncio.wait_for(s.turn("probe every host"), WAIT)
            transcript = await s.transcript()
            events = await s.events()
        await model.aclose()
    assert done.status == "completed", done.error
    assert done.text == "all hosts probed" and made[0] == CALLS
    assert len(transcript) == 2 + 1 + 2 * CALLS + 1  # every message stays in the store
    every_result_cleared = request_view(transcript, CompactionMemo(0, len(transcript), None,
                                                                   0, 0))
    assert len(json.dumps(to_messages(every_result_cleared))) // 4 > 2 * WINDOW
    # No request was refused: none over the window, none with a tool_use cut from its result.
    bodies = [r["body"] for r in app.state.requests]
    assert all(len(json.dumps(b)) // 4 <= WINDOW for b in bodies)
    assert all(check_request(b, {}, set()) is None for b in bodies)
    turn = done.turn_id
    compacted = [e for e in events if e.type == "context.compacted" and e.turn_id == turn]
    inside = [e for e in compacted if e.to_dict()["summarised"]
              and transcript[e.to_dict()["covered"]].role == "assistant"]
    assert inside, "the long turn was never summarised inside itself"
    assert len(summaries) == sum(e.to_dict()["summary_calls"] for e in events
                                 if e.type == "context.compacted")


# -- a head too big for one summary request ---------------------------------------------------

TRIGGER = 3000


@tool
async def dump() -> str:
    """A very large log."""
    return "log line\n" * 6000  # about 13,500 tokens: over the trigger by itself


class Bounded(Summariser):
    """A summary model with a window of its own: a request over ``window`` (measured here)
    is refused as Anthropic refuses it; records what it was sent."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = window
        self.sizes: list[int] = []
        self.refused = 0
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        size = size_of(request)
        if size > self.window:
            self.refused += 1
            raise ModelError(f"anthropic: HTTP 400 invalid_request_error: prompt is too long: "
                             f"{size} tokens > {self.window} maximum", provider="anthropic",
                             status=400, context_overflow=True)
        self.sizes.append(size)
        self.requests.append(request)
        async for ev in super().stream(request):
            yield ev


class Reader:
    """Asks for ``fetch`` once a turn (``dump`` in the first), then answers; records each
    request's size (measured here): no window of its own."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        size = size_of(request)
        self.sizes.append(size)
        check_pairs(request)
        last = request.messages[-1]
        if last.role == "user":
            name, args = ("dump", {}) if last.text == "dump the log" else ("fetch", {"n": 1})
            yield ToolCall(f"c{len(self.sizes)}", name, args)
            yield Stop("tool_use", {"input_tokens": size, "output_tokens": 10})
        else:
            yield TextDelta("done")
            yield Stop("end_turn", {"input_tokens": size, "output_tokens": 2})


async def _long_history(store: SessionStore, turns: int) -> None:
    """A session that grew without compaction (the agent had none then)."""
    async with Runtime([Agent("ops", "You run ops.", [fetch, dump])], store,
                       Reader()) as rt:
        s = rt.session("ops", "long")
        assert (await s.turn("dump the log")).status == "completed"
        for i in range(turns):
            assert (await s.turn(f"turn {i}")).status == "completed"


async def test_a_head_too_big_for_one_summary_request_is_summarised_in_parts(
        store: SessionStore) -> None:
    await _long_history(store, 30)  # about 35,000 tokens: ten times the trigger
    summariser = Bounded(window=int(TRIGGER * 1.5))
    model = Reader()
    agent = Agent("ops", "You run ops.", [fetch, dump], context=Compaction(
        trigger_tokens=TRIGGER, keep_recent=4, clear_tool_results=False, model=summariser))
    async with Runtime([agent], store, model) as rt:
        s = rt.session("ops", "long")
        done = await s.turn("and now?")
        events = await s.events()
        context = await s.context()
    assert done.status == "completed", done.error
    assert max(model.sizes[-2:]) <= LIMIT  # the turn's requests fit, once compacted
    (compacted,) = [e.to_dict() for e in events if e.type == "context.compacted"]
    assert compacted["summarised"] and compacted["summary_calls"] == summariser.calls > 3
    assert summariser.refused == 0 and max(summariser.sizes) <= summariser.window
    for request in summariser.requests:
        check_pairs(request)
    # Each part's summary is the next part's prefix; the last is what later requests send.
    for i, request in enumerate(summariser.requests[1:], start=1):
        assert request.messages[0].text.startswith(SUMMARY_PREFIX + f"summary {i} ")
    assert context.messages[0].text == SUMMARY_PREFIX + compacted["summary"]
    assert compacted["summary"].startswith(f"summary {summariser.calls} ")
    # The log too big by itself was cut down in its summary request, never in the store.
    cut = [m for r in summariser.requests for m in r.messages
           if m.role == "tool" and "characters cut]" in str(m.result)]
    assert len(cut) == 1 and cut[0].call_id == "c1"


async def test_a_summary_request_refused_as_too_long_is_made_again_in_smaller_parts(
        ) -> None:
    store = MemoryStore()
    await _long_history(store, 6)  # the log alone is over the summary model's window
    summariser = Bounded(window=TRIGGER // 2)
    agent = Agent("ops", "You run ops.", [fetch, dump], context=Compaction(
        trigger_tokens=TRIGGER, keep_recent=4, clear_tool_results=False, model=summariser))
    async with Runtime([agent], store, Reader()) as rt:
        s = rt.session("ops", "long")
        done = await s.turn("and now?")
        events = await s.events()
    assert done.status == "completed", done.error
    assert summariser.refused >= 1  # the first try, at the trigger's size, was refused
    assert summariser.sizes and max(summariser.sizes) <= summariser.window
    summarised = [e.to_dict() for e in events if e.type == "context.compacted"
                  and e.to_dict()["summarised"]]
    assert summarised and summarised[-1]["summary_calls"] >= 2


# -- forks of a compacted session -------------------------------------------------------------


async def test_a_fork_sees_the_context_of_its_checkpoint(store: SessionStore) -> None:
    summariser = Summariser()
    agent = Agent("ops", "You run ops.", [fetch], context=Compaction(
        trigger_tokens=3000, keep_recent=6, model=summariser))
    async with Runtime([agent], store, Windowed()) as rt:
        s = rt.session("ops", "long")
        for i in range(40):
            assert (await s.turn(f"turn {i}")).status == "completed"
        history = await s.history()
        events = await s.events()
        compactions = [cp for cp in history if any(st.kind == "compact" for st in cp.steps)]
        summarised = [e.to_dict() for e in events if e.type == "context.compacted"
                      and e.to_dict()["summarised"]]
        assert len(summarised) >= 2
        first = next(cp for cp in compactions if any(
            e.type == "context.compacted" and e.to_dict()["summarised"] for e in cp.events))

        # At the last checkpoint: the same context as the source's.
        latest = await s.fork("at-end")
        assert (await latest.context()).messages == (await s.context()).messages

        # Right after the first summarising compaction (its turn under way there, and on in
        # the fork): it goes on from that summary, never making it again.
        calls = summariser.calls
        mid = await s.fork("at-first", history[history.index(first)])
        assert first.turn_id is not None
        done = await mid.result(first.turn_id, timeout=WAIT)
        assert done.status == "completed" and summariser.calls == calls
        context = (await mid.context()).messages
        assert context[0].text == SUMMARY_PREFIX + summarised[0]["summary"]
        assert context[1:] == (await mid.transcript())[summarised[0]["covered"]:]

        # At a turn's end before any compaction: the whole transcript, and the fork compacts
        # on its own as it grows.
        before = [cp for cp in history[:history.index(compactions[0])]
                  if any(e.type == "turn.completed" for e in cp.events)][-1]
        early = await s.fork("before", before)
        assert (await early.context()).messages == await early.transcript()
        calls = summariser.calls
        for i in range(12):
            assert (await early.turn(f"fork turn {i}")).status == "completed"
        own = [e for e in await early.events() if e.type == "context.compacted"]
        assert own and summariser.calls > calls
        assert (await early.context()).messages[0].text.startswith(SUMMARY_PREFIX)
        assert len(await s.transcript()) == 160  # the source is untouched
        assert [e.to_dict() for e in await s.events()
                if e.type == "context.compacted" and e.to_dict()["summarised"]] == summarised


# -- a compaction another runtime committed ---------------------------------------------------


class Refusing(Windowed):
    """:class:`Windowed`, but fails (for good) the first request that sends a summary: the
    compaction before it has committed, the model step never will."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if request.messages[0].text.startswith(SUMMARY_PREFIX):
            raise ModelError("provider: HTTP 401 authentication_error: bad key",
                             provider="provider", status=401)
        async for ev in super().stream(request):
            yield ev


async def test_a_compaction_another_runtime_committed_is_the_one_sent(tmp_path: Path) -> None:
    """A runtime keeps a session's newest compaction between its leases; one that another
    runtime (another process) committed meanwhile is found and sent, never made again."""
    summariser = Summariser()

    def agent() -> Agent:
        return Agent("ops", "You run ops.", [fetch], model_retries=0, context=Compaction(
            trigger_tokens=3000, keep_recent=6, model=summariser))

    db = str(tmp_path / "db.sqlite")
    mine, theirs = Windowed(), Refusing()
    async with Runtime([agent()], SqliteStore(db), mine) as here:
        s = here.session("ops", "long")
        turn = 0
        while not any(e.type == "context.compacted" for e in await s.events()):
            assert (await s.turn(f"turn {turn}")).status == "completed"
            turn += 1
        async with Runtime([agent()], SqliteStore(db), theirs) as there:
            while summariser.calls == 0:
                failed = await there.session("ops", "long").turn(f"turn {turn}")
                turn += 1
            assert failed.status == "failed"  # it summarised, then its model step failed
        sent = len(mine.sizes)
        last = await s.turn("and here?")
        assert last.status == "completed", last.error
        events = await s.events()
    summarised = [e.to_dict() for e in events if e.type == "context.compacted"
                  and e.to_dict()["summarised"]]
    assert summariser.calls == len(summarised) == 1
    assert mine.first[sent] == SUMMARY_PREFIX + summarised[0]["summary"]


async def test_a_replay_of_a_compacted_session_compacts_as_it_goes() -> None:
    """A replay runs the recorded turns again in a new session (a fork before the first
    turn): it compacts on its own, every request under the window, and comes out the same."""
    summariser = Summariser()
    agent = Agent("ops", "You run ops.", [fetch], context=Compaction(
        trigger_tokens=3000, keep_recent=6, model=summariser))
    async with Runtime([agent], MemoryStore(), Windowed()) as rt:
        s = rt.session("ops", "long")
        for i in range(30):
            assert (await s.turn(f"turn {i}")).status == "completed"
        made = summariser.calls
        again = Windowed()  # the window is checked on every request of the replay too
        report = await replay(s, model=again)
        replayed = rt.session("ops", report.replay.session)
        events = await replayed.events()
        assert len(await replayed.transcript()) == len(await s.transcript())
    assert report.identical, report.render()
    assert max(again.sizes) <= LIMIT and len(again.sizes) == 60
    summarised = [e for e in events if e.type == "context.compacted"
                  and e.to_dict()["summarised"]]
    assert summarised and summariser.calls == made + len(summarised)
