"""The app folder (F10, F29): load_agent assembles it, and names the file when it cannot."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from durable_turns import (
    Agent,
    InboundEvent,
    MemoryStore,
    ModelReply,
    Runtime,
    SurfacePolicy,
    load_agent,
    scripted,
)
from durable_turns._loader import load_app
from durable_turns.agent import check_surfaces
from durable_turns.errors import ConfigurationError
from durable_turns.models import ModelRequest

AGENT_PY = '''
from durable_turns import SurfacePolicy

name = "ops"
surfaces = {"slack": SurfacePolicy(mode="replace", deny_tools=["issue_refund"]),
            "email": {"mode": "append"}}

async def authorize_answer(d):
    return d["policy"] == "operator"
'''

REFUND = '''
from durable_turns import ToolContext, tool

@tool
async def issue_refund(order_id: str, ctx: ToolContext) -> dict:
    """Refund an order once a person approves it."""
    ok = await ctx.request_input("approve", f"Refund {order_id}?", schema={"type": "boolean"})
    return {"refunded": ok is True}
'''

LOOKUP = '''
from durable_turns import Tool, ToolSpec

def _run(input, ctx):
    return {"order": input["order_id"]}

tool = Tool(ToolSpec("lookup", "Look an order up.",
                     {"type": "object", "properties": {"order_id": {"type": "string"}}}), _run)
'''


def app(tmp_path: Path, **files: str | None) -> Path:
    root = tmp_path / "agent"
    defaults = {
        "instructions.md": "You run ops.",
        "instructions.slack.md": "Slack rules.",
        "instructions.email.md": "Be formal.",
        "agent.py": AGENT_PY,
        "tools/issue_refund.py": REFUND,
        "tools/lookup.py": LOOKUP,
    }
    for name, text in {**defaults, **files}.items():
        if text is None:
            continue
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


async def test_load_agent_assembles_the_folder(tmp_path: Path) -> None:
    agent = load_agent(app(tmp_path))
    assert agent.name == "ops" and agent.instructions == "You run ops."
    assert sorted(agent.tools_by_name) == ["issue_refund", "lookup"]
    assert agent.tools_by_name["issue_refund"].remote
    assert not agent.tools_by_name["lookup"].remote
    assert agent.surfaces["slack"] == SurfacePolicy("replace", ("issue_refund",), "Slack rules.")
    assert agent.surfaces["email"] == SurfacePolicy("append", (), "Be formal.")
    assert agent.authorize_answer is not None
    assert await agent.authorize_answer({"policy": "operator"}) is True


async def test_an_overlay_with_no_policy_entry_is_appended_for_its_source(
    tmp_path: Path,
) -> None:
    # agent.py names slack and email; sms has only its file
    agent = load_agent(app(tmp_path, **{"instructions.sms.md": "Keep it short."}))
    assert agent.surfaces["sms"] == SurfacePolicy("append", (), "Keep it short.")
    assert agent.surfaces["slack"].mode == "replace"  # a policy entry still wins
    systems: list[str] = []

    def reply(request: ModelRequest) -> ModelReply:
        systems.append(request.system)
        return ModelReply("ok")

    rt = Runtime([agent], MemoryStore(), scripted(reply))
    await rt.open()
    try:
        await rt.session("ops", "s1").turn(event=InboundEvent("sms", {"id": "+1"}, "hi"))
        await rt.session("ops", "s2").turn(event=InboundEvent("web", {"id": "u"}, "hi"))
    finally:
        await rt.close()
    assert systems == ["You run ops.\n\nKeep it short.", "You run ops."]


def test_an_app_folder_without_agent_py_still_gets_its_overlays(tmp_path: Path) -> None:
    agent = load_agent(app(tmp_path, **{"agent.py": None, "tools/issue_refund.py": None}))
    assert agent.surfaces == {"slack": SurfacePolicy("append", (), "Slack rules."),
                              "email": SurfacePolicy("append", (), "Be formal.")}


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"instructions.md": None}, "instructions.md is missing"),
        ({"instructions.slack.md": None}, r"surfaces\['slack'\] \(mode 'replace'\) has no overlay"),
        ({"tools/broken.py": "def oops(:\n"}, r"broken.py: failed to import: SyntaxError"),
        ({"tools/raises.py": "raise RuntimeError('no config')"}, "raises.py: failed to import"),
        ({"tools/empty.py": "x = 1\n"}, "empty.py: a tool module must hold exactly one Tool"),
        ({"tools/two.py": REFUND + LOOKUP}, "two.py: .*found 2: issue_refund, lookup"),
        ({"agent.py": "surfaces = {'slack': {'mode': 'replace', 'deny_tools': ['nope']}}"},
         r"denies unknown tools \['nope'\]"),
        ({"agent.py": "surfaces = {'slack': {'mode': 'sideways'}}"}, "mode must be"),
        ({"agent.py": "authenticate = 'alice'"},
         "agent.py: authenticate must be a function of the request"),
    ],
)
def test_assembly_errors_name_the_file(tmp_path: Path, files: dict[str, str | None],
                                       message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_agent(app(tmp_path, **files))


def test_a_policy_for_a_source_no_channel_emits_logs_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Agent("ops", surfaces={"slack": SurfacePolicy(), "email": SurfacePolicy()})
    with caplog.at_level(logging.WARNING, logger="durable_turns"):
        assert check_surfaces(agent, ["slack"]) == ["email"]
    assert "policy for source 'email'" in caplog.text


def test_policies_for_the_package_s_own_hosts_are_never_reported_unused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """F29: ``chat`` (source cli) and ``serve`` (http) run the same app."""
    agent = Agent("ops", surfaces={"cli": SurfacePolicy(), "http": SurfacePolicy(),
                                   "slak": SurfacePolicy()})
    with caplog.at_level(logging.WARNING, logger="durable_turns"):
        assert check_surfaces(agent, ["cli"]) == ["slak"]
        assert check_surfaces(agent, ["http"]) == ["slak"]
    assert "source 'http'" not in caplog.text and "source 'cli'" not in caplog.text


def test_a_deny_only_policy_needs_no_overlay_file(tmp_path: Path) -> None:
    """F29: denying a tool to a source changes no prompt."""
    root = app(tmp_path, **{"instructions.slack.md": None, "agent.py":
                            "surfaces = {'slack': {'deny_tools': ['issue_refund']}}"})
    policy = load_agent(root).surfaces["slack"]
    assert policy.deny_tools == ("issue_refund",) and not policy.instructions
    with pytest.raises(ConfigurationError, match="has no overlay"):
        load_agent(app(tmp_path / "r", **{"instructions.slack.md": None, "agent.py":
                   "surfaces = {'slack': {'mode': 'replace', 'deny_tools': ['lookup']}}"}))


def test_load_app_takes_authenticate_from_agent_py(tmp_path: Path) -> None:
    root = app(tmp_path, **{"agent.py": "def authenticate(request):\n    return {'id': 'ann'}\n"})
    loaded = load_app(root)
    assert loaded.agent.name == "agent"
    assert loaded.authenticate is not None and loaded.authenticate(None) == {"id": "ann"}
    assert load_app(app(tmp_path / "plain", **{"agent.py": None})).authenticate is None
