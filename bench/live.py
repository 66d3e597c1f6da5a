"""Live text across processes on PostgreSQL: how late a worker's text reaches a server's SSE
clients, and what carrying it costs the database.

Usage (from the repository root, with the package installed; PostgreSQL's server binaries on
the machine: the bench makes a throwaway cluster of its own, ``durable_turns.testing.
pgcluster``, so that the database's CPU is its alone)::

    python bench/live.py                 # 1 and 100 streaming turns (about a minute)
    python bench/live.py --turns 1 10    # other counts
    python bench/live.py --json          # the same figures, machine-readable

Processes: a server that drives nothing (``Runtime(scheduler=NoDriveScheduler())`` served by
uvicorn, as ``durable-turns serve --no-drive``), one worker (a ``ClaimingScheduler``), and this
process, whose SSE clients (raw sockets, one per turn: ``GET …/events?after=0&until=turn``)
follow the turns.
Each turn's model streams ``--pieces`` (40) pieces of text, ``--every`` (20 ms) apart, about
what a fast model streams. ``--turns`` turns start together, each on its own session, in as
many rounds as make ``--frames`` (600) pieces in all (15 rounds of 1 turn, 1 of 100).

- **Latency**: from the moment the worker's model yielded a piece (the delta's ``at``: the
  first piece of the text it carries, when the relay merged several) to the moment the
  client read it, on one clock (one machine). It includes the relay's gathering window
  (5 ms), the ``NOTIFY`` round trip, the server's listener, its feed and its SSE pacing (live
  text waits up to 20 ms for company).
- **Database CPU**: the cluster's processes' CPU time (``/proc/PID/schedstat``: the
  postmaster and every backend) over the run, with the relay on, less the same run with it off
  (``PostgresStore(live=False)``), divided by the frames sent (counted by a connection of
  this process listening on the live channel, which itself costs the database a delivery
  per frame). Medians of ``--repeat`` (3) runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
from rawsse import RawSse

from durable_turns import Agent, PostgresStore, Runtime, Stop, TextDelta
from durable_turns.model import ModelRequest
from durable_turns.scheduling import ClaimingScheduler, NoDriveScheduler
from durable_turns.stores._postgres_listen import LIVE_CHANNEL
from durable_turns.testing.pgcluster import Cluster

AGENT = "bench"
WAIT = 120.0


class Streamer:
    """A model that streams ``pieces`` pieces of text, ``every`` seconds apart."""

    def __init__(self, pieces: int, every: float) -> None:
        self.pieces = pieces
        self.every = every

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        for i in range(self.pieces):
            await asyncio.sleep(self.every)
            yield TextDelta(f"word{i} ")
        yield Stop("end_turn")


def _agent() -> Agent:
    return Agent(AGENT, "You stream.")


# -- the roles: a server, a worker -----------------------------------------------------------

async def _serve(dsn: str, port: int) -> None:
    from durable_turns.server.run import serve

    rt = Runtime([_agent()], PostgresStore(dsn), scheduler=NoDriveScheduler())
    await serve(rt, port=port, on_ready=lambda _url: print("ready", flush=True))


async def _work(dsn: str, live: bool, pieces: int, every: float) -> None:
    store = PostgresStore(dsn, lease_ttl=5.0, live=live)
    claims = ClaimingScheduler(poll_interval=0.05, max_sessions=1000)
    async with Runtime([_agent()], store, Streamer(pieces, every), scheduler=claims):
        print("ready", flush=True)
        await claims.run()


# -- the clients -----------------------------------------------------------------------------

class Watcher(RawSse):
    """A raw SSE client: the receipt time of every delta, with the time it was made."""

    def __init__(self, request: bytes) -> None:
        super().__init__(request)
        self.lags: list[float] = []
        self.kind = b""

    def line(self, line: bytes, now: float) -> None:
        if line.startswith(b"event: "):
            self.kind = line[7:].strip()
        elif line.startswith(b"data: ") and self.kind == b"message.delta":
            self.lags.append(now - json.loads(line[6:])["at"])


def _cpu(cluster: Cluster) -> float:
    """CPU seconds of the cluster's postmaster and its children (its backends), from
    ``/proc/PID/schedstat`` (nanoseconds on a CPU: the clock ticks of ``/proc/PID/stat`` are
    10 ms, too coarse for a run's few hundred milliseconds)."""
    pid = int((cluster.root / "data" / "postmaster.pid").read_text().split()[0])
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(entry) == pid or int(fields[1]) == pid:
                total += int(Path(f"/proc/{entry}/schedstat").read_text().split()[0])
        except OSError:
            continue
    return total / 1e9


def _spawn(*args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if line.strip() != "ready":
        p.kill()
        raise RuntimeError(f"{args[0]} did not start: {line!r}")
    return p


async def _round(port: int, front: Runtime, run: str, turns: int
                 ) -> list[Watcher]:
    """``turns`` turns at once, each followed by a client; returns the clients once every
    turn ended."""
    loop = asyncio.get_running_loop()
    watchers = []
    for i in range(turns):
        path = f"/agents/{AGENT}/sessions/{run}-{i}/events?after=0&until=turn"
        w = Watcher(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                    .encode())
        await loop.create_connection(lambda w=w: w, "127.0.0.1", port)  # type: ignore[misc]
        watchers.append(w)
    async with asyncio.timeout(WAIT):
        for w in watchers:
            await w.connected.wait()
        for i in range(turns):
            await front.session(AGENT, f"{run}-{i}").start("go", turn_id="t")
        await asyncio.gather(*(w.done for w in watchers))
    return watchers


async def run_once(cluster: Cluster, turns: int, live: bool, a: argparse.Namespace
                   ) -> dict[str, Any]:
    """One measurement: ``rounds`` rounds of ``turns`` turns at once (enough text, in all,
    for the database's CPU to be measured in its clock ticks)."""
    schema = f"live_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(cluster.dsn, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    dsn = psycopg.conninfo.make_conninfo(cluster.dsn, options=f"-csearch_path={schema}")
    port = _free_port()
    server = _spawn("--role", "server", dsn, str(port))
    worker = _spawn("--role", "worker", dsn, str(int(live)), str(a.pieces), str(a.every))
    counter = await psycopg.AsyncConnection.connect(cluster.dsn, autocommit=True)
    front = Runtime([_agent()], PostgresStore(dsn), scheduler=NoDriveScheduler())
    rounds = max(1, math.ceil(a.frames / (turns * a.pieces)))
    watchers: list[Watcher] = []
    frames = 0

    async def count() -> None:
        nonlocal frames
        async for _n in counter.notifies():
            frames += 1

    try:
        await counter.execute(f"LISTEN {LIVE_CHANNEL}")
        async with front:
            await _round(port, front, "warm", 1)
            counting = asyncio.create_task(count())
            cpu = _cpu(cluster)
            start = time.monotonic()
            for r in range(rounds):
                watchers += await _round(port, front, f"r{r}", turns)
            took = time.monotonic() - start
            cpu = _cpu(cluster) - cpu
            counting.cancel()
    finally:
        await counter.close()
        for p in (server, worker):
            p.terminate()
            p.wait(WAIT)
    lags = sorted(x for w in watchers for x in w.lags)
    return {"turns": turns, "rounds": rounds, "live": live, "deltas": len(lags),
            "frames": frames, "db_cpu_s": cpu, "seconds": took,
            "p50_ms": 1000 * lags[len(lags) // 2] if lags else None,
            "p99_ms": 1000 * lags[int(len(lags) * 0.99)] if lags else None,
            "max_ms": 1000 * lags[-1] if lags else None}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def bench(a: argparse.Namespace) -> list[dict[str, Any]]:
    cluster = Cluster.create()
    out = []
    try:
        for turns in a.turns:
            on = [await run_once(cluster, turns, True, a) for _ in range(a.repeat)]
            off = [await run_once(cluster, turns, False, a) for _ in range(a.repeat)]
            frames = statistics.median(r["frames"] for r in on)
            extra = statistics.median(r["db_cpu_s"] for r in on) - \
                statistics.median(r["db_cpu_s"] for r in off)
            out.append({
                "turns": turns,
                "rounds": on[0]["rounds"],
                "deltas_per_run": statistics.median(r["deltas"] for r in on),
                "frames_per_run": frames,
                "latency_p50_ms": statistics.median(r["p50_ms"] for r in on),
                "latency_p99_ms": statistics.median(r["p99_ms"] for r in on),
                "latency_max_ms": max(r["max_ms"] for r in on),
                "db_cpu_s_on": statistics.median(r["db_cpu_s"] for r in on),
                "db_cpu_s_off": statistics.median(r["db_cpu_s"] for r in off),
                "seconds_per_run": statistics.median(r["seconds"] for r in on),
                "db_cpu_us_per_frame": 1e6 * extra / frames if frames else None,
                "deltas_off": statistics.median(r["deltas"] for r in off),
            })
    finally:
        cluster.destroy()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--turns", type=int, nargs="+", default=[1, 100])
    p.add_argument("--pieces", type=int, default=40)
    p.add_argument("--every", type=float, default=0.02)
    p.add_argument("--frames", type=int, default=600,
                   help="pieces of text per measurement, at least (rounds of --turns turns)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.role:
        role, dsn, *rest = a.role
        if role == "server":
            asyncio.run(_serve(dsn, int(rest[0])))
        else:
            asyncio.run(_work(dsn, rest[0] == "1", int(rest[1]), float(rest[2])))
        return
    results = asyncio.run(bench(a))
    if a.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'turns':>5} {'deltas':>7} {'frames':>7} {'p50':>8} {'p99':>8} {'max':>8} "
          f"{'db cpu on/off':>15} {'per frame':>10}")
    for r in results:
        per = r["db_cpu_us_per_frame"]
        print(f"{r['turns']:>5} {r['deltas_per_run']:>7.0f} {r['frames_per_run']:>7.0f} "
              f"{r['latency_p50_ms']:>6.1f}ms {r['latency_p99_ms']:>6.1f}ms "
              f"{r['latency_max_ms']:>6.1f}ms {r['db_cpu_s_on']:>6.2f}/{r['db_cpu_s_off']:<6.2f}s "
              f"{'-' if per is None else f'{per:.0f} µs':>10}")


if __name__ == "__main__":
    main()
