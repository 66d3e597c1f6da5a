"""F16: The Slack channel across restarts: real child processes (``slack_child.py``), SIGKILL,
and a new process on the same SQLite file. The fake Web API runs in the test's loop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from durable_turns import SqliteStore
from durable_turns.stores import SessionKey
from fakes.serving import serving
from fakes.slack_api import BOT_USER, TOKEN, SlackFake, block_actions, event_callback, signed

HERE = Path(__file__).resolve().parents[1]
CHILD = HERE / "slack_child.py"
WAIT = 60.0


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


class Child:
    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url

    async def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(self.proc.wait(), WAIT)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), WAIT)


async def _wait_file(path: Path, proc: asyncio.subprocess.Process) -> str:
    async with asyncio.timeout(WAIT):
        while not path.exists():  # the child writes it once it listens: a bounded poll
            if proc.returncode is not None:
                raise AssertionError(f"the child exited with {proc.returncode}")
            await asyncio.sleep(0.05)
    return path.read_text()


@asynccontextmanager
async def child(tmp_path: Path, fake_url: str, tag: str, **env: str) -> AsyncIterator[Child]:
    url_file = tmp_path / f"url-{tag}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), "serve", "--db", str(tmp_path / "s.db"), "--fake",
        fake_url, "--url-file", str(url_file), env=_env(**env))
    c = Child(proc, "")
    try:
        c.url = await _wait_file(url_file, proc)
        yield c
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()


async def _post(url: str, body: dict[str, Any] | bytes) -> httpx.Response:
    raw, headers = signed(body)
    async with httpx.AsyncClient(timeout=WAIT) as http:
        return await http.post(url, content=raw, headers=headers)


async def _turn(db: Path, session: str, turn_id: str) -> Any:
    store = SqliteStore(db)
    await store.open()
    try:
        found = await store.entries(SessionKey("helper", session), turn_id=turn_id)
        return found[0] if found else None
    finally:
        await store.close()


async def test_a_click_after_a_restart_resumes_the_parked_turn(tmp_path: Path) -> None:
    fake = SlackFake()
    effects = tmp_path / "effects.jsonl"
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        async with child(tmp_path, fake_url, "a", EFFECTS=str(effects)) as a:
            envelope = event_callback(f"<@{BOT_USER}> refund 5", ts="100.000001")
            assert (await _post(f"{a.url}/slack/events", envelope)).status_code == 200
            prompt = await fake.wait(
                lambda: next((m for m in fake.thread("C1", "100.000001") if m.blocks
                              and m.blocks[-1]["type"] == "actions"), None), "the prompt")
            session = "slack:T0001:C1:100.000001"

            async def prompt_stored() -> None:
                async with asyncio.timeout(WAIT):
                    while True:
                        t = await _turn(tmp_path / "s.db", session, "slack:C1:100.000001")
                        if "approve" in ((t.data or {}).get("slack") or {}).get("prompts", {}):
                            return
                        await asyncio.sleep(0.05)

            await prompt_stored()
            await a.kill()
        async with child(tmp_path, fake_url, "b", EFFECTS=str(effects)) as b:
            body = block_actions(fake, prompt, user="U1", approve=True)
            assert (await _post(f"{b.url}/slack/actions", body)).status_code == 200
            await fake.wait(lambda: "Approved by <@U1>" in prompt.text, "the verdict")
            done = await fake.wait(
                lambda: next((m for m in fake.thread("C1", "100.000001")
                              if m.markdown == "Refunded order 5." and not m.streaming), None),
                "the reply after the restart")
            assert done.thread_ts == "100.000001"
            await b.stop()
    paid = [json.loads(line) for line in effects.read_text().splitlines()]
    assert [p["order"] for p in paid] == ["5"]


async def test_a_half_streamed_reply_is_finished_with_chat_update_after_a_restart(
        tmp_path: Path) -> None:
    fake = SlackFake()
    gate = tmp_path / "gate"
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        async with child(tmp_path, fake_url, "a", GATE=str(gate)) as a:
            envelope = event_callback(f"<@{BOT_USER}> slow", ts="200.000001")
            assert (await _post(f"{a.url}/slack/events", envelope)).status_code == 200
            streamed = await fake.wait(
                lambda: next((m for m in fake.thread("C1", "200.000001")
                              if m.markdown == "Part one. "), None), "the first part")
            session = "slack:T0001:C1:200.000001"
            async with asyncio.timeout(WAIT):
                while True:  # the stream's ts is stored with the turn before it appends
                    t = await _turn(tmp_path / "s.db", session, "slack:C1:200.000001")
                    if ((t.data or {}).get("slack") or {}).get("stream"):
                        break
                    await asyncio.sleep(0.05)
            await a.kill()
        gate.write_text("open")
        async with child(tmp_path, fake_url, "b", GATE=str(gate)) as b:
            await fake.wait(lambda: streamed.edited, "the chat.update")
            assert streamed.text == "Part one. Part two."
            (update,) = fake.called("chat.update")
            assert update["ts"] == streamed.ts
            assert len(fake.thread("C1", "200.000001")) == 1  # finished, not posted again
            await b.stop()


async def test_a_crash_right_after_the_ack_still_answers(tmp_path: Path) -> None:
    fake = SlackFake()
    gate = tmp_path / "gate"
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        async with child(tmp_path, fake_url, "a", GATE=str(gate)) as a:
            envelope = event_callback(f"<@{BOT_USER}> wait", ts="300.000001")
            assert (await _post(f"{a.url}/slack/events", envelope)).status_code == 200
            await a.kill()  # acknowledged, nothing delivered yet
        assert fake.calls == []
        gate.write_text("open")
        async with child(tmp_path, fake_url, "b", GATE=str(gate)) as b:
            reply = await fake.wait(
                lambda: next((m for m in fake.thread("C1", "300.000001")
                              if not m.streaming), None), "the reply after the restart")
            assert reply.markdown == "Waited."
            assert len(fake.called("chat.startStream")) == 1
            await b.stop()


async def test_a_crash_between_the_turn_and_its_delivery_delivers_on_recovery(
        tmp_path: Path) -> None:
    fake = SlackFake()
    app = tmp_path / "app"
    (app / "tools").mkdir(parents=True)
    (app / "instructions.md").write_text("Post digests.")
    (app / "agent.py").write_text("name = 'helper'\n")
    async with serving(fake.app) as fake_url:
        fake.base = fake_url
        db = tmp_path / "s.db"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), "receive", "--db", str(db), "--fake", fake_url,
            "--turn-id", "digest-1", env=_env())
        assert await asyncio.wait_for(proc.wait(), WAIT) == -signal.SIGKILL
        t = await _turn(db, "digest", "digest-1")
        assert t.status == "completed" and "delivered" not in (t.data or {})
        assert fake.called("chat.postMessage") == []
        # The cron runs the same command again: the owed delivery is made, once.
        cli = Path(sys.executable).parent / "durable-turns"
        cmd = [str(cli), "receive", str(app), "--channel", "slack", "--target", "C9",
               "--seed", "daily digest", "--by", "cron:daily", "--session", "digest",
               "--turn-id", "digest-1", "--db", str(db), "--model", "openai:unused"]
        run = await asyncio.create_subprocess_exec(
            *cmd, env=_env(SLACK_BOT_TOKEN=TOKEN, SLACK_API_URL=f"{fake_url}/api/",
                           OPENAI_API_KEY="unused"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(run.communicate(), WAIT)
        assert run.returncode == 0, err.decode()
        assert json.loads(out)["status"] == "completed"
        (post,) = fake.called("chat.postMessage")
        assert post["channel"] == "C9" and post["text"] == "You said: daily digest"
        t = await _turn(db, "digest", "digest-1")
        assert t.data["delivered"]["receipt"]["channel"] == "C9"
