"""F16: The example Slack app folder (``examples/slack_app``): its manifest matches the routes the
channel mounts and the README explains every scope; the agent runs a refund end to end
against the fake Web API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from durable_turns import ModelReply, ModelRequest, ToolCall, load_agent, scripted
from durable_turns.models.scripted import calls_this_turn
from test_slack import world

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "slack_app"


def test_the_manifest_points_slack_at_the_channel_routes() -> None:
    manifest = json.loads((APP / "manifest.json").read_text())
    settings = manifest["settings"]
    assert settings["event_subscriptions"]["request_url"].endswith("/slack/events")
    assert settings["interactivity"]["is_enabled"] is True
    assert settings["interactivity"]["request_url"].endswith("/slack/actions")
    assert "app_mention" in settings["event_subscriptions"]["bot_events"]
    scopes = manifest["oauth_config"]["scopes"]["bot"]
    assert {"app_mentions:read", "chat:write"} <= set(scopes)
    guide = (ROOT / "docs" / "guides" / "slack.md").read_text()
    for scope in scopes:
        assert f"`{scope}`" in guide, f"the Slack guide does not say what {scope} is for"


def _brain(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("Checking with you first.", [ToolCall("c1", "refund", {
            "order_id": "A-12", "amount": 5})])
    return ModelReply(f"Done: {request.messages[-1].result}")


async def test_the_example_agent_refunds_after_a_click(tmp_path: Path) -> None:
    async with world(tmp_path, agent=load_agent(APP), model=scripted(_brain)) as w:
        await w.mention("please refund A-12", ts="10.000001")
        _text, prompt = await w.reply("10.000001", 2, "the prompt")
        assert prompt.text == "Refund $5.00 for order A-12?"
        await w.click(prompt, user="U1")
        msgs = await w.reply("10.000001", 3, "the reply")
        assert msgs[2].markdown.startswith("Done: {'refunded': True")


def test_receive_without_a_bot_token_is_bad_input(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "ANTHROPIC_"))}
    cli = Path(sys.executable).parent / "durable-turns"
    proc = subprocess.run([str(cli), "receive", str(APP), "--channel", "slack", "--target", "C1",
                           "--seed", "hi", "--db", str(tmp_path / "x.db")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "SLACK_BOT_TOKEN" in proc.stderr
    assert not (tmp_path / "x.db").exists()  # nothing was started
