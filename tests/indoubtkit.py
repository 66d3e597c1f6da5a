"""A child process for the in-doubt tests (F26): real processes, real SIGKILL.

Run as a script, it drives turn ``t1`` of session ``pay/s1`` on a SQLite file (or PostgreSQL,
``--pg DSN``) and kills itself with SIGKILL where ``--kill`` says::

    python tests/indoubtkit.py WORK --tag a --tools ask --kill effect:c1   # start, die
    python tests/indoubtkit.py WORK --tag b --tools ask --recover          # recover, report
    python tests/indoubtkit.py WORK --tag c --tools ask --answer no        # answer, report

The agent's remote tools append a line (call id, idempotency key, pid) to ``ledger.jsonl``
in WORK, the remote side's record of its effects. ``--tools`` names each call's tool, one per
call of the script (``ask``, ``rerun`` or ``reconcile``: ``charge_ask`` declares
``in_doubt="ask"``, ``charge_rerun`` the default, ``charge_reconcile`` a reconcile function
that looks the key up in the ledger). ``--parallel`` asks for all calls in one reply
(``Agent(parallel_tools=True)``); otherwise one reply a call.

Kill points (``--kill``):

- ``asked:<call>``: in the sink, when the reply that asks for the call is published (its
  step committed; the call's intent not written): before the intent;
- ``intent:<call>``: inside the tool, before its effect (its intent committed);
- ``effect:<call>``: inside the tool, after its effect, before its result commits;
- ``done:<call>``: in the sink, when the call's ``action.completed`` is published (its result
  committed): after the call, before the next step.

``report-<tag>.json``: the turn's status, text and the request it parked on, if it did.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

from durable_turns import (
    Agent,
    ModelReply,
    Reconciled,
    Runtime,
    SqliteStore,
    Tool,
    ToolCall,
    ToolContext,
    TurnEvent,
    scripted,
    tool,
)
from durable_turns.stores import SessionStore

AGENT, SESSION, TURN_ID = "pay", "s1", "t1"
CHILD_TIMEOUT = 30.0
"""The bound on every wait of a child, and of the test on a child."""


def die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL was not delivered")


def ledger(work: Path) -> list[dict[str, Any]]:
    """The remote side's effects, in order."""
    path = work / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def calls_of(modes: list[str]) -> list[ToolCall]:
    return [ToolCall(f"c{i + 1}", f"charge_{m}", {"cents": 100 * (i + 1)})
            for i, m in enumerate(modes)]


def script(modes: list[str], parallel: bool) -> list[ModelReply]:
    calls = calls_of(modes)
    replies = ([ModelReply("Charging all at once.", calls)] if parallel else
               [ModelReply(f"Charging {c.id}.", [c]) for c in calls])
    return [*replies, ModelReply("All charged.")]


def build_tools(work: Path, kill: tuple[str, str]) -> list[Tool]:
    def effect(cents: int, ctx: ToolContext) -> dict[str, Any]:
        if kill == ("intent", ctx.call_id):
            die()  # the intent committed; nothing happened remotely
        line = {"call": ctx.call_id, "key": ctx.idempotency_key, "pid": os.getpid()}
        with (work / "ledger.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")
        if kill == ("effect", ctx.call_id):
            die()  # the remote side charged; the result is not committed
        return {"charged": cents, "call": ctx.call_id}

    async def reconcile(args: dict[str, Any], ctx: ToolContext) -> Reconciled:
        if any(e["key"] == ctx.idempotency_key for e in ledger(work)):
            return Reconciled.ran({"charged": args["cents"], "call": ctx.call_id,
                                   "reconciled": True})
        return Reconciled.not_run()

    @tool(in_doubt="ask")
    async def charge_ask(cents: int, ctx: ToolContext) -> dict[str, Any]:
        """Charge the card (asks a person when in doubt)."""
        return effect(cents, ctx)

    @tool
    async def charge_rerun(cents: int, ctx: ToolContext) -> dict[str, Any]:
        """Charge the card (run again when in doubt)."""
        return effect(cents, ctx)

    @tool(in_doubt=reconcile)
    async def charge_reconcile(cents: int, ctx: ToolContext) -> dict[str, Any]:
        """Charge the card (reconciled with the ledger when in doubt)."""
        return effect(cents, ctx)

    return [charge_ask, charge_rerun, charge_reconcile]


class Sink:
    def __init__(self, kill: tuple[str, str]) -> None:
        self.kill = kill

    def emit(self, event: TurnEvent) -> None:
        calls = getattr(event, "tool_calls", ())
        if self.kill[0] == "asked" and any(c.id == self.kill[1] for c in calls):
            die()  # the reply committed; its calls' intents are not written
        call = getattr(event, "call", None)
        if self.kill[0] == "done" and event.type == "action.completed" \
                and call is not None and call.id == self.kill[1]:
            die()  # the call's result committed: nothing of it is in doubt


def make_store(work: Path, pg: str | None) -> SessionStore:
    if pg:
        from durable_turns import PostgresStore

        return PostgresStore(pg, lease_ttl=1.0)
    return SqliteStore(work / "store.sqlite")


async def child(a: argparse.Namespace) -> None:
    work: Path = a.work
    kind, _, at = (a.kill or "").partition(":")
    kill = (kind, at)
    modes = a.tools.split(",")
    agent = Agent(AGENT, "You take payments.", build_tools(work, kill),
                  parallel_tools=a.parallel)
    rt = Runtime([agent], make_store(work, a.pg), scripted(script(modes, a.parallel)),
                 sink=Sink(kill))
    async with rt:
        session = rt.session(AGENT, SESSION)
        if a.recover:
            await rt.recover()
        elif a.answer is not None:
            pending = await session.pending()
            assert pending is not None, "no request to answer"
            await session.resume(TURN_ID, pending.id, a.answer == "yes")
        else:
            await session.start("Charge them.", turn_id=TURN_ID)
        res = await session.result(TURN_ID, timeout=CHILD_TIMEOUT)
        await rt.idle()
        report = {"status": str(res.status), "text": res.text, "error": res.error,
                  "request": res.request.to_dict() if res.request else None}
    (work / f"report-{a.tag}.json").write_text(json.dumps(report))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("work", type=Path)
    p.add_argument("--tag", required=True)
    p.add_argument("--tools", required=True)
    p.add_argument("--kill", default=None)
    p.add_argument("--recover", action="store_true")
    p.add_argument("--answer", choices=("yes", "no"), default=None)
    p.add_argument("--parallel", action="store_true")
    p.add_argument("--pg", default=None)
    a = p.parse_args()
    asyncio.run(asyncio.wait_for(child(a), timeout=CHILD_TIMEOUT))


# -- the test side ----------------------------------------------------------------------------


def run(work: Path, tag: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), str(work), "--tag", tag, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT * 2,
                          check=False)


def crash(work: Path, tag: str, kill: str, *args: str) -> None:
    """Run a child that must die by SIGKILL at ``kill``."""
    proc = run(work, tag, "--kill", kill, *args)
    if proc.returncode != -signal.SIGKILL:
        raise AssertionError(f"child {tag!r} was not killed at {kill} "
                             f"(exit {proc.returncode}):\n{proc.stderr}")


def deliver(work: Path, tag: str, *args: str) -> dict[str, Any]:
    """Run a child that must finish cleanly; its report."""
    proc = run(work, tag, *args)
    if proc.returncode != 0:
        raise AssertionError(f"child {tag!r} failed (exit {proc.returncode}):\n{proc.stderr}")
    data: dict[str, Any] = json.loads((work / f"report-{tag}.json").read_text())
    return data


if __name__ == "__main__":
    main()
