"""Parallel tool calls (F15): what running a batch at once saves, and what it costs.

Usage (from the repository root, with the package installed)::

    python bench/parallel.py            # both figures (about 15 s)
    python bench/parallel.py --quick    # fewer repeats, for a smoke check
    python bench/parallel.py --store memory
    python bench/parallel.py --json

1. **A batch of slow calls**: one turn whose model asks for 10 remote calls of 50 ms each
   (``asyncio.sleep``), then answers. Wall time from ``start()`` to its result, median of
   ``--repeat`` turns, with ``Agent(parallel_tools=False)`` (one call after another) and
   ``True`` (all at once).
2. **Per-step overhead**: the same batch with zero-latency tools, ``--turns`` turns in a row
   per mode; the cost of one tool step is the turns' wall time over their tool steps (model
   steps included in both modes alike). Parallel mode pays for a task per call, a lock per
   commit and the read of the batch's committed steps.

One runtime on a fresh ``SqliteStore`` (default; ``synchronous=NORMAL``, WAL) or a
``MemoryStore``, and a scripted model. Only the public API is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    scripted,
    tool,
)
from durable_turns.stores import SessionStore

CALLS = 10


def agent(parallel: bool, latency: float) -> Agent:
    @tool
    async def fetch(n: int) -> int:
        """A remote call that takes ``latency`` seconds."""
        if latency:
            await asyncio.sleep(latency)
        return n

    batch = [ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(CALLS)]
    model = scripted([ModelReply("Fetching all.", batch), ModelReply("Done.")], chunks=1)
    return Agent("bench", "", [fetch], model=model, parallel_tools=parallel)


async def turns(store: SessionStore, parallel: bool, latency: float, count: int,
                tag: str) -> list[float]:
    """Run ``count`` turns (one session each); the wall time of each."""
    times: list[float] = []
    async with Runtime([agent(parallel, latency)], store) as rt:
        for i in range(count):
            s = rt.session("bench", f"{tag}-{i}")
            t0 = time.perf_counter()
            r = await s.turn("go")
            times.append(time.perf_counter() - t0)
            assert r.status == "completed", r
    return times


def make_store(kind: str, folder: Path, name: str) -> SessionStore:
    return MemoryStore() if kind == "memory" else SqliteStore(folder / f"{name}.sqlite")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"store": args.store, "calls": CALLS}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for mode, parallel in (("sequential", False), ("parallel", True)):
            slow = await turns(make_store(args.store, folder, f"slow-{mode}"), parallel,
                               0.05, args.repeat, "slow")
            out[f"batch_50ms_{mode}_s"] = round(statistics.median(slow), 3)
            await turns(make_store(args.store, folder, f"warm-{mode}"), parallel, 0, 20, "w")
            fast = await turns(make_store(args.store, folder, f"fast-{mode}"), parallel, 0,
                               args.turns, "fast")
            out[f"turn_zero_latency_{mode}_ms"] = round(statistics.median(fast) * 1e3, 2)
            out[f"tool_step_{mode}_us"] = round(sum(fast) / (len(fast) * CALLS) * 1e6, 1)
    out["speedup"] = round(out["batch_50ms_sequential_s"] / out["batch_50ms_parallel_s"], 1)
    out["parallel_overhead_per_step_us"] = round(
        out["tool_step_parallel_us"] - out["tool_step_sequential_us"], 1)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--store", choices=["sqlite", "memory"], default="sqlite")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.repeat, a.turns = 3, 30
    figures = asyncio.run(main(a))
    if a.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"store: {figures['store']}; a batch of {CALLS} remote calls")
        print(f"  50 ms each, sequential: {figures['batch_50ms_sequential_s']:.3f} s per turn")
        print(f"  50 ms each, parallel:   {figures['batch_50ms_parallel_s']:.3f} s per turn "
              f"({figures['speedup']}x)")
        print(f"  zero latency, per tool step: sequential "
              f"{figures['tool_step_sequential_us']} µs, parallel "
              f"{figures['tool_step_parallel_us']} µs "
              f"(overhead {figures['parallel_overhead_per_step_us']} µs)")
