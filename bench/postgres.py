"""PostgresStore: per-step cost beside SqliteStore and a raw psycopg floor, and throughput
with 1, 2 and 4 worker processes.

Usage (from the repository root, with the package installed and a PostgreSQL server)::

    eval "$(.ci/pg up)"                       # a throwaway cluster, or pass --dsn
    python bench/postgres.py                  # the full run (about a minute)
    python bench/postgres.py --quick          # a smaller run, for a smoke check
    python bench/postgres.py --json           # the same figures, machine-readable
    .ci/pg down

Per step: a zero-latency scripted model; turns of ``--calls`` (5) sequential tool calls, so
``2 * calls + 1`` steps per turn; ``--turns`` (20) turns, one session each, driven one at a
time, with a *local* tool (a plain ``def`` writing one row through ``ctx.store.unwrap()``).
µs/step is wall time over the whole workload divided by its steps (turn start and end
included). The floor is a raw psycopg loop on one connection that, per step, runs one
transaction doing what a step commit must: lock the session row and check the epoch
(``SELECT epoch … FOR UPDATE``), insert one log row holding the step's message, checkpoint
and event, as the store does (and the tool's row), and ``pg_notify``. It reads nothing else
and keeps no state, so it is a lower bound, not the same work.

Throughput: ``--sessions`` (100) sessions with one such turn each are queued, then 1, 2 and 4
worker processes (``ClaimingScheduler(max_sessions=…)``, ``--max-sessions`` (25) each, so the
sessions spread over the workers) start together and drive them, claiming with
``claim_ready`` (``FOR UPDATE SKIP LOCKED``); the figure is turns and steps per second from the
start signal until no session has an unfinished turn, and how many turns each worker drove.

Failover: a worker process is SIGKILLed inside a tool of a turn; a worker in this process
(polling every 50 ms) takes the session over once the lease expires and finishes the turn. The
figure is the time from the SIGKILL to the turn's end, for ``--failover-ttl`` (2 and 5 s)
leases: about one lease TTL, since the dead worker's last heartbeat is at most a third of it old.

Every run uses a fresh schema; figures are medians of ``--repeat`` (3) runs. The machine's
core count bounds the worker figures: on 2 cores, 4 workers mostly add contention.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from durable_turns import (
    Agent,
    ModelReply,
    ModelRequest,
    PostgresStore,
    Runtime,
    SessionKey,
    SqliteStore,
    ToolCall,
    ToolContext,
    TurnEvent,
    scripted,
    tool,
)
from durable_turns.messages import Message
from durable_turns.models.scripted import calls_this_turn
from durable_turns.records import NewEntry
from durable_turns.scheduling import ClaimingScheduler
from durable_turns.stores import SessionStore

ROWS_DDL = "CREATE TABLE IF NOT EXISTS bench_rows (call_id TEXT, v TEXT)"


def _schema_dsn(dsn: str) -> str:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    return psycopg.conninfo.make_conninfo(dsn, options=f"-csearch_path={schema}")


def _agent(placeholder: str) -> Agent:
    @tool
    def write(v: str, ctx: ToolContext) -> str:
        """Write one row in the step's transaction."""
        ctx.store.unwrap().execute(
            f"INSERT INTO bench_rows (call_id, v) VALUES ({placeholder}, {placeholder})",
            (ctx.call_id, v))
        return "ok"

    return Agent("bench", "You write rows.", [write])


def _model(calls: int) -> Any:
    def reply(request: ModelRequest) -> ModelReply:
        i = calls_this_turn(request)
        if i < calls:
            return ModelReply("", [ToolCall(f"c{i}", "write", {"v": f"row {i}"})])
        return ModelReply("done")

    return scripted(reply)


async def _drive(store: SessionStore, placeholder: str, turns: int, calls: int) -> float:
    """µs per step, driving ``turns`` turns one at a time."""
    rt = Runtime([_agent(placeholder)], store, _model(calls))
    async with rt:
        store.unwrap().execute(ROWS_DDL)
        t0 = time.perf_counter()
        for i in range(turns):
            r = await rt.session("bench", f"s{i}").turn("go")
            assert r.status == "completed", r
        elapsed = time.perf_counter() - t0
    return elapsed / (turns * (2 * calls + 1)) * 1e6


def _floor(dsn: str, turns: int, calls: int) -> float:
    """µs per step of the raw psycopg floor (see the module docstring)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE sessions (sid BIGINT PRIMARY KEY, epoch BIGINT NOT NULL)")
        c.execute("CREATE TABLE log (sid BIGINT, seq BIGINT, step TEXT, memo TEXT, body TEXT, "
                  "events TEXT, PRIMARY KEY (sid, seq))")
        c.execute(ROWS_DDL)
        steps = turns * (2 * calls + 1)
        t0 = time.perf_counter()
        for sid in range(turns):
            c.execute("INSERT INTO sessions VALUES (%s, 1)", (sid,))
            for n in range(2 * calls + 1):
                body = json.dumps({"role": "assistant", "text": f"step {n}", "n": n})
                with c.transaction():
                    epoch = c.execute("SELECT epoch FROM sessions WHERE sid = %s FOR UPDATE",
                                      (sid,)).fetchone()
                    assert epoch is not None and epoch[0] == 1
                    if n % 2 == 1:
                        c.execute("INSERT INTO bench_rows VALUES (%s, %s)", (f"c{n}", "v"))
                    c.execute("INSERT INTO log VALUES (%s, %s, %s, %s, %s, %s)",
                              (sid, n + 1, f"s{n}", "{}", body, '[["e",{"@":0}]]'))
                    c.execute("SELECT pg_notify('bench', %s)", (f'["bench", "s{sid}", {n}]',))
        return (time.perf_counter() - t0) / steps * 1e6


class _Count:
    """An event sink counting the turns a worker completed."""

    def __init__(self) -> None:
        self.turns = 0

    def emit(self, event: TurnEvent) -> None:
        if event.type == "turn.completed":
            self.turns += 1


def _worker(dsn: str, calls: int, max_sessions: int, start: Any, done: Any,
            counts: Any) -> None:
    count = _Count()

    async def run() -> None:
        store = PostgresStore(dsn, lease_ttl=5.0)
        claims = ClaimingScheduler(poll_interval=0.02, max_sessions=max_sessions)
        rt = Runtime([_agent("%s")], store, _model(calls), count, scheduler=claims)
        async with rt:
            start.wait()
            working = asyncio.ensure_future(claims.run())
            while not done.is_set():
                await asyncio.sleep(0.02)
            working.cancel()
            await asyncio.gather(working, return_exceptions=True)
            await rt.idle()

    asyncio.run(run())
    counts.put(count.turns)


async def _throughput(base_dsn: str, workers: int, sessions: int, calls: int,
                      max_sessions: int) -> tuple[float, list[int]]:
    """Turns per second with ``workers`` worker processes, and the turns each drove."""
    dsn = _schema_dsn(base_dsn)
    store = PostgresStore(dsn)
    await store.open()
    try:
        store.unwrap().execute(ROWS_DDL)
        for i in range(sessions):
            await store.enqueue(SessionKey("bench", f"s{i}"),
                                NewEntry("t1", Message("user", "go", turn_id="t1")))
        ctx = multiprocessing.get_context("spawn")
        start, done, counts = ctx.Event(), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_worker,
                             args=(dsn, calls, max_sessions, start, done, counts))
                 for _ in range(workers)]
        for p in procs:
            p.start()
        await asyncio.sleep(1.0)  # let them import and connect (not measured)
        t0 = time.perf_counter()
        start.set()
        while await store.find_sessions("unfinished"):
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - t0
        done.set()
        shares = sorted((counts.get(timeout=60) for _ in procs), reverse=True)
        for p in procs:
            p.join(timeout=60)
        return sessions / elapsed, shares
    finally:
        await store.close()


def _failover_agent(stuck: bool, inside: Any = None) -> Agent:
    @tool
    async def ship(order: str) -> dict[str, Any]:
        """Ship an order (the first worker is killed in here)."""
        if stuck:
            inside.set()
            await asyncio.sleep(3600)
        return {"order": order, "shipped": True}

    return Agent("bench", "You ship orders.", [ship])


def _failover_model() -> Any:
    def reply(request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("", [ToolCall("c1", "ship", {"order": "42"})])
        return ModelReply("shipped")

    return scripted(reply)


def _stuck_worker(dsn: str, ttl: float, inside: Any) -> None:
    async def run() -> None:
        claims = ClaimingScheduler(poll_interval=0.02)
        rt = Runtime([_failover_agent(True, inside)], PostgresStore(dsn, lease_ttl=ttl),
                     _failover_model(), scheduler=claims)
        async with rt:
            await claims.run()

    asyncio.run(run())


async def _failover(base_dsn: str, ttl: float) -> float:
    """Seconds from a worker's SIGKILL to another worker finishing its turn."""
    dsn = _schema_dsn(base_dsn)
    key = SessionKey("bench", "failover")
    store = PostgresStore(dsn, lease_ttl=ttl)
    claims = ClaimingScheduler(poll_interval=0.05)
    rt = Runtime([_failover_agent(False)], store, _failover_model(), scheduler=claims)
    async with rt:
        await store.enqueue(key, NewEntry("t1", Message("user", "ship 42", turn_id="t1")))
        ctx = multiprocessing.get_context("spawn")
        inside = ctx.Event()
        proc = ctx.Process(target=_stuck_worker, args=(dsn, ttl, inside))
        proc.start()
        if not await asyncio.to_thread(inside.wait, 60):
            proc.kill()
            raise SystemExit("the first worker never reached its tool")
        assert proc.pid is not None
        t0 = time.perf_counter()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=60)
        working = asyncio.ensure_future(claims.run())
        try:
            result = await asyncio.wait_for(rt.session("bench", "failover").result("t1"), 120)
        finally:
            working.cancel()
            await asyncio.gather(working, return_exceptions=True)
        if result.status != "completed":
            raise SystemExit(f"the failed-over turn ended {result.status}")
        return time.perf_counter() - t0


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    steps: dict[str, list[float]] = {"sqlite": [], "postgres": [], "psycopg floor": []}
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            steps["sqlite"].append(await _drive(SqliteStore(Path(tmp) / "bench.sqlite"), "?",
                                                args.turns, args.calls))
        steps["postgres"].append(await _drive(PostgresStore(_schema_dsn(args.dsn)), "%s",
                                              args.turns, args.calls))
        steps["psycopg floor"].append(_floor(_schema_dsn(args.dsn), args.turns, args.calls))
    per_step = {k: round(statistics.median(v), 1) for k, v in steps.items()}
    throughput: dict[str, float] = {}
    shares: dict[str, list[int]] = {}
    for n in (1, 2, 4):
        runs = [await _throughput(args.dsn, n, args.sessions, args.calls, args.max_sessions)
                for _ in range(args.repeat)]
        throughput[str(n)] = round(statistics.median(r[0] for r in runs), 1)
        shares[str(n)] = runs[-1][1]
    failover = {str(ttl): round(statistics.median(
        [await _failover(args.dsn, ttl) for _ in range(args.repeat)]), 2)
        for ttl in args.failover_ttl}
    return {"cpus": os.cpu_count(), "calls": args.calls, "turns": args.turns,
            "sessions": args.sessions, "us_per_step": per_step, "turns_per_s": throughput,
            "turns_per_worker": shares, "max_sessions": args.max_sessions,
            "steps_per_turn": 2 * args.calls + 1, "failover_s": failover}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--dsn", default=os.environ.get("DURABLE_TURNS_TEST_PG"),
                   help="a PostgreSQL DSN (default: $DURABLE_TURNS_TEST_PG)")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--sessions", type=int, default=100)
    p.add_argument("--max-sessions", type=int, default=25,
                   help="sessions one worker drives at once (ClaimingScheduler(max_sessions=))")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--failover-ttl", type=float, nargs="+", default=[2.0, 5.0],
                   metavar="SECONDS", help="lease TTLs to measure failover with")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not args.dsn:
        sys.exit("bench/postgres.py needs --dsn or DURABLE_TURNS_TEST_PG (eval \"$(.ci/pg up)\")")
    if args.quick:
        args.turns, args.sessions, args.repeat = 4, 12, 1
    out = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['cpus']} CPUs; turns of {out['steps_per_turn']} steps "
          f"({out['calls']} local tool calls)")
    print("per step (µs, wall):")
    for k, v in out["us_per_step"].items():
        print(f"  {k:<14} {v:>8.1f}")
    print(f"throughput over {out['sessions']} sessions (turns/s, steps/s):")
    for k, v in out["turns_per_s"].items():
        print(f"  {k} worker(s)    {v:>6.1f}  {v * out['steps_per_turn']:>8.1f}"
              f"   turns per worker: {out['turns_per_worker'][k]}")
    print("failover after a SIGKILL (s, from the kill to the turn's end):")
    for k, v in out["failover_s"].items():
        print(f"  lease_ttl {k:>5} s   {v:>6.2f}")


if __name__ == "__main__":
    main()
