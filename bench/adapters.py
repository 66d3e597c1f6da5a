"""How fast the model adapters let go of a stream: a stalled read, a closed stream, a cancel.

Usage (from the repository root, with the package installed with its ``dev`` extra)::

    python bench/adapters.py            # 20 runs of each figure (about 20 s)
    python bench/adapters.py --quick    # 3 runs, for a smoke check
    python bench/adapters.py --json     # the same figures, machine-readable

``tests/models/test_model_anthropic.py`` and ``tests/models/test_model_openai.py`` check *what*
happens (the read timeout ends a stall, closing a stream closes its HTTP response, cancelling a
turn closes the model's stream) with no bound on how long it takes, so they hold on a slow
machine. This script measures the times, against the same fake servers (``tests/fakes``, on
loopback uvicorn), for both adapters. Every stream streams a little text, then stalls until the
client goes away, so nothing but the client can end it:

- **stall**: the model has a read timeout of ``--read-timeout`` (0.3 s). ``overshoot`` is the
  time from the last delta received to the ``ModelError``, less that timeout;
  ``server sees it`` is from the ``ModelError`` to the fake's body being cancelled.
- **close**: from ``aclose()`` on a stream stalled mid-reply to the fake's body being
  cancelled.
- **cancel**: a ``Runtime`` turn stalled mid-reply; from ``session.cancel()`` to the turn's
  result (``cancelled``), and to the fake's body being cancelled.

Figures are the median and the maximum over ``--repeat`` runs, in milliseconds; they include
the machine's scheduling noise (a loaded machine shows it in the maximum).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.fakes

from tests.fakes.anthropic_api import Reply, Text, anthropic_app  # noqa: E402
from tests.fakes.openai_api import Completion, openai_app  # noqa: E402
from tests.fakes.serving import serving  # noqa: E402

from durable_turns import Agent, Runtime, SqliteStore  # noqa: E402
from durable_turns.errors import ModelError  # noqa: E402
from durable_turns.events import TurnEvent  # noqa: E402
from durable_turns.messages import Message  # noqa: E402
from durable_turns.models import Model, ModelRequest, TextDelta  # noqa: E402
from durable_turns.models.anthropic_messages import anthropic  # noqa: E402
from durable_turns.models.openai_compat import openai_compatible  # noqa: E402

TEXT = "one two three four five six"
WAIT = 30.0
"""A bound on every wait, so a broken adapter fails the run instead of hanging it."""


@dataclass(frozen=True)
class Provider:
    name: str
    app: Callable[[], Any]
    """A fake server with an empty script."""
    stalled: Callable[[], Any]
    """A script entry that streams some text, then stalls until the client goes away."""
    model: Callable[[str, float | None], Any]
    """``model(base_url, read_timeout)``: the adapter pointed at the fake."""


PROVIDERS = [
    Provider("anthropic", anthropic_app,
             lambda: Reply([Text(TEXT)], stall_after=4),
             lambda url, timeout: anthropic("claude-test", api_key="k", base_url=url,
                                            max_retries=0, timeout=timeout)),
    Provider("openai", openai_app,
             lambda: Completion(TEXT, stall_after=3),
             lambda url, timeout: openai_compatible("gpt-test", api_key="k",
                                                    base_url=f"{url}/v1", max_retries=0,
                                                    timeout=timeout)),
]


def request() -> ModelRequest:
    return ModelRequest(system="Be brief.", messages=[Message("user", "count", turn_id="t1")],
                        tools=[], turn_id="t1")


async def disconnected(app: Any, i: int) -> float:
    """Wait for the fake to see stream ``i``'s client go; returns when (monotonic)."""
    await asyncio.wait_for(app.state.closed[i].wait(), WAIT)
    t = time.monotonic()
    if app.state.ended[i] != "disconnected":
        raise AssertionError(f"stream {i} ended {app.state.ended[i]!r}, not by a disconnect")
    return t


async def stall(p: Provider, repeat: int, read_timeout: float) -> dict[str, list[float]]:
    app = p.app()
    out: dict[str, list[float]] = {"overshoot": [], "server sees it": []}
    async with serving(app) as url:
        model = p.model(url, read_timeout)
        try:
            for i in range(repeat):
                app.state.script.append(p.stalled())
                last = 0.0
                try:
                    async with asyncio.timeout(WAIT):
                        async for ev in model.stream(request()):
                            if isinstance(ev, TextDelta):
                                last = time.monotonic()
                    raise AssertionError("the stalled stream ended without an error")
                except ModelError as e:
                    if "stalled past the read timeout" not in str(e):
                        raise
                    failed = time.monotonic()
                if not last:
                    raise AssertionError("no text before the stall")
                out["overshoot"].append(failed - last - read_timeout)
                out["server sees it"].append(await disconnected(app, i) - failed)
        finally:
            await model.aclose()
    return out


async def close(p: Provider, repeat: int) -> dict[str, list[float]]:
    app = p.app()
    out: dict[str, list[float]] = {"aclose → server sees it": []}
    async with serving(app) as url:
        model = p.model(url, None)
        try:
            for i in range(repeat):
                app.state.script.append(p.stalled())
                stream = model.stream(request())
                while not isinstance(await asyncio.wait_for(anext(stream), WAIT), TextDelta):
                    pass
                began = time.monotonic()
                await asyncio.wait_for(stream.aclose(), WAIT)
                out["aclose → server sees it"].append(await disconnected(app, i) - began)
        finally:
            await model.aclose()
    return out


async def cancel(p: Provider, repeat: int, tmp: Path) -> dict[str, list[float]]:
    app = p.app()
    out: dict[str, list[float]] = {"cancel → result": [], "cancel → server sees it": []}
    async with serving(app) as url:
        model: Model = p.model(url, None)
        async with Runtime(agents=[Agent("ops", "Be brief.")],
                           store=SqliteStore(tmp / f"{p.name}.sqlite"), model=model) as rt:
            for i in range(repeat):
                app.state.script.append(p.stalled())
                session = rt.session("ops", f"s{i}")
                streaming = asyncio.Event()

                def on_event(e: TurnEvent, streaming: asyncio.Event = streaming) -> None:
                    if e.type == "message.delta":
                        streaming.set()

                session.observe(on_event, turn_id="t1")
                await session.start("count slowly", turn_id="t1")
                await asyncio.wait_for(streaming.wait(), WAIT)
                began = time.monotonic()
                await session.cancel("t1", reason="bench")
                result = await asyncio.wait_for(session.result("t1"), WAIT)
                done = time.monotonic()
                if result.status != "cancelled":
                    raise AssertionError(f"turn {i} ended {result.status}, not cancelled")
                out["cancel → result"].append(done - began)
                out["cancel → server sees it"].append(await disconnected(app, i) - began)
        await model.aclose()  # type: ignore[attr-defined]
    return out


async def measure(args: argparse.Namespace) -> dict[str, dict[str, dict[str, float]]]:
    figures: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for p in PROVIDERS:
            runs = {
                "stall": await stall(p, args.repeat, args.read_timeout),
                "close": await close(p, args.repeat),
                "cancel": await cancel(p, args.repeat, Path(tmp)),
            }
            for scenario, series in runs.items():
                for what, xs in series.items():
                    figures.setdefault(p.name, {})[f"{scenario}: {what}"] = {
                        "median_ms": statistics.median(xs) * 1000, "max_ms": max(xs) * 1000,
                        "runs": len(xs)}
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="3 runs of each figure")
    ap.add_argument("--repeat", type=int, default=None, help="runs of each figure (default 20)")
    ap.add_argument("--read-timeout", type=float, default=0.3,
                    help="the model's read timeout in the stall runs, in seconds (default 0.3)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    if args.repeat is None:
        args.repeat = 3 if args.quick else 20
    figures = asyncio.run(measure(args))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"{args.repeat} runs each; read timeout {args.read_timeout * 1000:.0f} ms in the stall"
          " runs; milliseconds")
    width = max(len(k) for f in figures.values() for k in f)
    for provider, f in figures.items():
        print(f"\n{provider}")
        print(f"  {'':{width}}  {'median':>8}  {'max':>8}")
        for what, v in f.items():
            print(f"  {what:{width}}  {v['median_ms']:8.1f}  {v['max_ms']:8.1f}")


if __name__ == "__main__":
    main()
