"""F28: The Teams channel across restarts, as ``durable-turns serve APP --channel teams`` and
``receive --channel teams`` run it: real processes, SIGKILL, and a new process on the same
SQLite file. The fake Bot Connector runs in the test's loop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from durable_turns import SqliteStore
from durable_turns.stores import SessionKey
from fakes.serving import serving
from fakes.teams_api import ALICE, APP_ID, CHANNEL, PERSONAL, TOKEN, TeamsFake

HERE = Path(__file__).resolve().parents[1]
CHILD = HERE / "teams_child.py"
CLI = Path(sys.executable).parent / "durable-turns"
WAIT = 60.0
AGENT_PY = """
from slack_app import Brain

name = "helper"
model = Brain()
"""


def _env(fake: TeamsFake, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "OPENAI_", "TEAMS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env.update(TEAMS_APP_ID=APP_ID, TEAMS_BOT_TOKEN=TOKEN, TEAMS_SERVICE_URL=fake.base,
               TEAMS_OPENID_METADATA_URL=fake.metadata_url, **extra)
    return env


def _app(tmp_path: Path) -> Path:
    app = tmp_path / "app"
    (app / "tools").mkdir(parents=True)
    (app / "instructions.md").write_text("Help in Teams.")
    (app / "instructions.teams.md").write_text("Be brief.")
    (app / "agent.py").write_text(AGENT_PY)
    (app / "tools" / "refund.py").write_text("from slack_app import refund\n")
    return app


async def _turn(db: Path, session: str, turn_id: str) -> Any:
    store = SqliteStore(db)
    await store.open()
    try:
        found = await store.entries(SessionKey("helper", session), turn_id=turn_id)
        return found[0] if found else None
    finally:
        await store.close()


@asynccontextmanager
async def serve(app: Path, db: Path, fake: TeamsFake, **env: str) -> AsyncIterator[str]:
    """``durable-turns serve APP --channel teams`` on a free port; yields its URL once its
    banner names the Teams route."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = await asyncio.create_subprocess_exec(
        str(CLI), "serve", str(app), "--channel", "teams", "--db", str(db), "--port",
        str(port), env=_env(fake, **env), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        assert proc.stdout is not None
        banner: list[bytes] = []
        async with asyncio.timeout(WAIT):
            while not banner or not banner[-1].startswith(b"serving the channels' routes"):
                line = await proc.stdout.readline()
                assert line, (banner, await proc.stderr.read() if proc.stderr else b"")
                banner.append(line)
        assert f"channel teams: POST {url}/teams/messages\n".encode() in banner
        yield url
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), WAIT)


async def test_a_card_posted_before_a_restart_is_answered_after_it(tmp_path: Path) -> None:
    fake = TeamsFake()
    app, db, effects = _app(tmp_path), tmp_path / "s.db", tmp_path / "effects.jsonl"
    async with serving(fake.app) as fake_url, httpx.AsyncClient(timeout=WAIT) as http:
        fake.base = fake_url
        said = fake.message("refund 5", conversation=CHANNEL)
        session, turn_id = f"teams:{CHANNEL}", f"teams:{CHANNEL}:{said['id']}"
        async with serve(app, db, fake, EFFECTS=str(effects)) as url:
            r = await http.post(f"{url}/teams/messages", json=said, headers=fake.headers())
            assert r.status_code == 200
            forged = await http.post(f"{url}/teams/messages", json=said,
                                     headers=fake.headers(aud="another-bot"))
            assert forged.status_code == 401
            prompt = await fake.wait(lambda: fake.prompt(CHANNEL), "the card")
            async with asyncio.timeout(WAIT):
                while True:  # the card's id is stored with the turn once it is posted
                    t = await _turn(db, session, turn_id)
                    if "approve" in ((t.data or {}).get("teams") or {}).get("prompts", {}):
                        break
                    await asyncio.sleep(0.05)
        # SIGKILLed; a new process on the same file takes the click.
        async with serve(app, db, fake, EFFECTS=str(effects)) as url:
            r = await http.post(f"{url}/teams/messages", json=fake.click(prompt, aad=ALICE),
                                headers=fake.headers())
            assert r.json()["value"]["body"][1]["text"] == "Approved by Alice"
            await fake.wait(lambda: any(a.text.endswith("Refunded order 5.")
                                        for a in fake.in_conversation(CHANNEL)),
                            "the reply after the restart")
    assert [json.loads(line)["order"] for line in effects.read_text().splitlines()] == ["5"]


async def test_a_crash_between_the_turn_and_its_delivery_delivers_once_on_recovery(
        tmp_path: Path) -> None:
    fake = TeamsFake()
    app, db = _app(tmp_path), tmp_path / "s.db"
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), "--db", str(db), "--target", PERSONAL,
            "--turn-id", "digest-1", env=_env(fake))
        assert await asyncio.wait_for(proc.wait(), WAIT) == -signal.SIGKILL
        t = await _turn(db, "digest", "digest-1")
        assert t.status == "completed" and "delivered" not in (t.data or {})
        assert fake.calls == []
        cmd = [str(CLI), "receive", str(app), "--channel", "teams", "--target", PERSONAL,
               "--seed", "daily digest", "--by", "cron:daily", "--session", "digest",
               "--turn-id", "digest-1", "--db", str(db)]
        for _ in range(2):  # the cron runs the same command again, and again
            run = await asyncio.create_subprocess_exec(
                *cmd, env=_env(fake), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(run.communicate(), WAIT)
            assert run.returncode == 0, err.decode()
            assert json.loads(out)["status"] == "completed"
        (posted,) = fake.in_conversation(PERSONAL)  # delivered once
        assert posted.text == "You said: daily digest"
        t = await _turn(db, "digest", "digest-1")
        assert t.data["delivered"]["receipt"]["id"] == posted.id


async def test_a_half_streamed_reply_is_finished_by_an_update_after_a_restart(
        tmp_path: Path) -> None:
    fake = TeamsFake()
    app, db, gate = _app(tmp_path), tmp_path / "s.db", tmp_path / "gate"
    async with serving(fake.app) as fake_url, httpx.AsyncClient(timeout=WAIT) as http:
        fake.base = fake_url
        said = fake.message("slow")
        session, turn_id = f"teams:{PERSONAL}", f"teams:{PERSONAL}:{said['id']}"
        async with serve(app, db, fake, GATE=str(gate)) as url:
            r = await http.post(f"{url}/teams/messages", json=said, headers=fake.headers())
            assert r.status_code == 200
            stream = await fake.wait(lambda: next(iter(fake.in_conversation(PERSONAL)), None),
                                     "the first part")
            assert stream.streaming and stream.text == "Part one."
            async with asyncio.timeout(WAIT):
                while True:  # the stream's id is stored with the turn before it appends
                    t = await _turn(db, session, turn_id)
                    if ((t.data or {}).get("teams") or {}).get("stream"):
                        break
                    await asyncio.sleep(0.05)
        gate.write_text("open")  # SIGKILLed mid-stream; the next process finishes it
        async with serve(app, db, fake, GATE=str(gate)):
            await fake.wait(lambda: stream.edited, "the update")
            assert stream.text == "Part one. Part two."
            (put,) = [p for m, p, _b in fake.calls if m == "PUT"]
            assert put == f"/v3/conversations/{PERSONAL}/activities/{stream.id}"
            assert len(fake.in_conversation(PERSONAL)) == 1  # finished, not posted again
