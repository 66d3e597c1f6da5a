"""Cross-process event feed latency, and the event loop's responsiveness under another
process's SQLite write lock, on SqliteStore.

Usage (from the repository root, with the package installed)::

    python bench/feed.py            # the full run (about a minute)
    python bench/feed.py --quick    # a smaller run, for a smoke check
    python bench/feed.py --json     # the same figures, machine-readable

**Feed latency.** A child process (this script, ``--child drive``) drives ``--turns`` (50)
turns on one session of a SQLite file: a zero-latency scripted model that makes ``--calls``
(2) sequential calls of an ``async`` tool, then answers; so 2 * calls + 2 commits and
3 * calls + 3 events per turn. Its runtime's ``sink`` (called synchronously right after each
step commits) writes ``seq time.monotonic()`` per stored event to a file, flushed. Before the
child starts, this process subscribes to the session with ``rt.subscribe(key, after_seq=0)``
(1, 2 and 10 concurrent subscribers, each its own task) and takes ``time.monotonic()`` as each
event comes out of its subscription. CLOCK_MONOTONIC is system-wide on Linux, so latency =
received - committed, per event and per subscriber. This process learns of the child's commits
only by polling SQLite's ``PRAGMA data_version`` every ``poll_interval`` (``--poll-interval``,
the store's default 0.02 s), so the latency is about a uniform 0..poll_interval plus the read.
The tool sleeps 0..2 * ``--pace`` (10 ms on average) s, uniformly at random, so commits come
at random phases of the poll rather than in one burst (``--pace 0``: back to back, as fast as
the child can commit).

**Write lock.** A child process (``--child lock``) runs ``BEGIN IMMEDIATE``, holds the database's
write lock for ``--hold`` (2) s, then ``COMMIT``. Meanwhile a heartbeat task here sleeps 10 ms
in a loop and records the gaps between its wake-ups, from the moment the lock is held until the
measured work is done and the lock released; its largest gap and p99 gap show how long the event
loop was unavailable. Scenarios: *idle* (nothing else runs: the baseline); *turn* (a turn in
this process is accepted while the lock is held, so its writes wait for the lock, on the store's
writer thread); *replay* (a subscriber replays another session's ``--replay-turns`` (200)
stored turns of events, from seq 0); *turn + replay* (both at once); and, for comparison,
*replay, no lock* (the same replay with no other process holding anything). Each scenario
runs ``--repeat`` (3) times; the figures are the median over the runs and the worst run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from durable_turns import Agent, ModelReply, Runtime, SqliteStore, ToolCall, scripted, tool

AGENT = "feedbench"
SESSION = "live"
OTHER = "stored"
FINAL = "done"
BEAT = 0.010


def turn_id(t: int) -> str:
    return f"t{t:04d}"


def build(calls: int, pace: float) -> tuple[Agent, Any]:
    """The agent (one async tool, sleeping 0..2 * ``pace`` s, uniformly at random) and a
    scripted model making ``calls`` sequential calls of it per turn."""
    rng = random.Random(1)

    @tool(name="lookup")
    async def lookup(n: int) -> dict[str, Any]:
        """Look something up (remotely: takes ``pace`` seconds on average)."""
        if pace:
            await asyncio.sleep(rng.uniform(0, 2 * pace))
        return {"n": n, "ok": True}

    def reply(request: Any) -> ModelReply:
        k = 0  # model calls this turn so far: assistant messages since the opening
        for m in reversed(request.messages):
            if m.role in ("user", "trigger"):
                break
            if m.role == "assistant":
                k += 1
        if k < calls:
            return ModelReply(tool_calls=[ToolCall(f"{request.turn_id}-c{k}", "lookup", {"n": k})])
        return ModelReply(FINAL)

    return Agent(AGENT, "You are a benchmark.", [lookup]), scripted(reply)


def events_per_turn(calls: int) -> int:
    # turn.started; per call message.completed + action.requested + action.completed;
    # the final message.completed + turn.completed
    return 3 * calls + 3


def dist_ms(xs: list[float]) -> dict[str, Any]:
    """p50, p90, p99, max (ms) and count of a list of seconds."""
    if not xs:
        return {"count": 0}
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] * 1e3

    return {"p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "max": s[-1] * 1e3,
            "mean": statistics.fmean(s) * 1e3, "count": len(s)}


# -- children -----------------------------------------------------------------------------


class StampSink:
    """Writes ``seq time.monotonic()`` for each stored event, right after its step commits."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "w")  # noqa: SIM115 -- closed by the child when its turns end

    def emit(self, event: Any) -> None:
        t = time.monotonic()
        if event.type == "message.delta":  # live text, never stored
            return
        self.f.write(f"{event.seq} {t:.9f}\n")
        self.f.flush()


async def child_drive(db: Path, stamps: Path, turns: int, calls: int, pace: float) -> None:
    agent, model = build(calls, pace)
    sink = StampSink(stamps)
    try:
        async with Runtime([agent], SqliteStore(db), model, sink) as rt:
            s = rt.session(AGENT, SESSION)
            for t in range(turns):
                r = await s.turn("go", turn_id=turn_id(t))
                if r.status != "completed":
                    raise SystemExit(f"turn {r.turn_id} ended {r.status}: {r.error}")
    finally:
        sink.f.close()


def child_lock(db: Path, hold: float) -> None:
    import sqlite3

    c = sqlite3.connect(db, isolation_level=None)
    c.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(hold)
    c.execute("COMMIT")
    c.close()
    print("released", flush=True)


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def failed(what: str, proc: subprocess.Popen[str]) -> SystemExit:
    return SystemExit(f"{what} failed:\n{proc.stderr.read() if proc.stderr else ''}")


# -- feed latency -------------------------------------------------------------------------


async def feed_run(tmp: Path, subscribers: int, args: argparse.Namespace) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix=f"feed-{subscribers}-", dir=tmp))
    db, stamps = d / "feed.sqlite", d / "stamps.txt"
    agent, model = build(args.calls, args.pace)
    last = args.turns * events_per_turn(args.calls)
    received: list[dict[int, float]] = [{} for _ in range(subscribers)]
    async with Runtime([agent], SqliteStore(db, poll_interval=args.poll_interval), model) as rt:
        key = rt.key(AGENT, SESSION)
        async with contextlib.AsyncExitStack() as stack:
            subs = [await stack.enter_async_context(rt.subscribe(key, after_seq=0))
                    for _ in range(subscribers)]

            async def consume(sub: Any, got: dict[int, float]) -> None:
                async for e in sub:
                    t = time.monotonic()
                    if e.type == "message.delta":
                        continue
                    got[e.seq] = t
                    if e.seq >= last:
                        return

            tasks = [asyncio.create_task(consume(s, g))
                     for s, g in zip(subs, received, strict=True)]
            proc = spawn("--child", "drive", "--db", str(db), "--stamps", str(stamps),
                         "--turns", str(args.turns), "--calls", str(args.calls),
                         "--pace", str(args.pace))
            t0 = time.monotonic()
            rc = await asyncio.to_thread(proc.wait)
            child_seconds = time.monotonic() - t0
            if rc != 0:
                raise failed("the driving child", proc)
            try:
                await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
            except TimeoutError:
                raise SystemExit(
                    f"subscribers got {[len(g) for g in received]} of {last} events") from None
    committed: dict[int, float] = {}
    for line in stamps.read_text().splitlines():
        seq, t = line.split()
        committed[int(seq)] = float(t)
    if len(committed) != last:
        raise SystemExit(f"the child committed {len(committed)} events, expected {last}")
    lat = [got[seq] - t for got in received for seq, t in committed.items()]
    missing = sum(1 for got in received for seq in committed if seq not in got)
    shutil.rmtree(d, ignore_errors=True)
    if missing:
        raise SystemExit(f"{missing} events never reached a subscriber")
    first = min(committed.values())
    span = max(committed.values()) - first
    return {"subscribers": subscribers, "latency_ms": dist_ms(lat),
            "events": last, "commits": args.turns * (2 * args.calls + 2),
            "child_commit_span_s": span, "child_process_s": child_seconds}


# -- the write lock -----------------------------------------------------------------------


class Heartbeat:
    """A task that sleeps ``BEAT`` s in a loop; the gaps between its wake-ups."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.stamps.append(time.monotonic())
            await asyncio.sleep(BEAT)

    async def stop(self) -> list[float]:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        return [b - a for a, b in itertools.pairwise(self.stamps)]


async def lock_run(db: Path, rt: Runtime, scenario: str, run: int,
                   args: argparse.Namespace) -> dict[str, Any]:
    proc = None
    if "no lock" not in scenario:
        proc = spawn("--child", "lock", "--db", str(db), "--hold", str(args.hold))
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        if line.strip() != "locked":
            raise failed("the locking child", proc)
    locked_at = time.monotonic()
    beat = Heartbeat()
    out: dict[str, Any] = {}

    async def a_turn() -> None:
        t0 = time.monotonic()
        r = await rt.session(AGENT, f"busy-{scenario}-{run}").turn("go", turn_id="t0")
        out["turn_s"] = time.monotonic() - t0
        if r.status != "completed":
            raise SystemExit(f"turn ended {r.status}: {r.error}")

    async def a_replay() -> None:
        t0 = time.monotonic()
        n = 0
        async with rt.subscribe(rt.key(AGENT, OTHER), after_seq=0) as sub:
            async for e in sub:
                n += 1
                if e.seq >= args.replay_events:
                    break
        out["replay_s"] = time.monotonic() - t0
        out["replayed"] = n

    work = []
    if "turn" in scenario:
        work.append(a_turn())
    if "replay" in scenario:
        work.append(a_replay())
    await asyncio.gather(*work)
    if proc is None:
        await asyncio.sleep(0.05)  # a few beats after the work, as under the lock
    elif await asyncio.to_thread(proc.wait) != 0:
        raise failed("the locking child", proc)
    out["window_s"] = time.monotonic() - locked_at
    gaps = await beat.stop()
    out["gap_ms"] = dist_ms(gaps)
    return out


async def lock_all(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    db = tmp / "lock.sqlite"
    agent, model = build(args.calls, 0.0)
    results: dict[str, Any] = {}
    async with Runtime([agent], SqliteStore(db), model) as rt:
        other = rt.session(AGENT, OTHER)
        for t in range(args.replay_turns):
            await other.turn("go", turn_id=turn_id(t))
        args.replay_events = args.replay_turns * events_per_turn(args.calls)
        for scenario in ("idle", "turn", "replay", "turn + replay", "replay, no lock"):
            runs = [await lock_run(db, rt, scenario, i, args) for i in range(args.repeat)]
            r: dict[str, Any] = {
                "runs": len(runs),
                "max_gap_ms": statistics.median(x["gap_ms"]["max"] for x in runs),
                "worst_max_gap_ms": max(x["gap_ms"]["max"] for x in runs),
                "p99_gap_ms": statistics.median(x["gap_ms"]["p99"] for x in runs),
                "p50_gap_ms": statistics.median(x["gap_ms"]["p50"] for x in runs),
                "beats": statistics.median(x["gap_ms"]["count"] for x in runs),
                "window_s": statistics.median(x["window_s"] for x in runs),
            }
            if "turn" in scenario:
                r["turn_s"] = statistics.median(x["turn_s"] for x in runs)
            if "replay" in scenario:
                r["replay_ms"] = statistics.median(x["replay_s"] for x in runs) * 1e3
                r["replayed_events"] = runs[0]["replayed"]
            results[scenario] = r
    return results


# -- orchestration ------------------------------------------------------------------------


async def parent(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="dt-feed-", dir=args.tmpdir))
    t0 = time.perf_counter()
    try:
        feed = {}
        for n in args.subscribers:
            runs = [await feed_run(tmp, n, args) for _ in range(args.repeat)]
            # pool every run's samples: rank statistics of all of them
            best = runs[0]
            if len(runs) > 1:
                feed[n] = {**best, "runs": len(runs), "latency_ms": pool(runs)}
            else:
                feed[n] = {**best, "runs": 1}
        lock = await lock_all(tmp, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "workload": {"turns": args.turns, "calls": args.calls, "pace_s": args.pace,
                     "poll_interval_s": args.poll_interval, "hold_s": args.hold,
                     "replay_turns": args.replay_turns, "repeat": args.repeat,
                     "python": sys.version.split()[0], "cores": os.cpu_count()},
        "feed": feed, "lock": lock, "wall_seconds": time.perf_counter() - t0,
    }


def pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The latency distribution of several runs: medians of their quantiles, worst max."""
    ds = [r["latency_ms"] for r in runs]
    out = {k: statistics.median(d[k] for d in ds) for k in ("p50", "p90", "p99", "mean")}
    out["max"] = max(d["max"] for d in ds)
    out["count"] = sum(d["count"] for d in ds)
    return out


def render(result: dict[str, Any]) -> None:
    w = result["workload"]
    print(f"Cross-process feed latency on SqliteStore: a child process drives {w['turns']} "
          f"turns ({w['calls']} tool calls each, tool pace {w['pace_s'] * 1e3:.0f} ms mean); "
          f"subscribers here, poll_interval {w['poll_interval_s'] * 1e3:.0f} ms; "
          f"{w['repeat']} run(s) each")
    print(f"{'subscribers':>11} {'events':>7} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'mean ms':>8} {'child commits/s':>16}")
    for n, r in result["feed"].items():
        lat = r["latency_ms"]
        rate = r["commits"] / r["child_commit_span_s"] if r["child_commit_span_s"] else 0
        print(f"{n:>11} {lat['count']:>7} {lat['p50']:>7.1f} {lat['p90']:>7.1f} "
              f"{lat['p99']:>7.1f} {lat['max']:>7.1f} {lat['mean']:>8.1f} {rate:>16,.0f}")
    print()
    print(f"Event loop under another process's write lock held {w['hold_s']:.1f} s "
          f"(10 ms heartbeat; median of {w['repeat']} run(s), worst max in brackets)")
    print(f"{'scenario':<16} {'max gap ms':>16} {'p99 gap ms':>11} {'p50 gap ms':>11} "
          f"{'beats':>6}  work")
    for name, r in result["lock"].items():
        work = []
        if "turn_s" in r:
            work.append(f"turn took {r['turn_s']:.2f} s")
        if "replay_ms" in r:
            work.append(f"replay of {r['replayed_events']} events took {r['replay_ms']:.0f} ms")
        mx = f"{r['max_gap_ms']:.1f} ({r['worst_max_gap_ms']:.1f})"
        print(f"{name:<16} {mx:>16} {r['p99_gap_ms']:>11.1f} {r['p50_gap_ms']:>11.1f} "
              f"{r['beats']:>6.0f}  {'; '.join(work)}")
    print(f"\npython {w['python']}, {w['cores']} cores; wall time {result['wall_seconds']:.1f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small run (a few seconds)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--turns", type=int, default=None, help="turns the child drives (50)")
    p.add_argument("--calls", type=int, default=2, help="tool calls per turn (2)")
    p.add_argument("--pace", type=float, default=0.01,
                   help="mean seconds a tool call sleeps in the child (0.01; 0: back to back)")
    p.add_argument("--subscribers", type=int, nargs="+", default=[1, 2, 10],
                   help="concurrent subscribers here, one run per value (1 2 10)")
    p.add_argument("--poll-interval", type=float, default=0.02,
                   help="SqliteStore poll_interval of the subscribing process (0.02)")
    p.add_argument("--hold", type=float, default=2.0, help="seconds the lock is held (2)")
    p.add_argument("--replay-turns", type=int, default=None,
                   help="stored turns of the session replayed under the lock (200)")
    p.add_argument("--repeat", type=int, default=None, help="runs per case (3)")
    p.add_argument("--tmpdir", default=None, help="where the databases go (default: $TMPDIR)")
    p.add_argument("--child", choices=("drive", "lock"), help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    p.add_argument("--stamps", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child == "drive":
        asyncio.run(child_drive(Path(args.db), Path(args.stamps), args.turns, args.calls,
                                args.pace))
        return
    if args.child == "lock":
        child_lock(Path(args.db), args.hold)
        return
    for name, full, small in (("turns", 50, 20), ("replay_turns", 200, 50), ("repeat", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, small if args.quick else full)
    result = asyncio.run(parent(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        render(result)


if __name__ == "__main__":
    main()
