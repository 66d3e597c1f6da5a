"""Children for the crash tests of subagents (F13) and parallel tool calls (F15).

Run as a script, it delivers one turn on a SQLite file and, at the point ``--kill`` names,
SIGKILLs its own process::

    python tests/crashkit_nested.py DB subagent --tag crash --kill child-local
    python tests/crashkit_nested.py DB parallel --tag replay

``subagent``: agent ``lead`` calls ``subagent("helper")``; the helper's turn calls a local
tool (``record``: a row in ``rows`` through ``ctx.store.unwrap()``) and then answers.
Kill points: ``child-model`` (at the child's first model call: its turn has opened),
``child-local`` (inside ``record``, after its row is written, before the child's
step commits), ``child-step`` (right after the child's ``record`` step committed).

``parallel``: agent ``ops`` (``parallel_tools=True``) makes one batch of four calls: ``c1``,
``c2``, ``c3`` are remote (``effect``: a line in ``effects.jsonl``), ``c4`` is local
(``record``). Kill point ``batch``: inside ``c1``, after its side effect, once the other
three committed, before ``c1``'s step commits.

Each child appends every event its runtime publishes to ``events-<tag>.jsonl`` and, when it
was not killed, writes how the turn ended to ``report-<tag>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from durable_turns import (
    Agent,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    TurnEvent,
    scripted,
    subagent,
    tool,
)
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn

TURN_ID = "turn-1"
TIMEOUT = 30.0
"""The bound on every wait of a child, and of the test on a child."""
ROWS_DDL = "CREATE TABLE IF NOT EXISTS rows (session TEXT, call_id TEXT, pid INTEGER)"
BATCH = [ToolCall("c1", "effect", {"name": "one"}), ToolCall("c2", "effect", {"name": "two"}),
         ToolCall("c3", "effect", {"name": "three"}), ToolCall("c4", "record", {})]


def die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL was not delivered")


@dataclass(frozen=True)
class Sink:
    emit: Callable[[TurnEvent], None]


def build(scenario: str, work: Path, kill: str) -> tuple[list[Agent], Callable[[TurnEvent],
                                                                            None]]:
    events = (work / "events.jsonl").open("a", buffering=1)
    committed: dict[str, asyncio.Event] = {c.id: asyncio.Event() for c in BATCH}

    def seen(e: TurnEvent) -> None:
        call = getattr(e, "call", None)
        events.write(json.dumps({"session": e.session, "pid": os.getpid(),
                                 **e.to_dict()}) + "\n")
        if e.type == "action.completed" and call is not None:
            if call.id in committed:
                committed[call.id].set()
            if kill == "child-step" and e.agent == "helper" and call.name == "record":
                die()

    @tool
    def record(ctx: ToolContext) -> str:
        """Write a row."""
        ctx.store.unwrap().execute("INSERT INTO rows VALUES (?, ?, ?)",
                                   (ctx.session, ctx.call_id, os.getpid()))
        if kill == "child-local":
            die()  # the row is written; the step's transaction has not committed
        return "recorded"

    @tool
    async def effect(name: str, ctx: ToolContext) -> str:
        """A remote side effect."""
        with (work / "effects.jsonl").open("a") as f:
            f.write(json.dumps({"call": ctx.call_id, "pid": os.getpid()}) + "\n")
        if ctx.call_id == "c1" and kill == "batch":
            for c in ("c2", "c3", "c4"):
                await asyncio.wait_for(committed[c].wait(), TIMEOUT)
            die()  # the effect happened; c1's step has not committed
        return f"did {name}"

    if scenario == "subagent":
        def lead_reply(request: ModelRequest) -> ModelReply:
            if calls_this_turn(request) == 0:
                return ModelReply("", [ToolCall("s1", "helper", {"task": "Record it."})])
            return ModelReply(f"Helper: {request.messages[-1].result}")

        lead = Agent("lead", "", [subagent("helper", description="Records things.")],
                     model=scripted(lead_reply))
        def helper_reply(request: ModelRequest) -> ModelReply:
            if calls_this_turn(request) == 0:
                if kill == "child-model":
                    die()  # the child's turn has opened; nothing of it ran
                return ModelReply("", [ToolCall("h1", "record", {})])
            return ModelReply("Recorded once.")

        helper = Agent("helper", "", [record], model=scripted(helper_reply))
        return [lead, helper], seen
    agent = Agent("ops", "", [effect, record], parallel_tools=True,
                  model=scripted([ModelReply("All four.", BATCH), ModelReply("Done.")]))
    return [agent], seen


async def child(db: Path, scenario: str, tag: str, kill: str) -> None:
    agents, seen = build(scenario, db.parent, kill)
    rt = Runtime(agents, SqliteStore(db), sink=Sink(seen))
    async with rt:
        rt.store.unwrap().execute(ROWS_DDL)
        s = rt.session(agents[0].name, "s1")
        await s.start("Go.", turn_id=TURN_ID)
        r = await s.result(TURN_ID, timeout=TIMEOUT)
        await rt.idle()
        report: dict[str, Any] = {"status": r.status, "text": r.text, "error": r.error}
    (db.parent / f"report-{tag}.json").write_text(json.dumps(report))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("db", type=Path)
    p.add_argument("scenario", choices=["subagent", "parallel"])
    p.add_argument("--tag", required=True)
    p.add_argument("--kill", default="")
    a = p.parse_args()
    asyncio.run(asyncio.wait_for(child(a.db, a.scenario, a.tag, a.kill), TIMEOUT))


def run(db: Path, scenario: str, tag: str, kill: str = "") -> subprocess.CompletedProcess[str]:
    """Run one child to its end (or its SIGKILL)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), str(db), scenario, "--tag", tag]
    if kill:
        cmd += ["--kill", kill]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT * 2,
                          check=False)


if __name__ == "__main__":
    main()
