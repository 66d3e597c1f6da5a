"""A database outage under a split deployment: how fast requests fail while PostgreSQL is
away, and how long after it returns the system works again.

Usage (from the repository root, with the package installed; PostgreSQL's server binaries on
the machine: the bench stops and starts a throwaway cluster of its own,
``durable_turns.testing.pgcluster``)::

    python bench/outage.py               # outages of 1 and 10 s, 3 of each (about a minute)
    python bench/outage.py --json        # the same figures, machine-readable

Processes, as users run them: ``durable-turns serve --no-drive`` and one ``durable-turns
worker`` (``--lease-ttl 5 --poll-interval 0.5``: the defaults but the TTL), on an app whose
tool ``hold`` waits until the bench says go. Each cycle:

1. a normal turn, timed (``POST …/chat`` to its answer): the baseline;
2. a turn is started and held in its tool; the database stops (``pg_ctl stop -m fast``) and
   the tool is let go, so its step cannot commit;
3. while it is away, ``POST …/chat`` (with an ``Idempotency-Key``), ``GET …/sessions`` and
   ``GET …/events`` are timed to their answer (a 503, or nothing: a hang);
4. after ``--outage`` seconds it starts again (``pg_ctl start``, waiting until it takes
   connections); then timed from there: a new turn's ``POST …/chat`` answered (the first
   request after the restart, asked once: its status is reported), and the held turn's end
   (read from the store).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from durable_turns.testing.pgcluster import Cluster

WAIT = 120.0
SHIP = """
import asyncio, os, pathlib, time
from durable_turns import ToolContext, tool

GO = pathlib.Path(os.environ["OUTAGE_GO"])

@tool
async def hold(order: str, ctx: ToolContext) -> dict:
    \"\"\"Hold until the bench says go (a file), then ship.\"\"\"
    if order == "held":
        GO.with_name("inside").touch()
        deadline = time.monotonic() + 120
        while not GO.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    return {"shipped": order}
"""
AGENT = """
from durable_turns import ModelReply, ToolCall, scripted
from durable_turns.models.scripted import calls_this_turn

def reply(request):
    if calls_this_turn(request) == 0:
        order = request.messages[-1].text
        return ModelReply("Shipping.", [ToolCall("c1", "hold", {"order": order})])
    return ModelReply("Shipped.")

model = scripted(reply)
"""


def _app(root: Path) -> Path:
    app = root / "ops"
    (app / "tools").mkdir(parents=True)
    (app / "instructions.md").write_text("You ship.")
    (app / "agent.py").write_text(AGENT)
    (app / "tools" / "hold.py").write_text(SHIP)
    return app


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _timed(request: Any) -> tuple[float, int | str]:
    start = time.monotonic()
    try:
        r = await request
        return time.monotonic() - start, r.status_code
    except httpx.HTTPError as e:
        return time.monotonic() - start, type(e).__name__


async def _turn_end(dsn: str, session: str) -> None:
    """Until the store says the session's turn completed."""
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=2) as c:
                row = c.execute("SELECT t.status FROM turns t JOIN sessions s USING (sid) "
                                "WHERE s.session = %s", (session,)).fetchone()
            if row is not None and row[0] == "completed":
                return
        except psycopg.OperationalError:
            pass
        await asyncio.sleep(0.02)


async def cycle(cluster: Cluster, url: str, go: Path, outage: float) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    base = f"{url}/agents/ops/sessions"
    async with httpx.AsyncClient(timeout=WAIT) as c:
        start = time.monotonic()
        r = await c.post(f"{base}/{run}-base/chat", json={"text": "now"})
        baseline = time.monotonic() - start
        assert r.status_code == 200, r.text
        go.unlink(missing_ok=True)
        inside = go.with_name("inside")
        inside.unlink(missing_ok=True)
        async with c.stream("POST", f"{base}/{run}-held/turn", json={"text": "held"},
                            headers={"Idempotency-Key": f"{run}-held"}) as held:
            assert held.status_code == 200  # accepted; the turn goes on without this client
        async with asyncio.timeout(WAIT):
            while not inside.exists():
                await asyncio.sleep(0.01)
        cluster.stop()
        go.touch()
        down = await asyncio.gather(
            _timed(c.post(f"{base}/{run}-down/chat", json={"text": "now"},
                          headers={"Idempotency-Key": f"{run}-down"})),
            _timed(c.get(base)),
            _timed(c.get(f"{base}/{run}-base/events", params={"after": "0"})))
        await asyncio.sleep(max(0.0, outage - max(t for t, _s in down)))  # the outage's length
        cluster.start()
        back = time.monotonic()
        first = await _timed(c.post(f"{base}/{run}-after/chat", json={"text": "now"},
                                    headers={"Idempotency-Key": f"{run}-after"}))
        await asyncio.wait_for(_turn_end(cluster.dsn, f"{run}-held"), WAIT)
        held_done = time.monotonic() - back
    return {"outage_s": outage, "baseline_s": baseline,
            "down": [{"seconds": t, "status": s} for t, s in down],
            "first_after_s": first[0], "first_after_status": first[1],
            "held_done_s": held_done}


async def bench(a: argparse.Namespace) -> list[dict[str, Any]]:
    cluster = Cluster.create()
    root = Path(tempfile.mkdtemp(prefix="outage-bench-"))
    go = root / "go"
    port = _port()
    env = {**os.environ, "OUTAGE_GO": str(go)}
    cli = [sys.executable, "-m", "durable_turns.cli"]
    app = _app(root)
    procs = [subprocess.Popen([*cli, "serve", str(app), "--store", cluster.dsn, "--no-drive",
                               "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL),
             subprocess.Popen([*cli, "worker", str(app), "--store", cluster.dsn,
                               "--lease-ttl", "5"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    url = f"http://127.0.0.1:{port}"
    out = []
    try:
        async with httpx.AsyncClient(timeout=WAIT) as c:
            async with asyncio.timeout(WAIT):
                while True:
                    try:
                        if (await c.get(f"{url}/agents")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await asyncio.sleep(0.05)
        for outage in a.outage:
            for _ in range(a.repeat):
                out.append(await cycle(cluster, url, go, outage))
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(WAIT)
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.destroy()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--outage", type=float, nargs="+", default=[1.0, 10.0],
                   help="seconds the database stays away")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    results = asyncio.run(bench(a))
    if a.json:
        print(json.dumps(results, indent=2))
        return
    print("outage  baseline  while away (chat, sessions, events)        first after  "
          "held turn done")
    for r in results:
        down = ", ".join(f"{d['status']} in {1000 * d['seconds']:.0f} ms" for d in r["down"])
        print(f"{r['outage_s']:>5.0f}s  {1000 * r['baseline_s']:>6.0f}ms  {down:<42} "
              f"{r['first_after_status']} in {1000 * r['first_after_s']:>5.0f} ms  "
              f"{r['held_done_s']:>6.2f} s")
    for outage in a.outage:
        rs = [r for r in results if r["outage_s"] == outage]
        print(f"median, {outage:g} s away: first request after "
              f"{1000 * statistics.median(r['first_after_s'] for r in rs):.0f} ms, held turn "
              f"done {statistics.median(r['held_done_s'] for r in rs):.2f} s after the restart")


if __name__ == "__main__":
    main()
