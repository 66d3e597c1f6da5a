"""The Slack channel's ack and reply latency, against the tests' fake Web API.

Usage (from the repository root, with the ``slack`` extra installed)::

    python bench/slack.py              # 50 mentions
    python bench/slack.py -n 200 --json

One process: the fake Slack Web API (``tests/fakes/slack_api.py``) and the app
(``create_app(runtime, channels=[slack])`` on a fresh ``SqliteStore``, a scripted model that
answers at once) each on uvicorn on loopback, in one event loop. The bench posts N signed
``app_mention`` events, one after another, each in its own thread, and measures:

- **ack**: the signed POST to its 200 (Slack resends after 3 s; the turn is stored first);
- **first chunk**: from the ack to ``chat.startStream`` arriving at the fake;
- **reply done**: from the ack to ``chat.stopStream`` arriving at the fake.

Every reply is checked to be whole (the model's text) and started once.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

# The tests' fake Slack Web API and their loopback server (tests/ is not a package here).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
serving = importlib.import_module("fakes.serving").serving
slack_api = importlib.import_module("fakes.slack_api")
BOT_USER, SECRET, TOKEN = slack_api.BOT_USER, slack_api.SECRET, slack_api.TOKEN
SlackFake, event_callback, signed = (slack_api.SlackFake, slack_api.event_callback,
                                     slack_api.signed)

WAIT = 60.0


async def run(n: int) -> dict[str, Any]:
    from durable_turns import Agent, ModelReply, Runtime, SqliteStore, scripted
    from durable_turns.channels.slack import slack_channel
    from durable_turns.server import create_app

    fake = SlackFake()
    acks: list[float] = []
    first: list[float] = []
    done: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with serving(fake.app) as fake_url:
            fake.base = fake_url
            agent = Agent("bench", "You answer.")
            runtime = Runtime([agent], SqliteStore(Path(tmp) / "bench.db"),
                              scripted([ModelReply("Hello from the bench.")]))
            slack = slack_channel(signing_secret=SECRET, bot_token=TOKEN,
                                  base_url=f"{fake_url}/api/")
            app = create_app(runtime, channels=[slack])
            async with runtime, serving(app) as url, httpx.AsyncClient(timeout=WAIT) as http:
                for i in range(n):
                    ts = f"{1000 + i}.000001"
                    raw, headers = signed(event_callback(f"<@{BOT_USER}> hi {i}", ts=ts))
                    mark = len(fake.calls)
                    t0 = time.perf_counter()
                    r = await http.post(f"{url}/slack/events", content=raw, headers=headers)
                    acked = time.perf_counter()
                    assert r.status_code == 200, r.text
                    acks.append(acked - t0)
                    await fake.wait(lambda mark=mark: any(
                        m == "chat.stopStream" for m, _ in fake.calls[mark:]), "the reply")
                    at = {m: fake.call_times[mark + j]
                          for j, (m, _b) in enumerate(fake.calls[mark:])}
                    first.append(at["chat.startStream"] - acked)
                    done.append(at["chat.stopStream"] - acked)
                await asyncio.wait_for(slack.idle(), WAIT)
            starts = [b for m, b in fake.calls if m == "chat.startStream"]
            assert len(starts) == n, "a mention was answered twice or not at all"
            for msg in fake.messages.values():
                assert msg.text == "Hello from the bench.", msg.text
    return {"mentions": n, "ack_ms": _stats(acks), "first_chunk_ms": _stats(first),
            "reply_done_ms": _stats(done)}


def _stats(xs: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in xs)
    return {"median": round(statistics.median(ms), 2),
            "p95": round(ms[min(len(ms) - 1, int(len(ms) * 0.95))], 2),
            "max": round(ms[-1], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=50, help="mentions (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = asyncio.run(run(args.n))
    if args.json:
        print(json.dumps(out))
        return
    print(f"{out['mentions']} mentions, one at a time (ms: median / p95 / max)")
    for name in ("ack_ms", "first_chunk_ms", "reply_done_ms"):
        s = out[name]
        print(f"  {name[:-3]:<12} {s['median']:>8} {s['p95']:>8} {s['max']:>8}")


if __name__ == "__main__":
    main()
