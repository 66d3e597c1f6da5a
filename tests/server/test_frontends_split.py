"""F19, F22: The frontend protocols on a split deployment, in real processes: ``durable-turns serve
--no-drive`` answers the AI SDK's and AG-UI's requests while ``durable-turns worker`` processes
drive the turns on PostgreSQL. Live text reaches the client from the worker; a worker
SIGKILLed mid-turn leaves a turn that another worker replays, and the client that resumes
the chat's stream gets the whole message once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import PG_DSN
from deploykit import deployment, write_app
from livekit import store_option

WAIT = 30.0
TEXT = "One, two, three, four."
AGENT_PY = """
import asyncio, os, time
from pathlib import Path
from durable_turns.model import Stop, TextDelta

GATE = Path({gate!r})


class Gated:
    # Streams half its text, says which process reached the gate, waits for the gate file
    # (the test makes it), then streams the rest.
    async def stream(self, request):
        opening = next(m.text for m in reversed(request.messages) if m.is_opening)
        if "gated" not in opening:
            yield TextDelta("You said: " + opening)
            yield Stop("end_turn")
            return
        yield TextDelta("One, ")
        yield TextDelta("two, ")
        Path(f"{{GATE}}.{{os.getpid()}}").write_text("reached")
        deadline = time.monotonic() + 60
        while not GATE.exists():  # a bounded poll of a file the test writes
            assert time.monotonic() < deadline, "the gate never opened"
            await asyncio.sleep(0.01)
        yield TextDelta("three, ")
        yield TextDelta("four.")
        yield Stop("end_turn")


model = Gated()
"""


async def chunks(r: httpx.Response, until: Any = None) -> list[dict[str, Any]]:
    """The UI message stream's chunks, to its end or until ``until(chunks)`` holds."""
    out: list[dict[str, Any]] = []
    async for line in r.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
            if until is not None and until(out):
                break
    return out


def text_of(found: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in found if c["type"] == "text-delta")


async def wait_for_files(pattern: str, where: Path) -> list[Path]:
    async with asyncio.timeout(WAIT):
        while not (found := sorted(where.glob(pattern))):
            await asyncio.sleep(0.01)  # a bounded poll of a file another process writes
    return found


@pytest.mark.skipif(PG_DSN is None, reason="needs DURABLE_TURNS_TEST_PG (a DSN; see .ci/pg)")
async def test_a_chat_driven_by_a_worker_streams_live_and_resumes_whole_after_a_sigkill(
        tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    app = write_app(tmp_path, "You count.", AGENT_PY.format(gate=str(gate)))
    store = store_option("postgres", tmp_path)
    chat = {"id": "c1", "messages": [
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "gated count"}]}]}
    async with deployment(app, store, tmp_path, workers=2) as d, \
            httpx.AsyncClient(base_url=d.url, timeout=WAIT) as client:
        async with asyncio.timeout(WAIT):
            # The worker's live text reaches this server's client (NOTIFY frames); the client
            # then leaves mid-turn.
            async with client.stream("POST", "/agents/ops/ai-sdk/chat", json=chat) as r:
                assert r.status_code == 200, await r.aread()
                assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
                cut = await chunks(r, lambda found: text_of(found).startswith("One, "))
            assert [c["type"] for c in cut[:3]] == ["start", "start-step", "text-start"]
            # The worker that drives the turn dies at the gate, mid-step.
            reached = await wait_for_files("gate.*", tmp_path)
            pid = int(reached[0].suffix[1:])
            assert pid in [w.pid for w in d.workers], d.log()
            os.kill(pid, signal.SIGKILL)
            # A reload: the chat's resume request joins the running turn from its start.
            async with client.stream("GET", "/agents/ops/ai-sdk/chat/c1/stream") as r:
                assert r.status_code == 200, await r.aread()
                gate.write_text("open")
                resumed = await chunks(r)
            # The other worker took the turn over and replayed its step.
            others = [p for p in await wait_for_files("gate.*", tmp_path) if p != reached[0]]
            assert others, d.log()
    assert [c["type"] for c in resumed] == [
        "start", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish"]
    assert resumed[0]["messageId"] == cut[0]["messageId"]
    assert text_of(resumed) == TEXT, "the whole message, once"
    assert resumed[-1] == {"type": "finish", "finishReason": "stop"}


@pytest.mark.skipif(PG_DSN is None, reason="needs DURABLE_TURNS_TEST_PG (a DSN; see .ci/pg)")
async def test_ag_ui_on_a_server_that_drives_nothing(tmp_path: Path) -> None:
    app = write_app(tmp_path, "You count.", AGENT_PY.format(gate=str(tmp_path / "gate")))
    store = store_option("postgres", tmp_path)
    run = {"threadId": "t1", "runId": "r1",
           "messages": [{"id": "u1", "role": "user", "content": "hello"}]}
    async with deployment(app, store, tmp_path, workers=1) as d, \
            httpx.AsyncClient(base_url=d.url, timeout=WAIT) as client:
        async with asyncio.timeout(WAIT):
            r = await client.post("/agents/ops/ag-ui", json=run)
    assert r.status_code == 200, d.log()
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "RUN_STARTED"
    assert events[-1] == {"type": "RUN_FINISHED", "threadId": "t1", "runId": "r1",
                          "result": "You said: hello", "outcome": {"type": "success"}}
    assert "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT") == \
        "You said: hello"
