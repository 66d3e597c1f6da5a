"""MCP tools (F17): a real MCP server written with the official SDK (``tests/mcp_server.py``),
spoken to over stdio (and streamable HTTP), its tools called in turns, a crash after an MCP
call committed, and the replay not calling the server again; MCP input requests (F26): the
server asks (an ``input_required`` result), the turn
parks with its message and schema (the server told neither ``cancel`` nor that its request
was cancelled), is resumed from another ``Runtime`` over the same SQLite file, and the server
receives the answer or the decline, once.

The server appends a line to a counter file on every ``tools/call``, from whichever process
called it: that file, not a mock, tells how often the server was really called.
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
from mcp import Client, StdioServerParameters

from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    ModelRequest,
    Runtime,
    SqliteStore,
    ToolCall,
    load_agent,
    scripted,
)
from durable_turns.errors import ConfigurationError
from durable_turns.mcp import IDEMPOTENCY_META, McpServer, answer_schema, mcp_tools
from durable_turns.messages import Message
from durable_turns.records import SessionKey

HERE = Path(__file__).resolve().parents[1]
SERVER = HERE / "mcp_server.py"
WAIT = 60.0
"""The bound on every wait here: each MCP call over stdio starts a Python process."""


def stdio(counter: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(SERVER), str(counter)])


def cancelled(counter: Path) -> list[str]:
    """The ``notifications/cancelled`` the server received (``tests/mcp_server.py``)."""
    notes = counter.with_name(counter.name + ".cancelled")
    return notes.read_text().splitlines() if notes.exists() else []


def calls(counter: Path) -> list[dict[str, Any]]:
    if not counter.exists():
        return []
    return [json.loads(line) for line in counter.read_text().splitlines() if line.strip()]


async def test_the_servers_tools_and_schemas_reach_the_model_unchanged(tmp_path: Path) -> None:
    server = stdio(tmp_path / "calls.jsonl")
    tools = await mcp_tools(server, prefix="ledger_", include=["add_entry", "close_account"])
    async with Client(server) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
    assert [t.name for t in tools] == ["ledger_add_entry", "ledger_close_account"]
    for t in tools:
        theirs = listed[t.name.removeprefix("ledger_")]
        assert dict(t.spec.input) == theirs.input_schema
        assert t.spec.description == theirs.description
        assert t.remote
    seen: list[dict[str, Any]] = []

    def reply(request: ModelRequest) -> ModelReply:
        seen.append({t.name: dict(t.input) for t in request.tools})
        return ModelReply("ok")

    model = scripted(reply)
    async with Runtime([Agent("ops", tools=tools)], MemoryStore(), model) as rt:
        await rt.session("ops", "s1").turn("hi")
    assert seen == [{t.name: listed[t.name.removeprefix("ledger_")].input_schema
                     for t in tools}]
    assert calls(tmp_path / "calls.jsonl") == []  # listing calls no tool


async def test_an_mcp_tool_is_called_in_a_turn_and_errors_are_results(tmp_path: Path) -> None:
    counter = tmp_path / "calls.jsonl"
    tools = await mcp_tools(stdio(counter))
    model = scripted([
        ModelReply("", [ToolCall("c1", "add_entry", {"account": "acme", "amount": 5}),
                        ToolCall("c2", "close_account", {"account": "acme"})]),
        ModelReply("Added; closing was refused."),
    ])
    async with Runtime([Agent("ops", tools=tools)], MemoryStore(), model) as rt:
        session = rt.session("ops", "s1")
        result = await session.turn("book 5 to acme, then close it", turn_id="t1")
        results = {m.call_id: (m.result, m.is_error) for m in await session.transcript()
                   if m.role == "tool"}
    assert result.status == "completed"
    assert results == {
        "c1": ({"account": "acme", "balance": 105}, False),
        "c2": ({"error": "McpToolError: Error executing tool close_account: account acme has "
                         "a balance"}, True),
    }
    made = calls(counter)
    assert [c["tool"] for c in made] == ["add_entry", "close_account"]
    keys = [c["key"] for c in made]
    assert all(isinstance(k, str) and len(k) == 32 for k in keys) and keys[0] != keys[1]


async def test_a_server_that_is_down_gives_an_error_result_naming_it(tmp_path: Path) -> None:
    # The server answered at start-up, then went away: its script is gone.
    script, counter = tmp_path / "server.py", tmp_path / "calls.jsonl"
    script.write_text(SERVER.read_text())
    server = StdioServerParameters(command=sys.executable, args=[str(script), str(counter)])
    [tool] = await mcp_tools(server, include=["add_entry"], name="ledger")
    script.unlink()
    model = scripted([
        ModelReply("", [ToolCall("c1", "add_entry", {"account": "acme", "amount": 1})]),
        ModelReply("The ledger is down."),
    ])
    async with Runtime([Agent("ops", tools=[tool])], MemoryStore(), model) as rt:
        session = rt.session("ops", "s1")
        result = await session.turn("book it", turn_id="t1")
        msg = next(m for m in await session.transcript() if m.role == "tool")
    assert result.status == "completed"
    assert msg.is_error
    assert msg.result["error"].startswith(
        "ConnectionError: MCP server 'ledger' is unreachable for 'add_entry': ")
    with pytest.raises(ConfigurationError, match=r"MCP server 'http://127\.0\.0\.1:9/mcp' "
                                                 r"could not list its tools: ConnectError"):
        await mcp_tools("http://127.0.0.1:9/mcp")
    with pytest.raises(ConfigurationError, match=r"has no tools \['nope'\]"):
        await mcp_tools(stdio(counter), include=["nope"])
    assert calls(counter) == []


# -- a crash after the MCP call committed ------------------------------------------------------

CHILD = textwrap.dedent(r'''
    import asyncio, os, signal, sys
    from mcp import StdioServerParameters
    from durable_turns import Agent, ModelReply, Runtime, SqliteStore, ToolCall, scripted
    from durable_turns.mcp import mcp_tools

    db, counter, server, kill = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "kill"

    class KillAfterCommit:
        def emit(self, event):
            # Events are published after their step's transaction committed.
            if kill and event.type == "action.completed":
                os.kill(os.getpid(), signal.SIGKILL)

    model = scripted([
        ModelReply("Booking.", [ToolCall("c1", "add_entry", {"account": "acme", "amount": 7})]),
        ModelReply("Booked."),
    ])

    async def main():
        params = StdioServerParameters(command=sys.executable, args=[server, counter])
        tools = await mcp_tools(params)
        async with Runtime([Agent("ops", tools=tools)], SqliteStore(db), model,
                           sink=KillAfterCommit()) as rt:
            session = rt.session("ops", "s1")
            await session.start("book 7 to acme", turn_id="t1")
            result = await session.result("t1")
            print(result.status, result.text)

    asyncio.run(asyncio.wait_for(main(), 60))
''')


def test_a_replay_after_a_crash_does_not_call_the_mcp_server_again(tmp_path: Path) -> None:
    script, db, counter = tmp_path / "child.py", tmp_path / "db.sqlite", tmp_path / "calls.jsonl"
    script.write_text(CHILD)

    def child(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), str(db), str(counter), str(SERVER),
                               mode], capture_output=True, text=True, timeout=WAIT)

    crashed = child("kill")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert [c["tool"] for c in calls(counter)] == ["add_entry"]
    replay = child("run")
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.split("\n")[0] == "completed Booked."
    assert [c["tool"] for c in calls(counter)] == ["add_entry"]  # not called again

    async def transcript() -> list[Message]:
        store = SqliteStore(db)
        await store.open()
        try:
            return await store.read_messages(SessionKey("ops", "s1"))
        finally:
            await store.close()

    messages = asyncio.run(transcript())
    tool_results = [m.result for m in messages if m.role == "tool"]
    assert tool_results == [{"account": "acme", "balance": 107}]
    assert sum(m.is_opening for m in messages) == 1


# -- streamable HTTP --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    counter, port = tmp_path / "calls.jsonl", free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), str(counter), "--http", str(port)],
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
                    raise AssertionError(f"the MCP server did not start: {proc.stderr}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", counter
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
        if proc.stderr is not None:
            proc.stderr.close()


async def test_streamable_http_tools_with_a_timeout(http_server: tuple[str, Path]) -> None:
    url, counter = http_server
    tools = await mcp_tools(url, timeout=2.0, include=["add_entry", "audit"])
    model = scripted([
        ModelReply("", [ToolCall("c1", "add_entry", {"account": "acme", "amount": 1}),
                        ToolCall("c2", "audit", {"account": "acme"})]),
        ModelReply("Booked; the audit timed out."),
    ])
    async with Runtime([Agent("ops", tools=tools)], MemoryStore(), model) as rt:
        session = rt.session("ops", "s1")
        assert (await session.turn("go", turn_id="t1")).status == "completed"
        results = {m.call_id: m.result for m in await session.transcript() if m.role == "tool"}
    assert results["c1"] == {"account": "acme", "balance": 101}
    assert results["c2"] == {"error": "TimeoutError: tool 'audit' took longer than 2s and was "
                                      "cancelled"}
    assert [c["tool"] for c in calls(counter)] == ["add_entry", "audit"]
    assert all(c["key"] for c in calls(counter))
    assert IDEMPOTENCY_META == "durable-turns/idempotency-key"


async def test_a_timeout_cancels_the_request_over_stdio(tmp_path: Path) -> None:
    # Unlike a park, a timeout gives the call up: the server is told its request was
    # cancelled (what the tests of parks check the server was not told).
    counter = tmp_path / "calls.jsonl"
    [audit] = await mcp_tools(stdio(counter), include=["audit"], timeout=10.0)
    model = scripted([ModelReply("", [ToolCall("c1", "audit", {"account": "acme"})]),
                      ModelReply("The audit timed out.")])
    async with Runtime([Agent("ops", tools=[audit])], MemoryStore(), model) as rt:
        assert (await rt.session("ops", "s1").turn("audit", turn_id="t1")).status == "completed"
    assert [c["tool"] for c in calls(counter)] == ["audit"]
    deadline = time.monotonic() + WAIT
    while not cancelled(counter) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the server's process writes it as it goes
    assert [json.loads(n)["reason"] for n in cancelled(counter)] == ["caller cancelled"]


def test_an_app_folder_names_its_mcp_servers(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "instructions.md").write_text("You keep the ledger.")
    entry = {"command": sys.executable, "args": [str(SERVER), str(tmp_path / "calls.jsonl")],
             "include": ["add_entry"], "prefix": "ledger_", "timeout": 30, "sampling": True}
    (app / "agent.py").write_text(f"name = 'books'\nmcp_servers = [{entry!r}]\n")
    agent = load_agent(app)
    [t] = agent.tools
    assert (t.name, t.remote, t.timeout) == ("ledger_add_entry", True, 30)
    (app / "agent.py").write_text("mcp_servers = [{'url': 'http://127.0.0.1:9/mcp'}]\n")
    with pytest.raises(ConfigurationError, match=r"agent\.py: MCP server "
                                                 r"'http://127.0.0.1:9/mcp' could not list"):
        load_agent(app)
    (app / "agent.py").write_text("mcp_servers = [{'cmd': 'x'}]\n")
    with pytest.raises(ConfigurationError, match=r"agent\.py: unknown keys \['cmd'\]"):
        load_agent(app)


async def test_an_app_folder_with_mcp_servers_loads_inside_an_event_loop(tmp_path: Path) -> None:
    # Hosts load their app folder from async code (serve, worker): the lists are read on a
    # thread with a loop of its own, so a running loop is no obstacle.
    app = tmp_path / "app"
    (app / "tools").mkdir(parents=True)
    (app / "instructions.md").write_text("You keep the ledger.")
    (app / "tools" / "hello.py").write_text(
        "from durable_turns import tool\n\n@tool\ndef hello() -> str:\n    "
        '"""Say hello."""\n    return "hi"\n')
    server = [str(SERVER), str(tmp_path / "calls.jsonl")]
    (app / "agent.py").write_text(
        "import sys\nfrom mcp import StdioServerParameters\n"
        f"mcp_servers = [StdioServerParameters(command=sys.executable, args={server!r})]\n")
    agent = load_agent(app)
    assert sorted(t.name for t in agent.tools) == ["add_entry", "audit", "close_account",
                                                   "hello", "pay_out", "summarise"]
    model = scripted([ModelReply("", [ToolCall("c1", "add_entry",
                                               {"account": "acme", "amount": 2})]),
                      ModelReply("Booked.")])
    async with Runtime([agent], MemoryStore(), model) as rt:
        assert (await rt.session(agent.name, "s1").turn("book 2")).text == "Booked."
    assert [c["tool"] for c in calls(tmp_path / "calls.jsonl")] == ["add_entry"]

def model(tool: str, seen: list[str]) -> Any:
    def reply(request: ModelRequest) -> ModelReply:
        if len(seen) == 0:
            seen.append("asked")
            return ModelReply("Paying.", [ToolCall("c1", tool, {"account": "acme"})])
        seen.append(repr(request.messages[-1]))
        return ModelReply("Done.")

    return scripted(reply)


async def park_and_resume(server: McpServer, db: Path, tool: str,
                          answer: dict[str, Any]) -> str:
    tools = await mcp_tools(server, include=[tool])
    seen: list[str] = []
    async with Runtime([Agent("ops", tools=tools)], SqliteStore(db), model(tool, seen)) as rt:
        s = rt.session("ops", "s1")
        t = await s.start("pay acme")
        parked = await s.result(t.turn_id)
        assert parked.status == "suspended" and parked.request is not None
        assert parked.request.prompt == "Who approves paying out acme?"
        schema = dict(parked.request.schema or {})
        assert schema["properties"]["action"] == {"enum": ["accept", "decline", "cancel"]}
        assert schema["properties"]["content"]["properties"]["approver"]["type"] == "string"
        request_id = parked.request.id
    async with Runtime([Agent("ops", tools=tools)], SqliteStore(db), model(tool, seen)) as rt:
        s = rt.session("ops", "s1")
        await s.resume(t.turn_id, request_id, answer)
        done = await s.result(t.turn_id)
        assert (done.status, done.text) == ("completed", "Done.")
    return seen[-1]


async def test_a_stdio_server_asks_and_receives_the_answer(tmp_path: Path) -> None:
    tool = "pay_out"
    counter = tmp_path / "calls.jsonl"
    last = await park_and_resume(stdio(counter), tmp_path / "db.sqlite", tool,
                                 {"action": "accept", "content": {"approver": "alice"}})
    assert "paid acme, approved by alice" in last
    # The park was no "cancel" (the tool never ran with one), nor a cancelled request: the
    # server's one run is the answered one.
    assert [c["args"] for c in calls(counter)] == [
        {"account": "acme", "action": "accept", "approver": "alice"}]
    assert not cancelled(counter)


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_a_decline_or_a_cancel_goes_back_to_the_server(tmp_path: Path,
                                                             action: str) -> None:
    counter = tmp_path / "calls.jsonl"
    last = await park_and_resume(stdio(counter), tmp_path / "db.sqlite", "pay_out",
                                 {"action": action})
    assert f"not paid: {action}" in last
    assert [c["args"] for c in calls(counter)] == [{"account": "acme", "action": action}]
    assert not cancelled(counter)


async def test_a_streamable_http_server_asks(http_server: tuple[str, Path],
                                             tmp_path: Path) -> None:
    url, counter = http_server
    last = await park_and_resume(url, tmp_path / "db.sqlite", "pay_out",
                                 {"action": "accept", "content": {"approver": "bob"}})
    assert "paid acme, approved by bob" in last
    assert [c["args"] for c in calls(counter)] == [
        {"account": "acme", "action": "accept", "approver": "bob"}]
    assert not cancelled(counter)


def test_the_park_schema_wraps_the_servers_schema() -> None:
    requested = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert answer_schema(requested)["properties"]["content"] == requested
