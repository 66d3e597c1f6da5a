"""Resume time of a redelivered turn in a fresh process, at a short and at a long history.

Usage (from the repository root, with the package installed)::

    python bench/resume.py              # 0 and 2,200 messages, 7 fresh processes each
    python bench/resume.py --json

Set-up (once, in child processes): two SqliteStore databases, one with a session ``short``
(no history), one with a session ``long`` (grown to ``--history`` messages by turns of
sequential tool calls); then, for each, a process accepts one turn without driving it
(``Runtime(scheduler=NoDriveScheduler())``) and dies by SIGKILL: what a worker finds after a
crash — the database, its WAL, its shared-memory index and its lease file as the dead process
left them.

Each measurement is a new Python process on a fresh copy of that database. After its imports
(``opentelemetry.trace`` too, when installed: the engine imports it at its first turn) it
starts the clock, opens the store and a runtime, calls ``recover()`` and stops the clock
when the first step of the redelivered turn after its opening has committed (its
``message.completed`` event reaches an observer). So the figure covers opening the store,
claiming the lease, reading and decoding the session's log, one model call of a
zero-latency scripted model and the step's commit. It also reports the part spent loading
the log (``read_messages``), timed by the same process around the store call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

AGENT = "bench"
CALLS = 10


def _agent_and_model() -> tuple[Any, Any]:
    from durable_turns import Agent, ModelReply, ToolCall, scripted, tool

    @tool
    async def count(n: int) -> dict[str, int]:
        """Count."""
        return {"n": n}

    def reply(request: Any) -> Any:
        k = 0
        for m in reversed(request.messages):
            if m.is_opening:
                break
            k += m.role == "tool"
        if k < CALLS:
            return ModelReply(tool_calls=[ToolCall(f"{request.turn_id}-c{k}", "count",
                                                   {"n": k})])
        return ModelReply("done")

    return Agent(AGENT, "You are a benchmark.", [count]), scripted(reply)


async def _setup(folder: Path, history: int) -> dict[str, int]:
    """``short.db`` and ``long.db``, their sessions grown (the turn is accepted later)."""
    from durable_turns import Runtime, SqliteStore

    agent, model = _agent_and_model()
    sizes = {}
    for session, grow in (("short", 0), ("long", history)):
        db = folder / f"{session}.db"
        async with Runtime([agent], SqliteStore(db), model) as rt:
            s = rt.session(AGENT, session)
            t = 0
            while len(await s.transcript()) < grow:
                await s.turn("count to ten", turn_id=f"grow-{t}")
                t += 1
            sizes[session] = len(await s.transcript())
    return sizes


async def _crash(db: Path, session: str) -> None:
    """Accept the turn to redeliver, then die by SIGKILL: the database, its WAL, its shared
    memory index and its lease file are left as a crashed process leaves them."""
    from durable_turns import Runtime, SqliteStore
    from durable_turns.scheduling import NoDriveScheduler

    agent, model = _agent_and_model()
    rt = Runtime([agent], SqliteStore(db), model, scheduler=NoDriveScheduler())
    await rt.open()
    # Through the session: what it accepts is durable before start() returns.
    await rt.session(AGENT, session).start("count again", turn_id="redelivered")
    os.kill(os.getpid(), signal.SIGKILL)


async def _measure(db: Path, session: str) -> dict[str, float]:
    from durable_turns import Runtime, SqliteStore

    with contextlib.suppress(ImportError):  # the engine imports it at its first turn
        import opentelemetry.trace  # noqa: F401

    agent, model = _agent_and_model()
    store = SqliteStore(db)
    loading = 0.0
    read = store.read_messages

    async def timed_read(*args: Any, **kwargs: Any) -> Any:
        nonlocal loading
        t = time.perf_counter()
        out = await read(*args, **kwargs)
        loading += time.perf_counter() - t
        return out

    store.read_messages = timed_read  # type: ignore[method-assign]
    done = asyncio.Event()
    stop = 0.0

    class Sink:
        # Called synchronously right after the step's commit: the clock stops here, not
        # when the waiting task next runs (the driver may go on to later steps first).
        def emit(self, event: Any) -> None:
            nonlocal stop
            if event.type == "message.completed" and not done.is_set():
                stop = time.perf_counter()
                done.set()

    start = time.perf_counter()
    async with Runtime([agent], store, model, sink=Sink()) as rt:
        await rt.recover()
        await asyncio.wait_for(done.wait(), 60)
    return {"ms": (stop - start) * 1000, "load_ms": loading * 1000}


def _child(args: argparse.Namespace) -> None:
    if args.child == "setup":
        print(json.dumps(asyncio.run(_setup(Path(args.db), args.history))))
    elif args.child.startswith("crash-"):
        session = args.child.removeprefix("crash-")
        asyncio.run(_crash(Path(args.db) / f"{session}.db", session))
    else:
        print(json.dumps(asyncio.run(_measure(Path(args.db), args.child))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--history", type=int, default=2200, help="messages in the long session")
    p.add_argument("--repeat", type=int, default=7, help="fresh processes per figure")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args)
        return
    me = [sys.executable, __file__]
    with tempfile.TemporaryDirectory() as tmp:
        sizes = json.loads(subprocess.run(
            [*me, "--child", "setup", "--db", tmp, "--history", str(args.history)],
            check=True, capture_output=True, text=True).stdout)
        for session in ("short", "long"):
            crashed = subprocess.run([*me, "--child", f"crash-{session}", "--db", tmp],
                                     capture_output=True, text=True)
            if crashed.returncode != -signal.SIGKILL:
                raise SystemExit(f"the set-up that accepts the turn did not die by SIGKILL "
                                 f"({crashed.returncode}): {crashed.stderr}")
        out: dict[str, Any] = {}
        for session in ("short", "long"):
            runs = []
            for i in range(args.repeat):
                db = Path(tmp) / f"{session}-{i}.db"
                for suffix in ("", "-wal", "-shm", "-lease"):
                    src = Path(tmp) / f"{session}.db{suffix}"
                    if src.exists():
                        shutil.copy(src, str(db) + suffix)
                runs.append(json.loads(subprocess.run(
                    [*me, "--child", session, "--db", str(db)],
                    check=True, capture_output=True, text=True).stdout))
            out[session] = {
                "messages": sizes[session],
                "resume_ms": statistics.median(r["ms"] for r in runs),
                "load_ms": statistics.median(r["load_ms"] for r in runs),
            }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"resume of a redelivered turn in a fresh process (median of {args.repeat}):")
    for r in out.values():
        print(f"  {r['messages']:>5} messages of history: {r['resume_ms']:6.1f} ms to the first "
              f"step committed ({r['load_ms']:.1f} ms of it loading the log)")


if __name__ == "__main__":
    main()
