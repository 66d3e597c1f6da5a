"""F12: ``durable-turns serve`` and ``durable-turns sessions …``: real processes on a SQLite
file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from durable_turns import Runtime, SqliteStore, load_agent
from durable_turns.scheduling import NoDriveScheduler
from durable_turns.stores import SessionStore

WAIT = 60.0
"""The bound on every wait on a CLI process."""

AGENT_PY = '''
import asyncio, pathlib
from durable_turns import ModelReply, ToolCall, scripted
from durable_turns.models.scripted import calls_this_turn

name = "desk"

async def _reply(request):
    opening = next(m.text for m in reversed(request.messages) if m.is_opening)
    if opening.startswith("slow "):  # "slow PATH": answers once the test has written PATH
        go = pathlib.Path(opening.split(maxsplit=1)[1])
        async with asyncio.timeout(60):
            while not go.exists():
                await asyncio.sleep(0.01)
        return ModelReply("finally")
    if opening.startswith("refund") and calls_this_turn(request) == 0:
        return ModelReply("", [ToolCall("c1", "refund", {"order_id": "42"})])
    return ModelReply(f"You said: {opening}" if calls_this_turn(request) == 0 else "done")

model = scripted(_reply)
'''

REFUND = '''
from durable_turns import ToolContext, tool

@tool
async def refund(order_id: str, ctx: ToolContext) -> dict:
    """Refund an order once a person approves it."""
    ok = await ctx.request_input("approve", f"Refund {order_id}?", schema={"type": "boolean"})
    return {"refunded": ok is True}
'''


def make_app(tmp_path: Path) -> Path:
    root = tmp_path / "desk"
    (root / "tools").mkdir(parents=True)
    (root / "instructions.md").write_text("You help.")
    (root / "agent.py").write_text(AGENT_PY)
    (root / "tools" / "refund.py").write_text(REFUND)
    return root


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable_turns.cli", *args],
                          capture_output=True, text=True, timeout=WAIT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def served(app: Path, db: Path, *more: str,
                 said: list[bytes] | None = None, env: dict[str, str] | None = None,
                 ) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``serve`` on a free port; ``said`` gets the banner it prints once it listens (up to
    its line about authentication, the last)."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_turns.cli", "serve", str(app), "--db", str(db),
        "--port", str(port), *more, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT)
        assert line.startswith(b"serving agent "), line
        banner = [line]
        while not banner[-1].startswith((b"authentication: ", b"development mode: ",
                                         b"serving the channels' routes only")):
            banner.append(await asyncio.wait_for(proc.stdout.readline(), WAIT))
            assert banner[-1], banner  # the banner ends with the line about authentication
        if said is not None:
            said += banner
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), WAIT)


async def test_serve_runs_turns_and_stops_on_sigterm(tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "desk.sqlite"
    async with served(app, db) as (proc, url), httpx.AsyncClient(base_url=url,
                                                                 timeout=WAIT) as client:
        r = await client.post("/agents/desk/sessions/s1/chat", json={"text": "hi"})
        assert r.status_code == 200 and r.json()["text"] == "You said: hi"
        async with client.stream("GET", "/agents/desk/sessions/s1/events",
                                 params={"after": "0"}) as events:
            lines = events.aiter_lines()
            async with asyncio.timeout(WAIT):
                async for line in lines:
                    if line == "event: turn.completed":
                        break
            proc.send_signal(signal.SIGTERM)  # with a stream open
            # The server ends the stream as it shuts down (EventSource then reconnects).
            with contextlib.suppress(httpx.RemoteProtocolError):
                async with asyncio.timeout(WAIT):
                    async for _ in lines:
                        pass
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0
    async with Runtime([load_agent(app)], SqliteStore(db)) as rt:
        assert await rt.session("desk", "s1").status() == "idle"


async def test_sigterm_lets_a_running_turn_finish(tmp_path: Path) -> None:
    app, db, go = make_app(tmp_path), tmp_path / "desk.sqlite", tmp_path / "go"
    async with served(app, db) as (proc, url), httpx.AsyncClient(base_url=url,
                                                                 timeout=WAIT) as client:
        async with client.stream("POST", "/agents/desk/sessions/s1/turn",
                                 json={"text": f"slow {go}", "turn_id": "t1"}) as r:
            async with asyncio.timeout(WAIT):
                async for line in r.aiter_lines():
                    if line == "event: turn.started":
                        break
            proc.send_signal(signal.SIGTERM)  # the model step is running: it cannot end yet
            go.touch()
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0
    async with Runtime([load_agent(app)], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        done = await rt.session("desk", "s1").result("t1", timeout=WAIT)
        assert (done.status, done.text) == ("completed", "finally")


async def test_serve_recovers_unfinished_turns_at_start(tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "desk.sqlite"
    async with Runtime([load_agent(app)], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        await rt.session("desk", "s1").start("left behind", turn_id="t1")
    async with served(app, db) as (_proc, url), httpx.AsyncClient(base_url=url,
                                                                  timeout=WAIT) as client:
        async with client.stream("GET", "/agents/desk/sessions/s1/events",
                                 params={"after": "0", "until": "turn"}) as events:
            body = [line async for line in events.aiter_lines()]
        assert "event: turn.completed" in body


def test_serve_refuses_a_public_host_in_development_mode(tmp_path: Path) -> None:
    out = cli("serve", str(make_app(tmp_path)), "--db", str(tmp_path / "x.sqlite"),
              "--host", "0.0.0.0")
    assert out.returncode == 2
    assert "loopback only" in out.stderr
    assert "define authenticate(request) in the app folder's agent.py" in out.stderr
    assert "--auth MODULE:FUNCTION" in out.stderr


AUTHENTICATE = '''
def authenticate(request):
    token = request.headers.get("authorization", "")
    if token.startswith("Bearer key-"):
        return {"id": token.removeprefix("Bearer key-"), "role": "staff"}
    return None
'''


async def test_serve_authenticates_with_agent_py(tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "desk.sqlite"
    with (app / "agent.py").open("a") as f:
        f.write(AUTHENTICATE)
    said: list[bytes] = []
    async with served(app, db, said=said) as (_proc, url), httpx.AsyncClient(
            base_url=url, timeout=WAIT) as client:
        assert said[-1].startswith(b"authentication: ") and b"agent.py" in said[-1]
        for refused in (
            await client.get("/agents/desk/sessions"),
            await client.post("/agents/desk/sessions/s1/chat", json={"text": "hi"}),
            await client.post("/agents/desk/sessions/s1/chat", json={"text": "hi"},
                              headers={"Authorization": "Bearer wrong"}),
        ):
            assert refused.status_code == 401
            assert refused.json()["error"]["type"] == "Unauthorized"
        ann = {"Authorization": "Bearer key-ann"}
        # The body's "by" is ignored once callers are authenticated: the principal speaks.
        r = await client.post("/agents/desk/sessions/s1/chat",
                              json={"text": "refund it", "by": "mallory"}, headers=ann)
        assert r.status_code == 200 and r.json()["status"] == "suspended"
        answer = {"turn_id": r.json()["turn_id"], "input_id": "approve", "value": True}
        bob = await client.post("/agents/desk/sessions/s1/resume", json=answer,
                                headers={"Authorization": "Bearer key-bob"})
        assert bob.status_code == 404  # not his to read: as if it did not exist (only ann answers)
        done = await client.post("/agents/desk/sessions/s1/resume", json=answer, headers=ann)
        assert done.status_code == 200 and done.json()["status"] == "completed"
        shown = (await client.get("/agents/desk/sessions/s1", headers=ann)).json()
        (opening,) = [m for m in shown["transcript"] if m["role"] == "user"]
        assert opening["by"] == "http:ann"


async def test_serve_takes_auth_from_an_option(tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "desk.sqlite"
    auth = tmp_path / "gate.py"
    auth.write_text('''
async def check(request):
    key = request.headers.get("x-key")
    return {"id": key.upper()} if key else None
''')
    said: list[bytes] = []
    async with served(app, db, "--auth", f"{auth}:check", said=said) as (_proc, url), \
            httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
        assert said[-1].startswith(b"authentication: ") and b"gate.py:check" in said[-1]
        refused = await client.post("/agents/desk/sessions/s1/chat", json={"text": "hi"})
        assert refused.status_code == 401
        r = await client.post("/agents/desk/sessions/s1/chat", json={"text": "hi"},
                              headers={"X-Key": "zoe"})
        assert r.status_code == 200 and r.json()["text"] == "You said: hi"
        shown = (await client.get("/agents/desk/sessions/s1", headers={"X-Key": "zoe"})).json()
        assert [m["by"] for m in shown["transcript"] if m["role"] == "user"] == ["http:ZOE"]


async def test_serve_says_how_to_add_authentication(tmp_path: Path) -> None:
    said: list[bytes] = []
    async with served(make_app(tmp_path), tmp_path / "desk.sqlite", said=said) as (_p, url):
        assert said[-1].startswith(b"development mode:")
        assert b"authenticate(request)" in said[-1] and b"--auth" in said[-1]
        assert said[1] == f"console: {url}/  (open it in a browser)\n".encode()


async def test_the_banner_names_each_channel_s_routes(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLACK_")},
           "SLACK_SIGNING_SECRET": "8f742231b10e8888abcd99yyyzzz85a5",
           "SLACK_BOT_TOKEN": "xoxb-t", "SLACK_API_URL": "http://127.0.0.1:9/api/"}
    said: list[bytes] = []
    app = make_app(tmp_path)
    async with served(app, tmp_path / "desk.sqlite", "--channel", "slack",
                      "--expose-api", said=said, env=env) as (_proc, url):
        lines = [line.decode().rstrip("\n") for line in said]
        assert lines[1] == f"console: {url}/  (open it in a browser)"
        assert lines[2] == (f"channel slack: POST {url}/slack/events, "
                            f"POST {url}/slack/actions")


def test_serve_refuses_a_bad_auth_option(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    for spec, problem in (("nocolon", "expected MODULE:FUNCTION"),
                          (f"{tmp_path / 'missing.py'}:f", "is not a file"),
                          ("json:no_such_function", "defines no function")):
        out = cli("serve", str(app), "--db", str(tmp_path / "x.sqlite"), "--auth", spec)
        assert out.returncode == 2 and problem in out.stderr, out.stderr


def test_serve_needs_a_model(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    (app / "agent.py").write_text("name = 'desk'\n")
    out = cli("serve", str(app), "--db", str(tmp_path / "x.sqlite"))
    assert out.returncode == 2 and "--model" in out.stderr


async def old_and_parked(app: Path, store: SessionStore) -> None:
    """Sessions ``desk/old`` (idle after a turn) and ``desk/new`` (parked on ``r1``)."""
    async with Runtime([load_agent(app)], store) as rt:
        await rt.session("desk", "old").turn("hello")
        parked = rt.session("desk", "new")
        await parked.start("refund it", turn_id="r1")
        assert (await parked.result("r1", timeout=WAIT)).status == "suspended"
        await rt.idle()


async def test_sessions_list_show_cancel_reset(tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "desk.sqlite"
    await old_and_parked(app, SqliteStore(db))

    listed = cli("sessions", "list", "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t")[:2] for line in listed.stdout.splitlines()]
    assert rows == [["desk/new", "suspended"], ["desk/old", "idle"]]

    shown = cli("sessions", "show", "desk/new", "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    assert "parked: turn r1 waits for input 'approve': Refund 42?" in shown.stdout
    assert "turn r1: suspended" in shown.stdout

    assert cli("sessions", "show", "desk/nobody", "--db", str(db)).returncode == 2
    assert cli("sessions", "show", "nonsense", "--db", str(db)).returncode == 2
    cancelled = cli("sessions", "cancel", "desk/old", "--db", str(db))
    assert cancelled.returncode == 0 and "no unfinished turn" in cancelled.stdout

    reset = cli("sessions", "reset", "desk/new", "--db", str(db))
    assert reset.returncode == 0, reset.stderr
    assert "archived as new#g0, generation 1" in reset.stdout
    async with Runtime([load_agent(app)], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        s = rt.session("desk", "new")
        assert (await s.status(), await s.pending(), await s.transcript()) == ("new", None, [])


def test_serve_a_slack_channel_needs_its_signing_secret(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}

    def serve(channel: str, **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "durable_turns.cli", "serve",
                               str(make_app(tmp_path / channel)), "--channel", channel,
                               "--db", str(tmp_path / "x.sqlite")], capture_output=True,
                              text=True, timeout=WAIT, env={**env, **more})

    out = serve("slack", SLACK_BOT_TOKEN="xoxb-t")
    assert out.returncode == 2 and "SLACK_SIGNING_SECRET" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    unknown = serve("fax")
    assert unknown.returncode == 2 and "known channels: slack" in unknown.stderr


async def test_sessions_commands_manage_a_postgresql_store(tmp_path: Path, pg_dsn: str) -> None:
    from durable_turns import Agent, ModelReply, PostgresStore, scripted
    from durable_turns.errors import ModelError
    from durable_turns.models import ModelRequest

    app = make_app(tmp_path)
    await old_and_parked(app, PostgresStore(pg_dsn))

    def down(request: ModelRequest) -> ModelReply:
        raise ModelError("provider: HTTP 401 authentication_error", provider="provider")

    async with Runtime([Agent("ops")], PostgresStore(pg_dsn), scripted(down)) as rt:
        assert (await rt.session("ops", "s1").turn("hi", turn_id="t1")).status == "failed"

    listed = cli("sessions", "list", "--store", pg_dsn)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t")[:2] for line in listed.stdout.splitlines()]
    assert rows == [["desk/new", "suspended"], ["desk/old", "idle"], ["ops/s1", "idle"]]
    assert [r[0] for r in (line.split("\t") for line in cli(
        "sessions", "list", "--agent", "ops", "--dsn", pg_dsn).stdout.splitlines())] == ["ops/s1"]
    shown = cli("sessions", "show", "desk/new", "--dsn", pg_dsn)
    assert shown.returncode == 0, shown.stderr
    assert "parked: turn r1 waits for input 'approve': Refund 42?" in shown.stdout
    nobody = cli("sessions", "show", "desk/nobody", "--store", pg_dsn)
    assert nobody.returncode == 2 and "has no session desk/nobody" in nobody.stderr
    cancelled = cli("sessions", "cancel", "desk/old", "--store", pg_dsn)
    assert cancelled.returncode == 0 and "no unfinished turn" in cancelled.stdout
    reset = cli("sessions", "reset", "desk/new", "--store", pg_dsn)
    assert reset.returncode == 0, reset.stderr
    assert "archived as new#g0, generation 1" in reset.stdout
    retried = cli("sessions", "retry", "--store", pg_dsn, "--turn", "t1")
    assert retried.returncode == 0, retried.stderr
    assert "turn t1 of ops/s1 re-opened" in retried.stdout
    async with Runtime([load_agent(app)], PostgresStore(pg_dsn),
                       scheduler=NoDriveScheduler()) as rt:
        s = rt.session("desk", "new")
        assert (await s.status(), await s.pending(), await s.transcript()) == ("new", None, [])


async def test_serve_a_channel_without_authentication_exposes_only_its_routes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The README's tunnel recipe: Slack's routes reach the server, the API and console do not.
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s3cret")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-t")
    monkeypatch.setenv("SLACK_API_URL", "http://127.0.0.1:9/api/")  # never called here
    app, db = make_app(tmp_path), tmp_path / "desk.sqlite"
    said: list[bytes] = []
    async with served(app, db, "--channel", "slack", said=said) as (_proc, url), \
            httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
        # A request whose headers never end: serve's uvicorn has a deadline for them
        # (HEADER_TIMEOUT), checked at the end of this block.
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(b"POST /slack/events HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert said[0].rstrip().endswith(b"SIGTERM or Ctrl-C stops"), said
        assert said[1].startswith(b"channel slack: POST ") and b"/slack/events" in said[1]
        assert b"not exposed" in said[2] and b"--expose-api" in said[2]
        for path in ("/", "/agents", "/agents/desk/sessions", "/openapi.json"):
            assert (await client.get(path)).status_code == 404, path
        r = await client.post("/agents/desk/sessions/s1/resume", json={"by": "anyone"})
        assert r.status_code == 404
        unsigned = await client.post("/slack/events", json={"type": "url_verification"})
        assert unsigned.status_code == 401  # the channel's route is there, and checks
        answer = await asyncio.wait_for(reader.read(), WAIT)  # to the end: closed
        assert answer.startswith(b"HTTP/1.1 408 ") and b"RequestTimeout" in answer
        writer.close()
    async with served(app, db, "--channel", "slack", "--expose-api", said=said) as (
            _proc, url), httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
        assert (await client.get("/agents/desk/sessions")).status_code == 200
