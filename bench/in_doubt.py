"""The intent's cost per remote step (F26): ``in_doubt="ask"`` against a ``rerun`` tool.

Usage (from the repository root, with the package installed)::

    python bench/in_doubt.py              # SQLite, the full run (~1 minute)
    python bench/in_doubt.py --quick      # a smaller run, for a smoke check
    python bench/in_doubt.py --pg DSN     # PostgreSQL too (on a fresh schema of DSN)
    python bench/in_doubt.py --json       # the same figures, machine-readable

The workload: a zero-latency scripted model; turns of ``--calls`` (10) sequential remote tool
calls that do nothing (``async def``), ``--turns`` (40) turns on one session each, run
one after another. The **floor** is the same workload with a ``rerun`` tool (the default:
what a remote step always cost); the measured runs use ``in_doubt="ask"`` and a reconcile
function (never called: nothing is in doubt). An intent is one read and one extra write per
remote call; nothing else differs, which the script checks (the store holds exactly one
``intent:`` step per call more than the floor's).

Each mode runs ``--repeat`` (5) times, interleaved (floor, ask, reconcile, floor, …) on a
fresh database each time; figures are medians. µs/call: wall time of the whole workload over
its remote calls (each call's turn also runs a model step, and the turn's start and end are
in it: the difference to the floor is the intent's); CPU µs/call likewise with
``time.process_time()``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_turns import (
    Agent,
    ModelReply,
    Reconciled,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.models.scripted import calls_this_turn
from durable_turns.records import SessionKey
from durable_turns.stores import SessionStore

AGENT = "bench"
MODES = ("rerun", "ask", "reconcile")


async def _reconcile(args: dict[str, Any], ctx: ToolContext) -> Reconciled:
    return Reconciled.not_run()  # never called here: no call is in doubt


def make_tool(mode: str) -> Any:
    in_doubt: Any = {"rerun": "rerun", "ask": "ask", "reconcile": _reconcile}[mode]

    @tool(name="remote", in_doubt=in_doubt)
    async def remote(n: int, ctx: ToolContext) -> int:
        """A remote call that does nothing."""
        return n

    return remote


def script(calls: int) -> list[ModelReply]:
    return [*(ModelReply("", [ToolCall(f"c{i}", "remote", {"n": i})]) for i in range(calls)),
            ModelReply("done")]


async def run_once(mode: str, store: SessionStore, turns: int, calls: int
                   ) -> tuple[float, float, int]:
    """Wall and CPU seconds of the workload, and the intent steps it stored."""
    agent = Agent(AGENT, "bench", [make_tool(mode)])
    wall = cpu = 0.0
    replies = script(calls)
    model = scripted(lambda request: replies[calls_this_turn(request)])
    async with Runtime([agent], store, model) as rt:
        for t in range(turns):
            session = rt.session(AGENT, f"s{t}")
            w0, c0 = time.perf_counter(), time.process_time()
            res = await session.turn("go")
            wall += time.perf_counter() - w0
            cpu += time.process_time() - c0
            assert res.status == "completed", res
        intents = 0
        for t in range(turns):
            steps = await store.read_steps(SessionKey(AGENT, f"s{t}"))
            intents += sum(1 for k in steps if k.startswith("intent:"))
    return wall, cpu, intents


def stores(kind: str, pg: str | None, work: Path) -> Callable[[], SessionStore]:
    if kind == "postgres":
        import psycopg

        from durable_turns import PostgresStore

        assert pg is not None

        def fresh_pg() -> SessionStore:
            schema = f"b_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(pg, autocommit=True) as c:
                c.execute(f"CREATE SCHEMA {schema}")
            return PostgresStore(psycopg.conninfo.make_conninfo(
                pg, options=f"-csearch_path={schema}"))

        return fresh_pg
    counter = iter(range(1_000_000))
    return lambda: SqliteStore(work / f"db{next(counter)}.sqlite")


def measure(kind: str, pg: str | None, turns: int, calls: int, repeat: int
            ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = stores(kind, pg, Path(tmp))
        runs: dict[str, list[tuple[float, float, int]]] = {m: [] for m in MODES}
        asyncio.run(run_once("rerun", fresh(), 2, calls))  # warm-up: imports, caches
        for _ in range(repeat):
            for mode in MODES:
                runs[mode].append(asyncio.run(run_once(mode, fresh(), turns, calls)))
    n = turns * calls
    out: dict[str, Any] = {"store": kind, "calls": n}
    for mode, rs in runs.items():
        assert all(r[2] == (0 if mode == "rerun" else n) for r in rs), (mode, rs)
        out[mode] = {"us_per_call": statistics.median(r[0] for r in rs) / n * 1e6,
                     "cpu_us_per_call": statistics.median(r[1] for r in rs) / n * 1e6}
    for mode in ("ask", "reconcile"):
        m, f = out[mode], out["rerun"]
        m["extra_us"] = m["us_per_call"] - f["us_per_call"]
        m["extra_cpu_us"] = m["cpu_us_per_call"] - f["cpu_us_per_call"]
        m["ratio"] = m["us_per_call"] / f["us_per_call"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--pg", default=None, help="a PostgreSQL DSN: measure it too")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.turns, a.repeat = 5, 1
    results = [measure("sqlite", None, a.turns, a.calls, a.repeat)]
    if a.pg:
        results.append(measure("postgres", a.pg, a.turns, a.calls, a.repeat))
    if a.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"{r['store']}: {r['calls']} remote calls a run, medians of {a.repeat} runs")
        f = r["rerun"]
        print(f"  rerun (floor)  {f['us_per_call']:8.1f} µs/call  "
              f"{f['cpu_us_per_call']:8.1f} CPU µs/call")
        for mode in ("ask", "reconcile"):
            m = r[mode]
            print(f"  {mode:<14} {m['us_per_call']:8.1f} µs/call  "
                  f"{m['cpu_us_per_call']:8.1f} CPU µs/call  "
                  f"+{m['extra_us']:.1f} µs (+{m['extra_cpu_us']:.1f} CPU µs), "
                  f"{m['ratio']:.2f}x the floor")


if __name__ == "__main__":
    main()
