"""F21: Replay (issue 30): a recorded session's turns run again with another model, the tools
answered from the recording; each kind of difference, each way an unrecorded call is
answered, and a turn that parked."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from durable_turns import (
    Agent,
    InboundEvent,
    ModelReply,
    Runtime,
    ToolCall,
    ToolContext,
    replay,
    scripted,
    tool,
)
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.stores import SessionStore

WAIT = 30.0
runs: dict[str, int] = {}


@tool
async def lookup(q: str) -> dict[str, Any]:
    """Look something up."""
    runs["lookup"] = runs.get("lookup", 0) + 1
    return {"q": q, "hits": len(q)}


@tool
def note(text: str, ctx: ToolContext) -> str:
    """Write a note (a local tool: in the step's transaction)."""
    runs["note"] = runs.get("note", 0) + 1
    return f"noted {text}"


@tool
async def refund(order: str, ctx: ToolContext) -> str:
    """Refund an order once a person approves."""
    runs["refund"] = runs.get("refund", 0) + 1
    ok = await ctx.request_input("approve", f"Refund {order}?", schema={"type": "boolean"})
    return "refunded" if ok else "kept"


@pytest.fixture(autouse=True)
def _clear() -> None:
    runs.clear()


def model(text: str = "Found it.", q: str = "books", closing: str = "All noted.",
          order: str = "7") -> Any:
    def reply(request: ModelRequest) -> ModelReply:
        opening = next(m.text for m in reversed(request.messages) if m.is_opening)
        n = calls_this_turn(request)
        if opening.startswith("refund"):
            return ModelReply("Asking.", [ToolCall("r1", "refund", {"order": order})]) \
                if n == 0 else ModelReply(f"Refund: {request.messages[-1].result}")
        if n == 0:
            return ModelReply("Looking.", [ToolCall("a", "lookup", {"q": q}),
                                           ToolCall("b", "note", {"text": q})],
                              usage={"output_tokens": 3})
        return ModelReply(text if opening.startswith("find") else closing,
                          usage={"output_tokens": 5})
    return scripted(reply)


AGENT = Agent("ops", "You help.", [lookup, note, refund])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable_turns.cli", *args],
                          capture_output=True, text=True, timeout=120)


async def _recorded(store: SessionStore) -> Runtime:
    rt = Runtime([AGENT], store, model())
    s = rt.session("ops", "s1")
    await s.turn("find books", turn_id="t1")
    await s.turn("note it", turn_id="t2")
    runs.clear()
    return rt


async def test_the_same_model_replays_identically_without_running_a_tool(
        store: SessionStore) -> None:
    rt = await _recorded(store)
    report = await replay(rt.session("ops", "s1"), model=model())
    assert [t.summary for t in report.turns] == ["identical", "identical"]
    assert report.identical and runs == {}  # every result came from the recording
    tools = [m.result for m in await rt.session(report.replay.agent,
                                                report.replay.session).transcript()
             if m.role == "tool"]
    assert tools == [{"q": "books", "hits": 5}, "noted books"] * 2
    assert "2 of 2 turns identical" in report.render()
    await rt.close()


async def test_each_kind_of_difference(store: SessionStore) -> None:
    rt = await _recorded(store)
    s = rt.session("ops", "s1")
    text = await replay(s, model=model(text="Found two."))
    assert [t.summary for t in text.turns] == ["text differs", "identical"]
    assert (text.turns[0].original.text, text.turns[0].replayed.text) == (
        "Found it.", "Found two.")
    calls = await replay(s, model=model(q="films"))
    first = calls.turns[0]
    assert first.summary == "tools differ" and runs == {}
    assert [(a.input, b.input) for a, b in first.calls_changed] == [
        ({"q": "books"}, {"q": "films"}), ({"text": "books"}, {"text": "films"})]
    # Unrecorded calls got an error result the model read; nothing ran.
    replayed = await rt.session("ops", calls.replay.session).transcript()
    errors = [m.result for m in replayed if m.role == "tool" and m.is_error]
    assert len(errors) == 4 and all("UnrecordedCallError" in e["error"] for e in errors)
    assert "~ call lookup" in calls.render()
    await rt.close()


async def test_unrecorded_calls_run_live_or_are_answered(store: SessionStore) -> None:
    rt = await _recorded(store)
    s = rt.session("ops", "s1")
    live = await replay(s, model=model(q="films"), tools="live")
    assert runs == {"lookup": 2, "note": 2}
    assert all(t.summary == "tools differ" for t in live.turns)
    runs.clear()
    asked: list[str] = []

    def answer(name: str, args: dict[str, Any]) -> Any:
        asked.append(name)
        return {"answered": name}

    answered = await replay(s, model=model(q="films"), tools=answer)
    assert runs == {} and asked == ["lookup", "note"] * 2
    tools = [m.result for m in await rt.session("ops", answered.replay.session).transcript()
             if m.role == "tool"]
    assert tools == [{"answered": "lookup"}, {"answered": "note"}] * 2
    await rt.close()


async def test_a_turn_that_parked_is_answered_as_it_was(store: SessionStore) -> None:
    rt = Runtime([AGENT], store, model())
    s = rt.session("ops", "s2")
    alice = InboundEvent("web", {"id": "alice", "attested": True}, "refund 7")
    await s.start(event=alice, turn_id="t1")
    assert (await s.result("t1", timeout=WAIT)).status == "suspended"
    await s.resume("t1", "approve", True, by="alice")
    assert (await s.result("t1", timeout=WAIT)).text == "Refund: refunded"
    runs.clear()
    # Recorded: the tool's result is served, it never runs (so never asks).
    report = await replay(s, model=model())
    assert report.identical and runs == {}
    # A call the recording lacks, run live: the tool parks, and is answered with what alice
    # answered (it runs again after the answer, as any parked tool does).
    live = await replay(s, model=model(order="8"), tools="live")
    (turn,) = live.turns
    assert turn.summary == "tools differ" and runs == {"refund": 2}
    assert turn.replayed.text == "Refund: refunded"
    await rt.close()


APP = '''
from durable_turns import ModelReply, ToolCall, scripted, tool
from durable_turns.models.scripted import calls_this_turn

@tool
async def lookup(q: str) -> dict:
    """Look something up."""
    raise RuntimeError("a replay must not run me")

def _reply(request):
    if calls_this_turn(request) == 0:
        return ModelReply("Looking.", [ToolCall("a", "lookup", {"q": "books"})])
    return ModelReply(ANSWER)

tools = [lookup]
model = scripted(_reply)
'''


def _app(folder: Path, answer: str) -> Path:
    folder.mkdir()
    (folder / "instructions.md").write_text("You find things.")
    (folder / "agent.py").write_text(f"ANSWER = {answer!r}\n" + APP)
    return folder


async def test_the_replay_command_prints_what_differs(tmp_path: Path) -> None:
    from durable_turns import SqliteStore, load_agent

    (tmp_path / "b").mkdir()
    same, other = _app(tmp_path / "ops", "Found it."), _app(tmp_path / "b" / "ops",
                                                            "Found none.")
    db = tmp_path / "db.sqlite"
    agent = load_agent(same)
    recorder = replace(agent, tools=[lookup])  # the recording's tool answers for real
    async with Runtime([recorder], SqliteStore(db)) as rt:
        await rt.session(agent.name, "s1").turn("find books", turn_id="t1")
    runs.clear()
    out = cli("replay", f"{agent.name}/s1", "--app", str(same), "--db", str(db))
    assert out.returncode == 0, out.stderr
    assert "turn t1: identical" in out.stdout and "1 of 1 turns identical" in out.stdout
    out = cli("replay", f"{agent.name}/s1", "--app", str(other), "--db", str(db), "--json")
    assert out.returncode == 1, out.stderr
    (turn,) = json.loads(out.stdout)["turns"]
    assert (turn["summary"], turn["replayed"]["text"]) == ("text differs", "Found none.")
    missing = cli("replay", f"{agent.name}/nobody", "--app", str(same), "--db", str(db))
    assert missing.returncode == 2 and "has no session" in missing.stderr
    assert "Traceback" not in missing.stderr
