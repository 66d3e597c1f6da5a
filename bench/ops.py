"""What F17's operability costs: tracing per step, and an MCP call per transport.

    python bench/ops.py            # about half a minute
    python bench/ops.py --json

Tracing: turns of 10 remote tool calls (21 steps) on MemoryStore with a zero-latency scripted
model, each mode in its own process (OpenTelemetry takes one tracer provider per process):

- ``off``: ``opentelemetry-api`` installed, no tracer provider set (tracing is off);
- ``sdk``: the SDK's ``TracerProvider`` with a ``SimpleSpanProcessor`` and an exporter that
  drops the spans, so the figure is the cost of making them, not of shipping them.

MCP: the wall time of one ``tools/call`` through :func:`durable_turns.mcp.mcp_tools`' tool,
over stdio (a server process started per call) and over streamable HTTP (a connection per
call), against ``tests/mcp_server.py``.

Figures are medians of 3 runs; CPU time counts every thread of the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "mcp_server.py"
TURNS, CALLS = 30, 10


def tracing_child(mode: str) -> dict[str, float]:
    from durable_turns import Agent, MemoryStore, ModelReply, Runtime, ToolCall, scripted, tool

    if mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import (
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)
        del ReadableSpan

    @tool
    async def ping(n: int) -> int:
        """Answer at once."""
        return n

    script = [ModelReply("", [ToolCall(f"c{i}", "ping", {"n": i})]) for i in range(CALLS)]
    model = scripted([*script, ModelReply("done")])

    async def main() -> tuple[float, float]:
        async with Runtime([Agent("b", tools=[ping])], MemoryStore(), model) as rt:
            await rt.session("b", "warm").turn("go")
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(TURNS):
                await rt.session("b", f"s{i}").turn("go")
            return time.perf_counter() - wall, time.process_time() - cpu

    wall, cpu = asyncio.run(main())
    steps = TURNS * (2 * CALLS + 1)
    return {"wall_us_per_step": wall / steps * 1e6, "cpu_us_per_step": cpu / steps * 1e6}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def mcp_calls(server: Any, n: int) -> list[float]:
    from durable_turns import ToolContext
    from durable_turns.mcp import mcp_tools

    [add] = await mcp_tools(server, include=["add_entry"])
    out = []
    for i in range(n):
        ctx = ToolContext("b", "s", "t", f"c{i}", f"tool:1:c{i}", "k" * 32, store=None)  # type: ignore[arg-type]
        t = time.perf_counter()
        await add.call({"account": "a", "amount": i}, ctx)
        out.append(time.perf_counter() - t)
    return out


def bench_mcp(tmp: Path, n: int) -> dict[str, float]:
    from mcp import StdioServerParameters

    counter = tmp / "calls.jsonl"
    stdio = StdioServerParameters(command=sys.executable, args=[str(SERVER), str(counter)])
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), str(counter), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        return {
            "stdio_ms_per_call": statistics.median(asyncio.run(mcp_calls(stdio, n))) * 1e3,
            "http_ms_per_call": statistics.median(
                asyncio.run(mcp_calls(f"http://127.0.0.1:{port}/mcp", n))) * 1e3,
        }
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=["off", "sdk"])
    a = p.parse_args()
    if a.child:
        print(json.dumps(tracing_child(a.child)))
        return
    results: dict[str, Any] = {}
    for mode in ("off", "sdk"):
        runs = [json.loads(subprocess.run([sys.executable, __file__, "--child", mode],
                                          capture_output=True, text=True, check=True).stdout)
                for _ in range(3)]
        results[f"tracing_{mode}"] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results["mcp"] = bench_mcp(Path(tmp), 5)
    if a.json:
        print(json.dumps(results, indent=2))
        return
    for mode in ("off", "sdk"):
        r = results[f"tracing_{mode}"]
        print(f"tracing {mode:3}: {r['wall_us_per_step']:7.0f} µs wall, "
              f"{r['cpu_us_per_step']:7.0f} µs CPU per step")
    m = results["mcp"]
    print(f"MCP call: stdio {m['stdio_ms_per_call']:.0f} ms, "
          f"streamable HTTP {m['http_ms_per_call']:.0f} ms (median of 5)")


if __name__ == "__main__":
    main()
