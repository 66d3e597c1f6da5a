"""One turn watched over SSE by 1, 100 and 1,000 subscribers: latency and the server's CPU.

Usage (from the repository root, with the ``server`` extra installed)::

    python bench/sse.py                 # 1, 100 and 1000 subscribers
    python bench/sse.py -n 1 -n 10      # any counts
    python bench/sse.py --json          # the same figures, machine-readable

The server is ``durable_turns.server`` under uvicorn in a child process, on a fresh
``SqliteStore``, with a scripted model whose turn makes ``--calls`` (20) sequential tool
calls, each reply paced by ``--pace`` (20 ms) so the turn lasts long enough to be watched
live. The child's event sink writes the wall-clock time at which each durable event was
published (right after its commit). The bench process opens N ``GET …/events?until=turn``
streams (httpx, one event loop), waits until every one is subscribed (its response headers
arrived), then starts the turn with ``POST …/chat`` and reads every stream to the turn's end.

- **commit → client latency**: for every durable event and every subscriber, receipt time
  minus publish time (same machine, same clock). The client is one Python process parsing
  every stream, so at 1,000 subscribers this includes the client's own queueing.
- **server CPU per event**: the child's user + system CPU (``/proc/PID/stat``) from the
  moment the turn starts until the last subscriber has its end, divided by the events
  delivered (durable events times subscribers), and by the turn's durable events.

Every subscriber is checked to receive exactly the turn's durable events, in order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

AGENT, SESSION = "watched", "s1"
WAIT = 120.0


# -- the server (child process) ---------------------------------------------------------------


def serve(port: int, db: Path, times: Path, calls: int, pace: float) -> None:
    import uvicorn

    from durable_turns import Agent, ModelReply, Runtime, SqliteStore, ToolCall, scripted, tool
    from durable_turns.events import TurnEvent
    from durable_turns.models.scripted import calls_this_turn
    from durable_turns.server import create_app

    @tool
    def tick(n: int) -> dict[str, int]:
        """Count one."""
        return {"n": n}

    def reply(request: Any) -> ModelReply:
        i = calls_this_turn(request)
        if i < calls:
            return ModelReply(f"step {i}", [ToolCall(f"c{i}", "tick", {"n": i})])
        return ModelReply("done")

    out = times.open("a", buffering=1)

    class Stamp:
        def emit(self, event: TurnEvent) -> None:
            if event.type not in ("message.delta", "message.retry"):
                out.write(f"{event.seq} {time.time()}\n")

    rt = Runtime([Agent(AGENT, "", [tick])], SqliteStore(db, synchronous="OFF"),
                 scripted(reply, delay=pace / 3, chunks=3), sink=Stamp())
    uvicorn.run(create_app(rt), host="127.0.0.1", port=port, log_level="warning",
                lifespan="off")


# -- the bench --------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def watch(client: httpx.AsyncClient, after: int, subscribed: asyncio.Event,
                counter: list[int], n: int) -> list[tuple[int, float]]:
    got: list[tuple[int, float]] = []
    url = f"/agents/{AGENT}/sessions/{SESSION}/events"
    async with client.stream("GET", url, params={"after": str(after), "until": "turn"}) as r:
        counter[0] += 1
        if counter[0] == n:
            subscribed.set()
        async for line in r.aiter_lines():
            if line.startswith("id:"):
                got.append((int(line[3:]), time.time()))
    return got


async def run_one(base: str, pid: int, times: Path, n: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    async with httpx.AsyncClient(base_url=base, timeout=WAIT, limits=limits) as client:
        state = (await client.get(f"/agents/{AGENT}/sessions/{SESSION}")).json()
        after = 0
        if state.get("turns"):
            events = await client.get(f"/agents/{AGENT}/sessions/{SESSION}/events",
                                      params={"after": "0", "until": "turn"})
            after = max(int(x[3:]) for x in events.text.splitlines() if x.startswith("id:"))
        subscribed, counter = asyncio.Event(), [0]
        watchers = [asyncio.create_task(watch(client, after, subscribed, counter, n))
                    for _ in range(n)]
        await asyncio.wait_for(subscribed.wait(), WAIT)
        cpu0 = cpu_seconds(pid)
        done = await client.post(f"/agents/{AGENT}/sessions/{SESSION}/chat",
                                 json={"text": "count"})
        assert done.json()["status"] == "completed", done.text
        seen = await asyncio.wait_for(asyncio.gather(*watchers), WAIT)
        cpu = cpu_seconds(pid) - cpu0
    stamps = {int(s): float(t) for s, t in
              (line.split() for line in times.read_text().splitlines())}
    expected = sorted(s for s in stamps if s > after)
    lat = []
    for got in seen:
        assert [s for s, _ in got] == expected, "a subscriber missed or repeated an event"
        lat += [(t - stamps[s]) * 1000 for s, t in got]
    lat.sort()
    delivered = len(expected) * n
    return {"subscribers": n, "events": len(expected), "delivered": delivered,
            "latency_ms_p50": round(statistics.median(lat), 2),
            "latency_ms_p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2),
            "server_cpu_s": round(cpu, 3),
            "server_cpu_us_per_delivered_event": round(cpu / delivered * 1e6, 1),
            "server_cpu_ms_per_turn_event": round(cpu / len(expected) * 1e3, 2)}


async def bench(counts: list[int], calls: int, pace: float) -> list[dict[str, Any]]:
    """One fresh server (and store) per count, so no run inherits another's connections."""
    return [await bench_one(n, calls, pace) for n in counts]


async def bench_one(n: int, calls: int, pace: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db, times = Path(tmp) / "sse.sqlite", Path(tmp) / "times"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        child = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(db),
                                  str(times), "--calls", str(calls), "--pace", str(pace)])
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + WAIT
            while True:  # a bounded wait for the child to listen
                try:
                    httpx.get(f"{base}/openapi.json", timeout=1).raise_for_status()
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and child.poll() is None
                    await asyncio.sleep(0.05)
            return await run_one(base, child.pid, times, n)
        finally:
            child.terminate()
            child.wait(WAIT)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("-n", type=int, action="append", dest="counts",
                   help="subscribers (repeat; default 1, 100, 1000)")
    p.add_argument("--calls", type=int, default=20, help="tool calls in the turn")
    p.add_argument("--pace", type=float, default=0.02, help="seconds per model reply")
    p.add_argument("--json", action="store_true")
    p.add_argument("--serve", nargs=3, metavar=("PORT", "DB", "TIMES"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(int(a.serve[0]), Path(a.serve[1]), Path(a.serve[2]), a.calls, a.pace)
        return
    rows = asyncio.run(bench(a.counts or [1, 100, 1000], a.calls, a.pace))
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'subscribers':>11} {'events':>6} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'CPU µs/delivered':>16} {'CPU ms/turn event':>17}")
    for r in rows:
        print(f"{r['subscribers']:>11} {r['events']:>6} {r['latency_ms_p50']:>8} "
              f"{r['latency_ms_p99']:>8} {r['server_cpu_us_per_delivered_event']:>16} "
              f"{r['server_cpu_ms_per_turn_event']:>17}")


if __name__ == "__main__":
    main()
