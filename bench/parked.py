"""What a parked session costs a runtime in memory, and how long parking takes.

Usage (from the repository root, with the package installed)::

    python bench/parked.py              # park 10,000 sessions (about a minute)
    python bench/parked.py --quick      # park 1,000, for a smoke check
    python bench/parked.py -n 50000     # any number
    python bench/parked.py --json       # the same figures, machine-readable

One runtime on a fresh ``SqliteStore`` (``synchronous=OFF``: the cost measured is the
runtime's, not the disk's) and a scripted model whose turn calls a tool that asks a person for
approval, so every turn parks. Only the public API is used: ``Runtime``, ``session.start``,
``session.result`` (status ``suspended``) and ``session.pending``.

First ``--warmup`` (500) sessions are parked, so caches, prepared statements and the
runtime's bounded transcript cache are full; then ``-n`` more are parked, ``--batch`` (500)
turns in flight at a time, and the growth is measured:

- **Python memory**: what is still allocated after the parks (``tracemalloc``, started after
  the warm-up; a garbage collection before each reading);
- **resident set**: growth of the process's RSS (``/proc/self/statm``), which also counts
  SQLite's own page cache and the allocator's free lists.

Each is read after the first half of the ``n`` parks and after all of them. "per parked
session" is the growth over the second half divided by its sessions: what one more parked
session costs, apart from the fixed cost of having parked at all (caches filling, dicts
growing to the number of turns in flight), which the totals show. **ms per park** is wall
time over ``n`` (slower under ``tracemalloc``: ``--no-tracemalloc`` for the plain figure).

Afterwards every parked session is checked with ``session.pending()``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import tempfile
import time
import tracemalloc
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

WAIT = 60.0
"""A bound on each wait for a batch of parks, so a hang fails the run."""


@tool
async def issue_refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund once approved."""
    ok = await ctx.request_input("approve", f"Refund {order_id}?", schema={"type": "boolean"})
    return {"refunded": ok}


def rss_bytes() -> int:
    """The resident set size of this process now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def turn_id(i: int) -> str:
    return f"refund-{i}"


async def park(rt: Runtime, first: int, count: int, batch: int) -> None:
    """Park sessions ``s<first>`` … ``s<first + count - 1>`` (keeping nothing of them here)."""
    for start in range(first, first + count, batch):
        ids = range(start, min(start + batch, first + count))
        for i in ids:
            await rt.session("bench", f"s{i}").start("refund 42", turn_id=turn_id(i))
        for i in ids:
            r = await asyncio.wait_for(rt.session("bench", f"s{i}").result(turn_id(i)), WAIT)
            if r.status != "suspended":
                raise AssertionError(f"session s{i}: {r.status} {r.error}, not suspended")


async def measure(args: argparse.Namespace, db: Path) -> dict[str, Any]:
    replies = [ModelReply("", [ToolCall("c1", "issue_refund", {"order_id": "42"})])]
    rt = Runtime([Agent("bench", "", [issue_refund])], SqliteStore(db, synchronous="OFF"),
                 scripted(replies))
    async with rt:
        await park(rt, 0, args.warmup, args.batch)
        gc.collect()
        if args.tracemalloc:
            tracemalloc.start()
        half = args.n // 2
        readings: list[tuple[int, int]] = []  # (traced, rss) at 0, n/2 and n parks

        def read() -> None:
            gc.collect()
            traced = tracemalloc.get_traced_memory()[0] if args.tracemalloc else 0
            readings.append((traced, rss_bytes()))

        read()
        t0 = time.perf_counter()
        await park(rt, args.warmup, half, args.batch)
        seconds = time.perf_counter() - t0
        read()
        t0 = time.perf_counter()
        await park(rt, args.warmup + half, args.n - half, args.batch)
        seconds += time.perf_counter() - t0
        read()
        if args.tracemalloc:
            tracemalloc.stop()
        for i in range(args.warmup + args.n):
            pending = await rt.session("bench", f"s{i}").pending()
            if pending is None or pending.turn_id != turn_id(i):
                raise AssertionError(f"session s{i} is not parked on its turn")
    (t0_, r0), (t1, r1), (t2, r2) = readings
    second = args.n - half
    out: dict[str, Any] = {
        "parked": args.n, "warmup": args.warmup, "seconds": seconds,
        "ms_per_park": seconds / args.n * 1000, "tracemalloc": args.tracemalloc,
        "rss_bytes": r2 - r0, "rss_bytes_per_session": (r2 - r1) / second,
    }
    if args.tracemalloc:
        out["traced_bytes"] = t2 - t0_
        out["traced_bytes_per_session"] = (t2 - t1) / second
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("-n", type=int, default=None, help="sessions to park (default 10,000)")
    ap.add_argument("--quick", action="store_true", help="park 1,000 sessions")
    ap.add_argument("--warmup", type=int, default=500, help="sessions parked first (500)")
    ap.add_argument("--batch", type=int, default=500, help="turns in flight at once (500)")
    ap.add_argument("--no-tracemalloc", dest="tracemalloc", action="store_false",
                    help="RSS only (parks run at full speed)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    if args.n is None:
        args.n = 1_000 if args.quick else 10_000
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(measure(args, Path(tmp) / "parked.sqlite"))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"parked {out['parked']:,} sessions (after {out['warmup']:,} to warm up) in "
          f"{out['seconds']:.1f} s: {out['ms_per_park']:.2f} ms per park"
          + (" (under tracemalloc)" if out["tracemalloc"] else ""))
    print(f"  {'':24}{'growth in all':>16}{'per parked session':>22}")
    if args.tracemalloc:
        print(f"  {'Python memory (traced)':24}{out['traced_bytes']:>10,} bytes"
              f"{out['traced_bytes_per_session']:>16.1f} bytes")
    print(f"  {'resident set':24}{out['rss_bytes']:>10,} bytes"
          f"{out['rss_bytes_per_session']:>16.1f} bytes")


if __name__ == "__main__":
    main()
