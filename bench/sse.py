"""One turn watched over SSE by 1, 100 and 1,000 subscribers: latency and the server's CPU.

Usage (from the repository root, with the ``server`` extra installed)::

    python bench/sse.py                      # 1, 100 and 1000 subscribers
    python bench/sse.py -n 1 -n 10           # any counts
    python bench/sse.py -n 1000 --repeat 5   # five runs (a fresh server each)
    python bench/sse.py --http h11 --loop asyncio   # uvicorn without httptools/uvloop
    python bench/sse.py -n 1000 --profile /tmp/sse.prof   # cProfile of the server
    python bench/sse.py --floor -n 1000      # the cost of bare socket writes, for scale
    python bench/sse.py --json               # the same figures, machine-readable

Three kinds of process, so that each one's CPU is its own:

- **the server**: ``durable_turns.server`` under uvicorn (``--http``/``--loop``: ``auto``
  takes httptools and uvloop when installed, and the output names what ran) on a fresh
  ``SqliteStore``, with a scripted
  model whose turn makes ``--calls`` (20) sequential tool calls, each reply paced by
  ``--pace`` (20 ms) and streamed as 3 text deltas, so the turn lasts long enough to be
  watched live. Its event sink writes the wall-clock time at which each event was
  published (a durable one right after its commit).
- **the watchers**: ``--clients`` processes (default: one per 500 subscribers) that open
  the N ``GET …/events?until=turn`` streams over raw sockets (no HTTP library: they read
  bytes and note when each ``id:`` line arrives), so the client's own parsing does not
  queue in front of the figure.
- **the bench**: waits until every stream is subscribed (its response headers arrived),
  starts the turn with ``POST …/chat`` and collects the watchers' receipts.

- **commit → client latency**: for every durable event and every subscriber, receipt time
  minus publish time (same machine, same clock). On a 2-core machine the watchers still
  share the CPU with the server; their share is small but not zero. Per event, the wait
  until its first subscriber had it (``1st ms``, median) and from the first to the last
  (``pass ms``, median: the server's pass over every client's socket) say where it goes.
- **live text latency** (``text``): the k-th ``message.delta`` a subscriber reads against
  the k-th one published (they carry no id; the stream is in order).
- **server CPU per event**: the server's user + system CPU (``/proc/PID/stat``) from the
  moment the turn starts until the last subscriber has its end, divided by the events
  delivered (durable events times subscribers), and by the turn's durable events.

Every subscriber is checked to receive exactly the turn's durable events, in order. The
load average before and after each run is printed: the machine's other work moves these
figures more than anything else.

``--floor`` measures no HTTP at all: one process writes one SSE-sized frame to each of N
connected sockets with uvloop's ``transport.write`` (the call uvicorn makes), the readers in
two other processes, so that a pass's time can be set against the bare writes it is made of.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
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
from rawsse import RawSse

AGENT, SESSION = "watched", "s1"
WAIT = 180.0
PER_CLIENT = 500


# -- the server (child process) ---------------------------------------------------------------


def serve(port: int, db: Path, times: Path, calls: int, pace: float, http: str, loop: str,
          profile: str | None) -> None:
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
            if event.type == "message.delta":
                out.write(f"d {time.time()}\n")
            elif event.type != "message.retry":
                out.write(f"{event.seq} {time.time()}\n")

    rt = Runtime([Agent(AGENT, "", [tick])], SqliteStore(db, synchronous="OFF"),
                 scripted(reply, delay=pace / 3, chunks=3), sink=Stamp())
    config = uvicorn.Config(create_app(rt), host="127.0.0.1", port=port, log_level="warning",
                            lifespan="on", http=http, loop=loop,
                            backlog=4096)
    if profile is None:
        uvicorn.Server(config).run()
        return
    import cProfile
    import signal

    # uvicorn re-raises the SIGTERM it caught once it has shut down: take it, to write
    # the profile.
    signal.signal(signal.SIGTERM, lambda _s, _f: None)
    prof = cProfile.Profile()
    prof.enable()
    try:
        uvicorn.Server(config).run()
    finally:
        prof.disable()
        prof.dump_stats(profile)


# -- the watchers (child processes) -------------------------------------------------------------


class Watcher(RawSse):
    """One ``GET …/events`` stream (``rawsse``): notes when each ``id:`` line arrives."""

    def __init__(self, request: bytes, connected: asyncio.Event) -> None:
        super().__init__(request, connected)
        self.got: list[tuple[int, float]] = []
        self.deltas: list[float] = []

    def line(self, line: bytes, now: float) -> None:
        if line.startswith(b"id:"):
            self.got.append((int(line[3:]), now))
        elif line.startswith(b"event: message.delta"):
            self.deltas.append(now)


async def watchers(port: int, after: int, n: int) -> None:
    loop = asyncio.get_running_loop()
    path = f"/agents/{AGENT}/sessions/{SESSION}/events?after={after}&until=turn"
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    subscribed = [asyncio.Event() for _ in range(n)]
    made = [Watcher(request, ev) for ev in subscribed]
    for w in made:
        await loop.create_connection(lambda w=w: w, "127.0.0.1", port)  # type: ignore[misc]
    async with asyncio.timeout(WAIT):
        for ev in subscribed:
            await ev.wait()
    print("ready", flush=True)
    async with asyncio.timeout(WAIT):
        for w in made:
            await w.done
    # Encoding the receipts takes a watcher's CPU for a while: not before every watcher has
    # read the last event (the bench says when), or a watcher that is done first would
    # slow the reads of the others, and the turn's last events would look late.
    print("done", flush=True)
    sys.stdin.readline()
    print(json.dumps([[w.got, w.deltas] for w in made]), flush=True)


def run_watchers(port: int, after: int, n: int) -> None:
    # A watcher keeps every receipt (hundreds of thousands of objects by the turn's end):
    # the cyclic collector's full passes over them stalled its reads for 100 ms and more,
    # always near the end, and made the turn's last events look late. A watcher makes no
    # cycles to collect.
    gc.disable()
    run_async(watchers(port, after, n))


# -- the floor: bare socket writes ----------------------------------------------------------


async def readers(port: int, n: int) -> None:
    """``n`` connections that read whatever comes until the other end closes."""
    loop = asyncio.get_running_loop()
    ends: list[asyncio.Future[None]] = []

    class Reader(asyncio.Protocol):
        def __init__(self) -> None:
            self.end = loop.create_future()
            ends.append(self.end)

        def data_received(self, data: bytes) -> None:
            pass

        def connection_lost(self, exc: Exception | None) -> None:
            self.end.set_result(None)

    for _ in range(n):
        await loop.create_connection(Reader, "127.0.0.1", port)
    await asyncio.wait_for(asyncio.gather(*ends), WAIT)


async def floor(n: int, rounds: int = 20) -> dict[str, Any]:
    """One frame written to each of ``n`` sockets with ``transport.write``, ``rounds`` times."""
    loop = asyncio.get_running_loop()
    transports: list[Any] = []  # uvloop's transports are not asyncio.Transport subclasses
    all_in = loop.create_future()

    class Peer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transports.append(transport)
            if len(transports) == n and not all_in.done():
                all_in.set_result(None)

    server = await loop.create_server(Peer, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--read", str(port), str(k))
        for k in (n // 2, n - n // 2) if k]
    await asyncio.wait_for(all_in, WAIT)
    frame = b"id: 12\r\nevent: tool.completed\r\ndata: " + b"x" * 150 + b"\r\n\r\n"
    cpu, wall = [], []
    for _ in range(rounds):
        c0, t0 = time.thread_time(), time.perf_counter()
        for t in transports:
            t.write(frame)
        cpu.append((time.thread_time() - c0) / n * 1e6)
        wall.append((time.perf_counter() - t0) * 1e3)
        drained = loop.create_future()  # let the readers take it before the next round
        loop.call_later(0.05, drained.set_result, None)
        await drained
    for t in transports:
        t.close()
    for p in procs:
        await asyncio.wait_for(p.wait(), WAIT)
    server.close()
    return {"sockets": n, "cpu_us_per_write_p50": round(statistics.median(cpu), 1),
            "cpu_us_per_write_min": round(min(cpu), 1),
            "pass_ms_p50": round(statistics.median(wall), 1), "pass_ms_max": round(max(wall), 1),
            "load_1min": round(os.getloadavg()[0], 2)}


def run_async(main: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


# -- the bench --------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_one(base: str, port: int, pid: int, times: Path, n: int,
                  clients: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, timeout=WAIT) as client:
        state = (await client.get(f"/agents/{AGENT}/sessions/{SESSION}")).json()
        after = 0
        if state.get("turns"):
            events = await client.get(f"/agents/{AGENT}/sessions/{SESSION}/events",
                                      params={"after": "0", "until": "turn"})
            after = max(int(x[3:]) for x in events.text.splitlines() if x.startswith("id:"))
        shares = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--watch", str(port), str(after), str(k),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            for k in shares if k]
        for p in procs:
            assert p.stdout is not None
            line = await asyncio.wait_for(p.stdout.readline(), WAIT)
            assert line == b"ready\n", line
        cpu0 = cpu_seconds(pid)
        done = await client.post(f"/agents/{AGENT}/sessions/{SESSION}/chat",
                                 json={"text": "count"})
        assert done.json()["status"] == "completed", done.text
        for p in procs:  # every subscriber has its end
            assert p.stdout is not None
            line = await asyncio.wait_for(p.stdout.readline(), WAIT)
            assert line == b"done\n", line
        cpu = cpu_seconds(pid) - cpu0
        seen: list[list[tuple[int, float]]] = []
        deltas_seen: list[list[float]] = []
        for p in procs:
            out, _ = await asyncio.wait_for(p.communicate(b"go\n"), WAIT)
            assert p.returncode == 0
            for got, deltas in json.loads(out):
                seen.append(got)
                deltas_seen.append(deltas)
    marks = [line.split() for line in times.read_text().splitlines()]
    stamps = {int(s): float(t) for s, t in marks if s != "d"}
    # Live text has no id: the k-th delta a subscriber reads is the k-th one published
    # (one session, in order; a subscriber that was cut off would read fewer).
    published = [float(t) for s, t in marks if s == "d"]
    text = sorted((t - published[k]) * 1000 for got in deltas_seen
                  for k, t in enumerate(got[:len(published)]))
    expected = sorted(s for s in stamps if s > after)
    lat = []
    assert len(seen) == n
    for got in seen:
        assert [s for s, _ in got] == expected, "a subscriber missed or repeated an event"
        lat += [(t - stamps[s]) * 1000 for s, t in got]
    lat.sort()
    by_seq: dict[int, list[float]] = {}
    for got in seen:
        for s, t in got:
            by_seq.setdefault(s, []).append((t - stamps[s]) * 1000)
    worst = sorted(((max(v), s) for s, v in by_seq.items()), reverse=True)[:3]
    # Per event: when its first subscriber had it (the wait before the fan-out pass) and how
    # long the pass took to reach the last one (the cost of writing to every socket).
    first = [min(v) for v in by_seq.values()]
    spread = [max(v) - min(v) for v in by_seq.values()]
    delivered = len(expected) * n
    return {"subscribers": n, "events": len(expected), "delivered": delivered,
            "latency_ms_p50": round(statistics.median(lat), 2),
            "latency_ms_p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2),
            "latency_ms_max": round(lat[-1], 2),
            "slowest_events": [f"seq {s}: {m:.0f} ms" for m, s in worst],
            "first_subscriber_ms_p50": round(statistics.median(first), 2),
            "first_subscriber_ms_max": round(max(first), 2),
            "first_to_last_ms_p50": round(statistics.median(spread), 2),
            "first_to_last_ms_max": round(max(spread), 2),
            "text_deltas": len(published),
            "text_latency_ms_p50": round(statistics.median(text), 2) if text else None,
            "text_latency_ms_p99": (round(text[min(len(text) - 1, int(len(text) * 0.99))], 2)
                                    if text else None),
            "server_cpu_s": round(cpu, 3),
            "server_cpu_us_per_delivered_event": round(cpu / delivered * 1e6, 1),
            "server_cpu_ms_per_turn_event": round(cpu / len(expected) * 1e3, 2)}


async def bench_one(n: int, a: argparse.Namespace) -> dict[str, Any]:
    """One fresh server (and store) per count, so no run inherits another's connections."""
    with tempfile.TemporaryDirectory() as tmp:
        db, times = Path(tmp) / "sse.sqlite", Path(tmp) / "times"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = [sys.executable, __file__, "--serve", str(port), str(db), str(times),
                "--calls", str(a.calls), "--pace", str(a.pace), "--http", a.http,
                "--loop", a.loop]
        if a.profile:
            argv += ["--profile", a.profile]
        child = subprocess.Popen(argv)
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
            clients = a.clients or max(1, -(-n // PER_CLIENT))
            load = os.getloadavg()[0]
            row = await run_one(base, port, child.pid, times, n, clients)
            return {**row, "http": a.http, "loop": a.loop, "watcher_processes": clients,
                    "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)]}
        finally:
            child.terminate()
            child.wait(WAIT)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("-n", type=int, action="append", dest="counts",
                   help="subscribers (repeat; default 1, 100, 1000)")
    p.add_argument("--calls", type=int, default=20, help="tool calls in the turn")
    p.add_argument("--pace", type=float, default=0.02, help="seconds per model reply")
    p.add_argument("--clients", type=int, default=0,
                   help=f"watcher processes (default: one per {PER_CLIENT} subscribers)")
    p.add_argument("--http", default="auto", choices=["auto", "h11", "httptools"])
    p.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    p.add_argument("--profile", metavar="PATH", help="write the server's cProfile stats here")
    p.add_argument("--repeat", type=int, default=1, help="runs of each count")
    p.add_argument("--json", action="store_true")
    p.add_argument("--serve", nargs=3, metavar=("PORT", "DB", "TIMES"), help=argparse.SUPPRESS)
    p.add_argument("--watch", nargs=3, type=int, metavar=("PORT", "AFTER", "N"),
                   help=argparse.SUPPRESS)
    p.add_argument("--floor", action="store_true",
                   help="time bare socket writes to N sockets instead (no HTTP, for scale)")
    p.add_argument("--read", nargs=2, type=int, metavar=("PORT", "N"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(int(a.serve[0]), Path(a.serve[1]), Path(a.serve[2]), a.calls, a.pace, a.http,
              a.loop, a.profile)
        return
    if a.watch:
        run_watchers(*a.watch)
        return
    if a.read:
        run_async(readers(*a.read))
        return
    if a.floor:
        floors = [run_async(floor(n)) for n in a.counts or [1000] for _ in range(a.repeat)]
        if a.json:
            print(json.dumps(floors, indent=2))
            return
        print("bare transport.write of one frame to each socket (uvloop; readers in 2 processes)")
        print(f"{'sockets':>8} {'CPU µs/write p50':>16} {'min':>6} {'pass ms p50':>11} "
              f"{'max':>6} {'load':>5}")
        for f in floors:
            print(f"{f['sockets']:>8} {f['cpu_us_per_write_p50']:>16} "
                  f"{f['cpu_us_per_write_min']:>6} {f['pass_ms_p50']:>11} {f['pass_ms_max']:>6} "
                  f"{f['load_1min']:>5}")
        return
    # What uvicorn's "auto" would take, named, so that the figures say what they measured.
    if a.http == "auto":
        a.http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    if a.loop == "auto":
        a.loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    rows = [asyncio.run(bench_one(n, a)) for n in a.counts or [1, 100, 1000]
            for _ in range(a.repeat)]
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"server: uvicorn --http {a.http} --loop {a.loop}; watchers in their own processes")
    print(f"{'subscribers':>11} {'events':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
          f"{'1st ms':>6} {'pass ms':>7} {'text p50':>8} {'text p99':>8} "
          f"{'CPU µs/delivered':>16} {'load':>10}")
    for r in rows:
        load = "{:.1f}→{:.1f}".format(*r["load_1min"])
        print(f"{r['subscribers']:>11} {r['events']:>6} {r['latency_ms_p50']:>7} "
              f"{r['latency_ms_p99']:>7} {r['latency_ms_max']:>7} "
              f"{r['first_subscriber_ms_p50']:>6} {r['first_to_last_ms_p50']:>7} "
              f"{r['text_latency_ms_p50']!s:>8} {r['text_latency_ms_p99']!s:>8} "
              f"{r['server_cpu_us_per_delivered_event']:>16} "
              f"{load:>10}")


if __name__ == "__main__":
    main()
