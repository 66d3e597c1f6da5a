"""Per-step cost of the engine on ``MemoryStore``: what the reference store costs the tests.

Usage (from the repository root, with the package installed)::

    python bench/memory.py            # 5 runs of each workload (about 20 s)
    python bench/memory.py --json     # the same figures, machine-readable

The workload is ``bench/steps.py``'s: a zero-latency scripted model, turns of ``--calls``
(10) sequential calls of a remote tool (``async def``, writing nothing), so 21 steps a turn,
``--turns`` (10) turns on each of ``--sessions`` (20) sessions, driven one turn at a time,
round robin. Each run is its own child process; the figures are medians of ``--repeat``
runs: wall and CPU µs per step, and the runtime's whole turn (accept, drive, result) in µs.
Only the public API is used, so the script measures any version of the package.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, ToolCall, scripted, tool

AGENT = "bench"


def build(calls: int) -> tuple[Agent, Any]:
    """The agent (one remote tool that does nothing) and the zero-latency model."""
    @tool(name="count_remote")
    async def count_remote(n: int) -> dict[str, Any]:
        """Count one call (does nothing, returns at once)."""
        return {"n": n, "ok": True}

    def reply(request: Any) -> Any:
        last = request.messages[-1]
        k = int(last.call_id.rsplit("-c", 1)[1]) + 1 if last.role == "tool" else 0
        if k < calls:
            tid = request.turn_id
            return ModelReply(tool_calls=[ToolCall(f"{tid}-c{k}", "count_remote", {"n": k})])
        return ModelReply("done")

    return Agent(AGENT, "You are a benchmark.", [count_remote]), scripted(reply)


async def run(sessions: int, turns: int, calls: int) -> dict[str, float]:
    agent, model = build(calls)
    async with Runtime([agent], MemoryStore(), model) as rt:
        handles = [rt.session(AGENT, f"s{i:03d}") for i in range(sessions)]
        gc.collect()  # as bench/steps.py: the collector's phase is not what is measured
        c0, t0 = time.process_time(), time.perf_counter()
        for t in range(turns):
            for i, s in enumerate(handles):
                r = await s.turn("go", turn_id=f"t{i}-{t}")
                if r.status != "completed":
                    raise SystemExit(f"turn {r.turn_id} ended {r.status}: {r.error}")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = sessions * turns * (2 * calls + 1)
    return {"us_per_step": wall / steps * 1e6, "cpu_us_per_step": cpu / steps * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(run(args.sessions, args.turns, args.calls))))
        return
    runs = []
    for _ in range(args.repeat):
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--sessions", str(args.sessions),
             "--turns", str(args.turns), "--calls", str(args.calls)],
            capture_output=True, text=True, check=True, timeout=600)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = {k: {"median": statistics.median(r[k] for r in runs),
                  "all": [round(r[k], 1) for r in runs]} for k in runs[0]}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        print(f"{k}: {v['median']:.1f} (runs: {', '.join(map(str, v['all']))})")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
