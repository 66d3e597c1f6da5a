"""What the web console's reads cost the server, as a session and a store grow.

Usage (from the repository root, with the package installed)::

    python bench/console.py           # about half a minute
    python bench/console.py --quick   # smaller sizes, for a smoke check
    python bench/console.py --json    # the same figures, machine-readable

The console's session page fetches ``GET …/{session}/timeline`` once when it opens and again
after each burst of stored events; the sessions page fetches ``GET /agents/{agent}/sessions``
(with each session's ``last_activity``) every 5 s. Both read from the store on every call:
the timeline reads all of the session's events, chain and live transcript, the list reads each
session's chain and its latest turn's events. So this measures, on a SqliteStore in a temporary
directory, through the ASGI app (routing, the store reads, the fold, the JSON encoding; no
socket):

* the timeline of one session of ``T`` turns (each turn a model call, one tool call and the
  answer: 5 stored events, 4 messages): median milliseconds per call, and the response's size,
  whole and with ``?last=20`` (the console's request: the newest 20 turns);
* the sessions list of an agent with ``S`` sessions of one such turn each: median milliseconds.

Figures are the median of ``--repeat`` calls after one warm-up call.
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

import httpx

from durable_turns import Agent, ModelReply, Runtime, SqliteStore, ToolCall, scripted, tool
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app


@tool
def look(q: str) -> dict[str, Any]:
    """Look something up."""
    return {"found": q.upper()}


def reply(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("Looking.", [ToolCall("c1", "look", {"q": "x"})])
    return ModelReply("Found it.")


async def timed(client: httpx.AsyncClient, path: str, repeat: int) -> tuple[float, int]:
    size = len((await client.get(path)).content)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = await client.get(path)
        times.append(time.perf_counter() - start)
        assert response.status_code == 200, response.text
    return statistics.median(times) * 1000, size


async def measure(turns: list[int], sessions: list[int], repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {"timeline": [], "sessions": []}
    with tempfile.TemporaryDirectory() as tmp:
        rt = Runtime([Agent("desk", "", [look])], SqliteStore(Path(tmp) / "bench.db"),
                     scripted(reply))
        async with rt:
            transport = httpx.ASGITransport(app=create_app(rt))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                         timeout=60) as client:
                done = 0
                s = rt.session("desk", "long")
                for t in turns:
                    while done < t:
                        await s.turn(f"turn {done}")
                        done += 1
                    path = "/agents/desk/sessions/long/timeline"
                    ms, size = await timed(client, path, repeat)
                    tail_ms, tail_size = await timed(client, f"{path}?last=20", repeat)
                    out["timeline"].append({"turns": t, "ms": round(ms, 2), "bytes": size,
                                            "last20_ms": round(tail_ms, 2),
                                            "last20_bytes": tail_size})
                made = 1  # the long session is one of them
                for n in sessions:
                    while made < n:
                        await rt.session("desk", f"s{made}").turn("hello")
                        made += 1
                    ms, _ = await timed(client, "/agents/desk/sessions", repeat)
                    out["sessions"].append({"sessions": n, "ms": round(ms, 2)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    turns = [10, 50] if args.quick else [10, 100, 500]
    sessions = [10, 50] if args.quick else [10, 100, 300]
    figures = asyncio.run(measure(turns, sessions, 5 if args.quick else args.repeat))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print("GET …/timeline of one session (SqliteStore, in-process ASGI)")
    for row in figures["timeline"]:
        print(f"  {row['turns']:>5} turns: {row['ms']:>8.2f} ms  {row['bytes']:>9,} bytes"
              f"   ?last=20 (what the console asks): {row['last20_ms']:>7.2f} ms "
              f"{row['last20_bytes']:>8,} bytes")
    print("GET /agents/{agent}/sessions with last_activity")
    for row in figures["sessions"]:
        print(f"  {row['sessions']:>5} sessions: {row['ms']:>8.2f} ms")


if __name__ == "__main__":
    main()
