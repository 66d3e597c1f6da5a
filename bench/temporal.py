"""Turns on Temporal: our runner beside Pydantic AI's and the OpenAI Agents SDK's, one server.

Usage (from the repository root, with the package installed with its ``dev`` extra)::

    python bench/temporal.py            # the full run (about a minute)
    python bench/temporal.py --quick    # fewer turns, for a smoke check
    python bench/temporal.py --json     # the same figures, machine-readable

One Temporal dev server (``temporal server start-dev``, in memory, with
``history.transferProcessorMaxPollRPS=1000``) serves every runner in the same run, one after
the other. The workload is the same for each: a fake model that asks for ``add`` ten times,
one call per reply, then answers — 11 model calls and 10 tool calls, 21 activities a run.

- **durable_turns**: a runtime on a SQLite file, its Temporal worker in this process; ``add``
  is a *local* tool (a plain ``def`` that writes a row through ``ctx.store.unwrap()`` inside
  the step's transaction: exactly once). A turn's opening goes with its first model call, so
  its 21 steps are 21 activities.
- **Pydantic AI** (``TemporalDurability``, ``FunctionModel``): each model request and each
  tool call is an activity, in its sandboxed workflow.
- **OpenAI Agents SDK** (``temporalio-openai-agents``, its test model): each model call is an
  activity, the tool an activity (``activity_as_tool``).

The rivals run only when their packages are installed (``pip install pydantic-ai-slim
openai-agents temporalio-openai-agents``); each is skipped with a note otherwise.

Figures per activity: wall time (a run's time over its 21 activities), the CPU of this
process (the worker, and the client starting and awaiting the run) and of the server's
process. Then recovery: a worker SIGKILLed inside a tool, a standby worker running; the time
from the kill to the turn's end, with the worker's default heartbeat timeout (2 s) and 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from durable_turns import (
    Agent,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.models.scripted import calls_this_turn
from durable_turns.temporal import TemporalScheduler, WorkerSettings, temporal_worker
from durable_turns.temporal.devserver import DevServer

CALLS = 10
ACTIVITIES = 2 * CALLS + 1
WAIT = 60.0


def server_cpu(pid: int) -> float:
    """Seconds of CPU the server's process used so far (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(name: str, server: DevServer, turns: int,
                  run: Callable[[int], Awaitable[None]]) -> dict[str, Any]:
    """Run ``run(i)`` for one warm-up and ``turns`` measured runs; the figures per activity."""
    assert server.proc is not None
    await run(-1)  # warm-up: imports, the first workflow task, the sticky queue
    wall, cpu, srv = time.perf_counter(), time.process_time(), server_cpu(server.proc.pid)
    for i in range(turns):
        await run(i)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    srv = server_cpu(server.proc.pid) - srv
    n = turns * ACTIVITIES
    return {"runner": name, "activities": n, "ms_per_activity": 1000 * wall / n,
            "worker_cpu_ms": 1000 * cpu / n, "server_cpu_ms": 1000 * srv / n}


# -- durable_turns ------------------------------------------------------------------------------


def ours_agent() -> tuple[Agent, Any]:
    @tool
    def add(a: int, b: int, ctx: ToolContext) -> int:
        """Add two numbers (and record it, in the step's transaction)."""
        ctx.store.unwrap().execute("INSERT INTO adds (call_id, total) VALUES (?, ?)",
                                   (ctx.call_id, a + b))
        return a + b

    script = [ModelReply("adding", [ToolCall(f"c{i}", "add", {"a": i, "b": 1})])
              for i in range(CALLS)] + [ModelReply("done")]
    return Agent("bench", "You add.", [add]), scripted(lambda r: script[calls_this_turn(r)])


async def bench_ours(server: DevServer, turns: int, work: Path) -> dict[str, Any]:
    from temporalio.client import Client

    client = await Client.connect(server.target)
    q = f"ours-{uuid.uuid4().hex[:8]}"
    agent, model = ours_agent()
    rt = Runtime([agent], SqliteStore(work / "ours.db"), model,
                 scheduler=TemporalScheduler(client, q))
    async with rt:
        rt.store.unwrap().execute("CREATE TABLE adds (call_id TEXT, total INTEGER)")
        async with temporal_worker(rt, client, WorkerSettings(task_queue=q)):
            async def run(i: int) -> None:
                session = rt.session("bench", f"s{i}")
                await session.start("add them", turn_id="t")
                res = await session.result("t", timeout=WAIT)
                assert res.text == "done", res

            out = await measure("durable_turns (local tool, exactly once)", server, turns, run)
        rows = rt.store.unwrap().execute("SELECT count(*) FROM adds").fetchone()[0]
    assert rows == (turns + 1) * CALLS, rows  # each call's row once
    return out


# -- the rivals ----------------------------------------------------------------------------------


async def bench_pydantic(server: DevServer, turns: int) -> dict[str, Any]:
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
    from temporal_pydantic import PydanticWorkflow
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(server.target, plugins=[PydanticAIPlugin()])
    q = f"pydantic-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=q, workflows=[PydanticWorkflow]):
        async def run(i: int) -> None:
            out = await client.execute_workflow(PydanticWorkflow.run, "add them",
                                                id=f"{q}-{i}", task_queue=q)
            assert out == "done", out

        return await measure("Pydantic AI TemporalDurability", server, turns, run)


async def bench_openai(server: DevServer, turns: int) -> dict[str, Any]:
    from agents import set_tracing_disabled
    from temporal_openai import OpenAIWorkflow, add_activity, openai_model
    from temporalio.client import Client
    from temporalio.openai_agents import OpenAIAgentsPlugin
    from temporalio.openai_agents.testing import TestModelProvider
    from temporalio.worker import Worker

    set_tracing_disabled(True)  # it would export traces to OpenAI's servers
    plugin = OpenAIAgentsPlugin(model_provider=TestModelProvider(openai_model()))
    client = await Client.connect(server.target, plugins=[plugin])
    q = f"openai-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=q, workflows=[OpenAIWorkflow],
                      activities=[add_activity]):
        async def run(i: int) -> None:
            out = await client.execute_workflow(OpenAIWorkflow.run, "add them",
                                                id=f"{q}-{i}", task_queue=q)
            assert out == "done", out

        return await measure("OpenAI Agents SDK + Temporal plugin", server, turns, run)


# -- recovery ------------------------------------------------------------------------------------


def hold_agent(work: Path) -> tuple[Agent, Any]:
    @tool
    async def hold(x: int) -> str:
        """Hold until released."""
        (work / f"held-{os.getpid()}").touch()
        deadline = time.monotonic() + WAIT
        while not (work / "release").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("never released")
            await asyncio.sleep(0.005)  # a poll of a file the bench writes, bounded
        return "held"

    script = [ModelReply("holding", [ToolCall("c1", "hold", {"x": 1})]), ModelReply("done")]
    return Agent("hold", "You hold.", [hold]), scripted(lambda r: script[calls_this_turn(r)])


async def child(target: str, q: str, work: Path, heartbeat: float) -> None:
    """A worker that dies inside ``hold`` (the bench kills it)."""
    from temporalio.client import Client

    client = await Client.connect(target)
    agent, model = hold_agent(work)
    rt = Runtime([agent], SqliteStore(work / "hold.db"), model,
                 scheduler=TemporalScheduler(client, q, heartbeat=heartbeat))
    settings = WorkerSettings(task_queue=q, heartbeat=heartbeat)
    async with rt, temporal_worker(rt, client, settings):
        (work / "child-ready").touch()
        await asyncio.sleep(WAIT)  # killed long before


async def wait_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name}")
        await asyncio.sleep(0.005)  # a poll of a file a child writes, bounded


async def bench_recovery(server: DevServer, heartbeat: float) -> dict[str, Any]:
    from temporalio.client import Client

    work = Path(tempfile.mkdtemp(prefix="dt-recovery-"))
    q = f"rec-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, __file__, "--child", server.target, q, str(work),
                             str(heartbeat)], stdin=subprocess.DEVNULL)
    try:
        await wait_file(work / "child-ready")
        client = await Client.connect(server.target)
        agent, model = hold_agent(work)
        rt = Runtime([agent], SqliteStore(work / "hold.db"), model,
                     scheduler=TemporalScheduler(client, q, heartbeat=heartbeat))
        async with rt:
            session = rt.session("hold", "s1")
            await session.start("hold", turn_id="t")
            await wait_file(work / f"held-{proc.pid}")
            settings = WorkerSettings(task_queue=q, heartbeat=heartbeat)
            async with temporal_worker(rt, client, settings):
                killed = time.perf_counter()
                proc.send_signal(signal.SIGKILL)
                (work / "release").touch()
                res = await session.result("t", timeout=WAIT)
                took = time.perf_counter() - killed
        assert res.text == "done", res
    finally:
        proc.kill()
        proc.wait()
    return {"heartbeat_s": heartbeat, "recovery_s": took}


# -- the run -------------------------------------------------------------------------------------


async def main(turns: int) -> dict[str, Any]:
    server = DevServer()
    await server.start()
    work = Path(tempfile.mkdtemp(prefix="dt-temporal-bench-"))
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        results.append(await bench_ours(server, turns, work))
        for name, rival in (("pydantic", bench_pydantic), ("openai", bench_openai)):
            try:
                results.append(await rival(server, turns))
            except ImportError as e:
                notes.append(f"{name}: skipped ({e})")
        recovery = [await bench_recovery(server, hb) for hb in (2.0, 1.0)]
    finally:
        server.stop()
    return {"runs": turns, "activities_per_run": ACTIVITIES, "results": results,
            "recovery": recovery, "notes": notes}


def report(out: dict[str, Any]) -> None:
    print(f"{out['runs']} runs of {out['activities_per_run']} activities each (10 tool calls), "
          "one dev server")
    print(f"{'runner':44} {'ms/activity':>12} {'worker CPU ms':>14} {'server CPU ms':>14}")
    for r in out["results"]:
        print(f"{r['runner']:44} {r['ms_per_activity']:12.1f} {r['worker_cpu_ms']:14.1f} "
              f"{r['server_cpu_ms']:14.1f}")
    for r in out["recovery"]:
        print(f"recovery after a worker's SIGKILL mid-step (heartbeat {r['heartbeat_s']:g} s): "
              f"{r['recovery_s']:.2f} s")
    for n in out["notes"]:
        print(n)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        target, q, work, hb = sys.argv[2:6]
        asyncio.run(child(target, q, Path(work), float(hb)))
        raise SystemExit(0)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--turns", type=int, default=10, help="measured runs per runner")
    p.add_argument("--quick", action="store_true", help="3 runs per runner")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args()
    figures = asyncio.run(main(3 if a.quick else a.turns))
    print(json.dumps(figures, indent=2)) if a.json else report(figures)
