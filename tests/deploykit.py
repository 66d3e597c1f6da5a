"""A split deployment in real processes, as users run it: ``durable-turns serve --no-drive``
and ``durable-turns worker`` processes on one store; and an SSE reader for its streams."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

WAIT = 30.0
"""The bound on every wait of a deployment's set-up and shutdown."""

Frame = tuple[str | None, str, dict[str, Any]]
"""An SSE event as a client reads it: its ``id`` (None for live ones), type, data."""


def write_app(root: Path, instructions: str, agent_py: str,
              tools: Mapping[str, str] | None = None) -> Path:
    """An app folder ``root/ops`` (its agent is ``ops``): ``instructions.md``, ``agent.py``
    and a module per tool (``tools/<name>.py``)."""
    app = root / "ops"
    (app / "tools").mkdir(parents=True)
    (app / "instructions.md").write_text(instructions)
    (app / "agent.py").write_text(agent_py)
    for name, source in (tools or {}).items():
        (app / "tools" / f"{name}.py").write_text(source)
    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Deployment:
    """The processes of a deployment and where the server answers."""

    url: str
    server: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]]
    logs: list[Path] = field(default_factory=list)

    def log(self) -> str:
        """Every process's output, for a failing assertion."""
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in self.logs if p.exists())


@asynccontextmanager
async def deployment(app: Path, store: str, tmp_path: Path, *, workers: int,
                     env: Mapping[str, str] | None = None,
                     worker_args: tuple[str, ...] = (),
                     temporal: tuple[str, str] | None = None) -> AsyncIterator[Deployment]:
    """Start a server that drives nothing and ``workers`` workers of the app folder ``app``
    on ``store`` (a DSN or a SQLite file), wait until the server answers, stop them all at
    the end (SIGINT, then SIGKILL past :data:`WAIT`). With ``temporal`` (a dev server's
    ``host:port`` and a task queue), the server is ``serve --temporal`` and the workers are
    ``temporal-worker`` processes."""
    port = free_port()
    cli = [sys.executable, "-m", "durable_turns.cli"]
    logs: list[Path] = []
    environ = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}

    def spawn(name: str, *args: str) -> subprocess.Popen[bytes]:
        logs.append(tmp_path / f"{name}.log")
        with logs[-1].open("wb") as out:
            return subprocess.Popen([*cli, *args], stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=environ)

    on = () if temporal is None else ("--temporal", temporal[0], "--task-queue", temporal[1])
    server = spawn("server", "serve", str(app), "--store", store, "--no-drive",
                   "--port", str(port), *on)
    kind = ("worker", "--poll-interval", "0.1") if temporal is None else \
        ("temporal-worker", "--heartbeat", "1", "--sticky-timeout", "0.5", *on)
    procs = [spawn(f"worker{i}", kind[0], str(app), "--store", store, "--lease-ttl", "5",
                   *kind[1:], *worker_args) for i in range(workers)]
    found = Deployment(f"http://127.0.0.1:{port}", server, procs, logs)
    try:
        async with httpx.AsyncClient(base_url=found.url, timeout=WAIT) as client:
            async with asyncio.timeout(WAIT):
                while True:
                    assert server.poll() is None, found.log()
                    try:
                        if (await client.get("/agents")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await asyncio.sleep(0.05)
        yield found
    finally:
        for p in [server, *procs]:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in [server, *procs]:
            try:
                p.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def read_sse(r: httpx.Response, into: list[Frame] | None = None) -> list[Frame]:
    """Every event of an SSE response, live ones included, to its end (appended to ``into``
    as they come, when given)."""
    frames: list[Frame] = [] if into is None else into
    seq: str | None = None
    kind = ""
    async for line in r.aiter_lines():
        if line.startswith("id: "):
            seq = line[4:]
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            frames.append((seq, kind, json.loads(line[6:])))
            seq = None
    return frames
