"""F12: The host's lifespan: ``uvicorn module:app`` in a real process serves like ``serve``, and
the lifespan opens, recovers, starts and stops what it must, in order."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import BaseRoute

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, SqliteStore, scripted
from durable_turns.errors import ConfigurationError
from durable_turns.events import TurnEvent
from durable_turns.scheduling import NoDriveScheduler
from durable_turns.server import create_app

WAIT = 60.0
"""The bound on every wait of these tests (a process starts, imports, serves)."""

MODULE = '''
from durable_turns import Agent, ModelReply, Runtime, SqliteStore, scripted
from durable_turns.server import create_app

runtime = Runtime([Agent("desk", "You help.")], SqliteStore({db!r}),
                  scripted(lambda request: ModelReply("You said: " + request.messages[-1].text)))
app = create_app(runtime)
'''


async def _listening(proc: asyncio.subprocess.Process) -> str:
    """uvicorn's base URL, read off the line it logs once it listens."""
    assert proc.stderr is not None
    async with asyncio.timeout(WAIT):
        while True:
            line = (await proc.stderr.readline()).decode()
            if not line:
                raise AssertionError(f"uvicorn exited with {await proc.wait()}")
            if "Uvicorn running on " in line:
                return line.split("Uvicorn running on ")[1].split()[0]


async def test_uvicorn_module_app_recovers_serves_and_shuts_down(tmp_path: Path) -> None:
    db = tmp_path / "desk.sqlite"
    (tmp_path / "deskapp.py").write_text(MODULE.format(db=str(db)))
    async with Runtime([Agent("desk")], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        await rt.session("desk", "s1").start("left behind", turn_id="t0")  # nobody drives it
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "uvicorn", "deskapp:app", "--app-dir", str(tmp_path),
        "--port", "0", "--timeout-graceful-shutdown", "5",
        stderr=asyncio.subprocess.PIPE)
    try:
        url = await _listening(proc)
        async with httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
            # The lifespan recovered the turn left behind as the server started.
            async with asyncio.timeout(WAIT), client.stream(
                    "GET", "/agents/desk/sessions/s1/events",
                    params={"after": "0", "until": "turn"}) as events:
                body = [line async for line in events.aiter_lines()]
            assert "event: turn.completed" in body
            r = await client.post("/agents/desk/sessions/s2/chat", json={"text": "hi"})
            assert r.status_code == 200 and r.json()["text"] == "You said: hi"
        proc.send_signal(signal.SIGTERM)
        _out, err = await asyncio.wait_for(proc.communicate(), WAIT)
        # uvicorn re-raises the signal it shut down on, once it has.
        assert proc.returncode in (0, -signal.SIGTERM), err.decode()
        assert "Application shutdown complete" in err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    async with Runtime([Agent("desk")], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        assert (await rt.session("desk", "s1").result("t0")).text == "You said: left behind"


class Recorder:
    """A channel that only records what the lifespan asks of it."""

    def __init__(self, name: str, calls: list[str], *, fail_start: bool = False) -> None:
        self.name = name
        self.calls = calls
        self.fail_start = fail_start
        self.runtime: Runtime | None = None

    def mount(self, runtime: Runtime) -> Sequence[BaseRoute]:
        self.runtime = runtime
        self.calls.append(f"{self.name}.mount")
        return []

    async def start(self) -> None:
        assert self.runtime is not None
        # The runtime is open when a channel starts: a read does not have to open it.
        self.calls.append(f"{self.name}.start")
        if self.fail_start:
            raise ConfigurationError(f"{self.name} cannot start")

    async def recover(self) -> int:
        self.calls.append(f"{self.name}.recover")
        return 0

    async def stop(self) -> None:
        self.calls.append(f"{self.name}.stop")

    async def deliver(self, target: Mapping[str, Any],
                      events: AsyncIterable[TurnEvent]) -> Any:
        return None


async def test_the_lifespan_starts_recovers_and_stops_channels_around_the_runtime(
        tmp_path: Path) -> None:
    calls: list[str] = []
    db = tmp_path / "desk.sqlite"
    async with Runtime([Agent("desk")], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        await rt.session("desk", "s1").start("queued before the server", turn_id="t1")
    rt = Runtime([Agent("desk")], SqliteStore(db), scripted([ModelReply("ok")]))
    app = create_app(rt, channels=[Recorder("a", calls), Recorder("b", calls)])
    assert calls == ["a.mount", "b.mount"]
    async with app.router.lifespan_context(app):
        assert calls[2:] == ["a.start", "b.start", "a.recover", "b.recover"]
        done = await rt.session("desk", "s1").result("t1", timeout=WAIT)
        assert (done.status, done.text) == ("completed", "ok")
    assert calls[6:] == ["b.stop", "a.stop"]
    with pytest.raises(Exception, match="not open"):  # the lifespan closed the runtime
        await rt.store.session_info(rt.key("desk", "s1"))


async def test_a_channel_that_fails_to_start_stops_the_started_ones_and_closes() -> None:
    calls: list[str] = []
    rt = Runtime([Agent("desk")], MemoryStore(), scripted([]))
    app = create_app(rt, channels=[Recorder("a", calls), Recorder("b", calls, fail_start=True)])
    with pytest.raises(ConfigurationError, match="b cannot start"):
        async with app.router.lifespan_context(app):
            raise AssertionError("the app must not start")
    assert calls == ["a.mount", "b.mount", "a.start", "b.start", "a.stop"]
    assert isinstance(app.state.lifespan_error, ConfigurationError)


async def test_create_app_takes_channels_only_and_one_per_name() -> None:
    rt = Runtime([Agent("desk")], MemoryStore(), scripted([]))
    with pytest.raises(ConfigurationError, match="is not a Channel"):
        create_app(rt, channels=[object()])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="named 'a'"):
        create_app(rt, channels=[Recorder("a", []), Recorder("a", [])])
    with pytest.raises(ConfigurationError, match="named 'http'"):
        create_app(rt, channels=[Recorder("http", [])])
