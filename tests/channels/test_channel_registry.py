"""F16: Channels found by name (``channel_from_env``), the built-in ones and an app's own, as
``durable-turns receive --channel NAME`` and ``serve --channel NAME`` use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable_turns.channels import BUILTIN_CHANNELS, Channel, channel_from_env
from durable_turns.channels.slack import SlackChannel
from durable_turns.errors import ConfigurationError

TIMEOUT = 120
"""The bound on every CLI process of these tests."""

AGENT_PY = '''
import json
from pathlib import Path
from durable_turns import ModelReply, scripted

name = "desk"
model = scripted(lambda request: ModelReply("Digest: all quiet."))


class FileChannel:
    """Delivers a turn by appending its end to the file its target names."""

    name = "file"

    def __init__(self, env):
        self.root = Path(env["FILE_CHANNEL_DIR"])

    def mount(self, runtime):
        return []

    async def start(self):
        pass

    async def recover(self):
        return 0

    async def stop(self):
        pass

    async def deliver(self, target, events):
        last = [e async for e in events if e.ends_turn][-1]
        with open(self.root / target["channel_id"], "a") as f:
            f.write(json.dumps(last.to_dict()) + "\\n")
        return {"file": target["channel_id"]}


channels = {"file": FileChannel}
'''


def test_a_channel_is_found_by_name_and_an_unknown_name_lists_the_known() -> None:
    slack = channel_from_env("slack", {"SLACK_BOT_TOKEN": "xoxb-t", "SLACK_SIGNING_SECRET": "s"})
    assert isinstance(slack, SlackChannel) and isinstance(slack, Channel)
    assert sorted(BUILTIN_CHANNELS) == ["slack", "teams"]
    with pytest.raises(ConfigurationError, match="SLACK_BOT_TOKEN"):
        channel_from_env("slack", {})
    with pytest.raises(ConfigurationError, match=r"no channel named 'fax'; known channels: "
                                                 r"mine, slack, teams"):
        channel_from_env("fax", {}, factories={"mine": lambda env: slack})
    assert channel_from_env("mine", {}, factories={"mine": lambda env: slack}) is slack


def test_a_slack_channel_without_its_secret_delivers_but_does_not_serve() -> None:
    from durable_turns import Agent, MemoryStore, Runtime
    from durable_turns.server import create_app

    slack = channel_from_env("slack", {"SLACK_BOT_TOKEN": "xoxb-t"})
    with pytest.raises(ConfigurationError, match="SLACK_SIGNING_SECRET"):
        create_app(Runtime([Agent("desk")], MemoryStore()), channels=[slack])


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable_turns.cli", *args],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env)


def test_receive_delivers_through_an_apps_own_channel(tmp_path: Path) -> None:
    app = tmp_path / "desk"
    (app / "tools").mkdir(parents=True)
    (app / "instructions.md").write_text("You write digests.")
    (app / "agent.py").write_text(AGENT_PY)
    env = {**os.environ, "FILE_CHANNEL_DIR": str(tmp_path)}
    out = _cli("receive", str(app), "--channel", "file", "--target", "digest.jsonl",
               "--seed", "Write the digest.", "--by", "cron:daily", "--turn-id", "d1",
               "--db", str(tmp_path / "desk.sqlite"), env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result == {"turn_id": "d1", "status": "completed", "text": "Digest: all quiet.",
                      "request": None, "error": None, "reason": None}
    (delivered,) = (tmp_path / "digest.jsonl").read_text().splitlines()
    assert json.loads(delivered)["text"] == "Digest: all quiet."
    again = _cli("receive", str(app), "--channel", "file", "--target", "digest.jsonl",
                 "--seed", "Write the digest.", "--by", "cron:daily", "--turn-id", "d1",
                 "--db", str(tmp_path / "desk.sqlite"), env=env)
    assert again.returncode == 0, again.stderr
    assert len((tmp_path / "digest.jsonl").read_text().splitlines()) == 1  # delivered once
    unknown = _cli("receive", str(app), "--channel", "fax", "--target", "x", "--seed", "hi",
                   "--db", str(tmp_path / "desk.sqlite"), env=env)
    assert unknown.returncode == 2
    assert "no channel named 'fax'; known channels: file, slack, teams" in unknown.stderr
