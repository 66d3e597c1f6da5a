"""MCP servers that ask (F26, F17), beyond ``test_mcp.py``'s ``input_required`` server: one of the
handshake era (``tests/mcp_legacy_server.py``, protocol 2025-11-25) asking with the older
server-initiated ``elicitation/create`` mid-call, over stdio and streamable HTTP; and sampling
requests (``sampling/createMessage``, the older request and the ``input_required`` form),
refused without ``mcp_tools(sampling=True)`` and answered by the agent's model with it, as a
step of its own that a crash and a replay do not ask again.

Each server appends to a log file, from whichever process served it, what it asked and what
came back (and every ``notifications/cancelled`` it received): that file, not a mock, tells
what the server saw.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters

from durable_turns import Agent, ModelReply, ModelRequest, Runtime, SqliteStore, ToolCall, scripted
from durable_turns.mcp import SAMPLING_REFUSED, McpServer, mcp_tools
from durable_turns.records import Answer, SessionKey

HERE = Path(__file__).resolve().parents[1]
LEGACY = HERE / "mcp_legacy_server.py"
MODERN = HERE / "mcp_server.py"
WAIT = 60.0
"""The bound on every wait here: each MCP call over stdio starts a Python process."""
SUMMARY_SYSTEM = "Summarise in five words."


def stdio(script: Path, log: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(script), str(log)])


def lines(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_http(script: Path, log: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), str(log), "--http", str(port)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT
        while True:  # a bounded wait for the server to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the MCP server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.fixture
def legacy_http(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "legacy.jsonl"
    for url in serve_http(LEGACY, log):
        yield url, log


@pytest.fixture
def modern_http(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "calls.jsonl"
    for url in serve_http(MODERN, log):
        yield url, log


def turn_model(tool: str, args: dict[str, Any], seen: list[ModelRequest],
               summary: str = "Acme owes nothing today.") -> Any:
    """Calls ``tool`` once, then says "Done."; answers a sampling request with ``summary``."""

    def reply(request: ModelRequest) -> ModelReply:
        seen.append(request)
        if request.system == SUMMARY_SYSTEM:
            return ModelReply(summary)
        if not any(m.role == "tool" for m in request.messages):
            return ModelReply("Working.", [ToolCall("c1", tool, args)])
        return ModelReply("Done.")

    return scripted(reply)


def tool_results(messages: list[Any]) -> list[Any]:
    return [m.result for m in messages if m.role == "tool"]


# -- the older elicitation form ---------------------------------------------------------------


async def park_then_answer(server: McpServer, db: Path, log: Path,
                           answer: dict[str, Any]) -> list[Any]:
    """Park on the legacy server's question in one Runtime, answer it from another; returns
    the tool results. Checks what the server saw while the turn was parked."""
    tools = await mcp_tools(server, include=["pay_out"])
    seen: list[ModelRequest] = []
    model = turn_model("pay_out", {"account": "acme"}, seen)
    async with Runtime([Agent("ops", tools=tools)], SqliteStore(db), model) as rt:
        s = rt.session("ops", "s1")
        t = await s.start("pay acme", turn_id="t1")
        parked = await s.result(t.turn_id)
        assert parked.status == "suspended" and parked.request is not None
        assert parked.request.id == "mcp:c1:1"
        assert parked.request.prompt == "Who approves paying out acme?"
        schema = dict(parked.request.schema or {})
        assert schema["properties"]["content"]["properties"]["approver"] == {"type": "string"}
        request_id = parked.request.id
    while_parked = lines(log)
    # The server asked once and got no answer: no "cancel" (nobody cancelled), and the call
    # was not cancelled either; the connection closed under the question.
    assert [x for x in while_parked if "args" in x] == [{"tool": "pay_out",
                                                        "args": {"account": "acme"}}]
    assert [x for x in while_parked if x.get("got") not in (None, "error")] == []
    assert [x for x in while_parked if "cancelled" in x] == []
    async with Runtime([Agent("ops", tools=tools)], SqliteStore(db), model) as rt:
        s = rt.session("ops", "s1")
        await s.resume("t1", request_id, answer)
        done = await s.result("t1")
        assert (done.status, done.text) == ("completed", "Done.")
        return tool_results(await s.transcript())


async def test_a_legacy_stdio_server_asks_mid_call_and_gets_the_answer_once(
        tmp_path: Path) -> None:
    log = tmp_path / "legacy.jsonl"
    results = await park_then_answer(stdio(LEGACY, log), tmp_path / "db.sqlite", log,
                                     {"action": "accept", "content": {"approver": "alice"}})
    assert results == ["paid acme, approved by alice"]
    answers = [x for x in lines(log) if x.get("got") not in (None, "error")]
    assert answers == [{"tool": "pay_out", "got": "accept", "content": {"approver": "alice"}}]
    assert [x for x in lines(log) if "cancelled" in x] == []


async def test_a_legacy_http_server_asks_and_a_decline_goes_back(
        legacy_http: tuple[str, Path], tmp_path: Path) -> None:
    url, log = legacy_http
    results = await park_then_answer(url, tmp_path / "db.sqlite", log, {"action": "decline"})
    assert results == ["not paid: decline"]
    answers = [x for x in lines(log) if x.get("got") not in (None, "error")]
    assert answers == [{"tool": "pay_out", "got": "decline", "content": None}]
    assert [x for x in lines(log) if "cancelled" in x] == []


# -- sampling -----------------------------------------------------------------------------------


async def sample_once(server: McpServer, db: Path, sampling: bool
                      ) -> tuple[list[Any], list[ModelRequest], dict[str, Any]]:
    """One turn calling ``summarise``: its tool results, the model's requests, its steps."""
    tools = await mcp_tools(server, include=["summarise"], sampling=sampling)
    seen: list[ModelRequest] = []
    model = turn_model("summarise", {"text": "Acme paid every invoice this year."}, seen)
    async with Runtime([Agent("ops", tools=tools)], SqliteStore(db), model) as rt:
        s = rt.session("ops", "s1")
        assert (await s.turn("summarise acme", turn_id="t1")).text == "Done."
        results = tool_results(await s.transcript())
        history = [(cp.kind, [st.id for st in cp.steps]) for cp in await s.history()]
    sampled = [h for h in history if any(i.startswith("input:t1:sample:") for i in h[1])]
    assert sampled == ([("input", ["input:t1:sample:mcp:c1:1"])] if sampling else [])
    store = SqliteStore(db)
    await store.open()
    try:
        steps = {k: v.result for k, v in (await store.read_steps(SessionKey("ops", "s1"))).items()}
    finally:
        await store.close()
    return results, seen, steps


def sampling_requests(seen: list[ModelRequest]) -> list[ModelRequest]:
    return [r for r in seen if r.system == SUMMARY_SYSTEM]


async def test_a_legacy_servers_sampling_request_is_refused_without_sampling(
        tmp_path: Path) -> None:
    log = tmp_path / "legacy.jsonl"
    results, seen, steps = await sample_once(stdio(LEGACY, log), tmp_path / "db.sqlite",
                                             sampling=False)
    assert sampling_requests(seen) == []  # the model was not asked
    assert [x for x in lines(log) if x.get("got")] == [
        {"tool": "summarise", "got": "error", "error": SAMPLING_REFUSED}]
    assert results == [{"error": f"McpToolError: no summary: {SAMPLING_REFUSED}"}]
    assert "mcp_tools(..., sampling=True)" in SAMPLING_REFUSED
    assert not [k for k in steps if k.startswith("input:")]


async def test_a_legacy_servers_sampling_request_is_answered_by_the_agents_model(
        tmp_path: Path) -> None:
    log = tmp_path / "legacy.jsonl"
    results, seen, steps = await sample_once(stdio(LEGACY, log), tmp_path / "db.sqlite",
                                             sampling=True)
    [asked] = sampling_requests(seen)
    assert asked.tools == []
    assert [(m.role, m.text) for m in asked.messages] == [
        ("user", "Acme paid every invoice this year.")]
    got = [x for x in lines(log) if x.get("got")]
    assert got == [{"tool": "summarise", "got": "sampled", "text": "Acme owes nothing today.",
                    "model": "ScriptedModel"}]
    assert results == ["summary: Acme owes nothing today."]
    # A step of its own, answered by the model.
    assert steps["input:t1:sample:mcp:c1:1"] == Answer(
        {"text": "Acme owes nothing today.", "stop": "end_turn", "model": "ScriptedModel"},
        "model")


async def test_an_input_required_sampling_request_with_and_without_sampling(
        modern_http: tuple[str, Path], tmp_path: Path) -> None:
    url, log = modern_http
    results, seen, _ = await sample_once(url, tmp_path / "refused.sqlite", sampling=False)
    assert sampling_requests(seen) == []
    assert results == [{"error": f"MCPError: {SAMPLING_REFUSED}"}]
    assert lines(log) == []  # the tool's body never ran: the client did not retry
    results, seen, steps = await sample_once(url, tmp_path / "answered.sqlite", sampling=True)
    assert len(sampling_requests(seen)) == 1
    assert results == [{"result": "summary: Acme owes nothing today."}]
    assert [(x["tool"], x["args"]["summary"]) for x in lines(log)] == [
        ("summarise", "Acme owes nothing today.")]
    assert isinstance(steps["input:t1:sample:mcp:c1:1"], Answer)


# -- a crash after the sample committed ----------------------------------------------------------

CHILD = textwrap.dedent(r'''
    import asyncio, json, os, signal, sys, threading, time
    from pathlib import Path
    from mcp import StdioServerParameters
    from durable_turns import Agent, ModelReply, Runtime, SqliteStore, ToolCall, scripted
    from durable_turns.mcp import mcp_tools

    db, log, server, asks, kill = sys.argv[1:5] + [sys.argv[5] == "kill"]

    def reply(request):
        if request.system == "Summarise in five words.":
            with open(asks, "a") as f:
                f.write("asked\n")
            return ModelReply("Acme owes nothing today.")
        if not any(m.role == "tool" for m in request.messages):
            return ModelReply("", [ToolCall("c1", "summarise", {"text": "Acme paid."})])
        return ModelReply("Done.")

    def killer():
        # The server logs the sampled answer once it received it: the sample step committed
        # before it was sent, the tool's step has not. Die there.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if Path(log).exists() and '"sampled"' in Path(log).read_text():
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.01)

    async def main():
        tools = await mcp_tools(StdioServerParameters(command=sys.executable,
                                                      args=[server, log]), sampling=True)
        if kill:
            threading.Thread(target=killer, daemon=True).start()
        async with Runtime([Agent("ops", tools=tools)], SqliteStore(db),
                           scripted(reply)) as rt:
            session = rt.session("ops", "s1")
            await session.start("summarise acme", turn_id="t1")
            result = await session.result("t1")
            print(result.status, result.text)

    asyncio.run(asyncio.wait_for(main(), 60))
''')


def test_a_replay_after_a_crash_answers_the_sampling_request_from_its_step(
        tmp_path: Path) -> None:
    script, db, log, asks = (tmp_path / "child.py", tmp_path / "db.sqlite",
                             tmp_path / "legacy.jsonl", tmp_path / "asks.txt")
    script.write_text(CHILD)

    def child(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), str(db), str(log), str(LEGACY),
                               str(asks), mode], capture_output=True, text=True, timeout=WAIT)

    crashed = child("kill")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert asks.read_text().splitlines() == ["asked"]
    replay = child("run")
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.split("\n")[0] == "completed Done."
    # The server was called again (a remote tool is at least once) and sampled again; the
    # model was not asked again: the answer came from the step.
    assert [x["tool"] for x in lines(log) if "args" in x] == ["summarise", "summarise"]
    assert [x["text"] for x in lines(log) if x.get("got") == "sampled"] == [
        "Acme owes nothing today."] * 2
    assert asks.read_text().splitlines() == ["asked"]

    async def results() -> list[Any]:
        store = SqliteStore(db)
        await store.open()
        try:
            return tool_results(await store.read_messages(SessionKey("ops", "s1")))
        finally:
            await store.close()

    assert asyncio.run(results()) == ["summary: Acme owes nothing today."]
