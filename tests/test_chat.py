"""``durable-turns chat``: the terminal REPL on mount_agent, driven through a pty (pexpect)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pexpect

from durable_turns import Runtime, SqliteStore, load_agent

WAIT = 60.0
"""The bound on every expectation."""

AGENT_PY = '''
import asyncio
from durable_turns import ModelReply, ToolCall, scripted
from durable_turns.models.scripted import calls_this_turn

name = "desk"

async def _reply(request):
    opening = next(m.text for m in reversed(request.messages) if m.is_opening)
    first = calls_this_turn(request) == 0
    if first and opening.startswith("refund"):
        return ModelReply("Asking first.", [ToolCall("c1", "refund", {"order_id": "42"})])
    if first and opening.startswith("hold"):
        await asyncio.Event().wait()  # a model that never answers, until Ctrl-C
    return ModelReply(f"You said: {opening}" if first else "Refund settled.")

model = scripted(_reply)
'''

TOOLS = {
    "refund.py": '''
from durable_turns import ToolContext, tool

@tool
async def refund(order_id: str, ctx: ToolContext) -> dict:
    """Refund an order once a person approves it."""
    ok = await ctx.request_input("approve", f"Refund order {order_id}?",
                                 schema={"type": "boolean"})
    return {"refunded": ok is True}
''',
}


def test_chat_streams_asks_inline_and_cancels_on_ctrl_c(tmp_path: Path) -> None:
    app, db = tmp_path / "desk", tmp_path / "chat.sqlite"
    (app / "tools").mkdir(parents=True)
    (app / "instructions.md").write_text("You help.")
    (app / "agent.py").write_text(AGENT_PY)
    for name, text in TOOLS.items():
        (app / "tools" / name).write_text(text)
    child = pexpect.spawn(sys.executable, ["-m", "durable_turns.cli", "chat", str(app),
                                           "--db", str(db), "--user", "ann"],
                          timeout=WAIT, encoding="utf-8")
    try:
        child.expect_exact("you> ")
        child.sendline("hi")
        child.expect_exact("agent> You said: hi")
        child.expect_exact("you> ")
        child.sendline("refund it")
        child.expect_exact("agent> Asking first.\r\n  → refund {\"order_id\": \"42\"}")
        child.expect_exact("? Refund order 42? [y/n] ")
        child.sendline("y")
        child.expect_exact("  ✓ refund: {\"refunded\": true}")
        child.expect_exact("agent> Refund settled.")
        child.expect_exact("you> ")
        child.sendline("hold on")
        child.expect_exact("agent> ")  # the turn has started: Ctrl-C now cancels it
        child.sendintr()
        child.expect_exact("(turn cancelled: cancelled at the terminal)")
        child.expect_exact("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    asyncio.run(_check_the_store(app, db))  # the chat lives in the store, speaker and all


async def _check_the_store(app: Path, db: Path) -> None:
    async with Runtime([load_agent(app)], SqliteStore(db), drive=False) as rt:
        session = rt.session("desk", "chat")
        opened = [(m.text, m.by) for m in await session.transcript() if m.role == "user"]
        assert opened == [("hi", "ann"), ("refund it", "ann"), ("hold on", "ann")]
        assert [t.status for t in await rt.store.turns(session.key)
                if t.kind == "turn"] == ["completed", "completed", "cancelled"]


def test_chat_warns_of_a_policy_for_a_source_it_does_not_emit(tmp_path: Path) -> None:
    app = tmp_path / "desk"
    app.mkdir()
    (app / "instructions.md").write_text("You help.")
    (app / "instructions.cli.md").write_text("Be brief.")  # the REPL's source: no warning
    (app / "instructions.slack.md").write_text("Use Slack's markdown.")
    (app / "agent.py").write_text("from durable_turns import ModelReply, scripted\n"
                                  "name = 'desk'\nmodel = scripted([ModelReply('hi')])\n")
    proc = subprocess.run([sys.executable, "-m", "durable_turns.cli", "chat", str(app),
                           "--db", str(tmp_path / "chat.sqlite"), "--user", "ann"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=WAIT)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "has a policy for source" in line]
    assert warned == ["agent 'desk' has a policy for source 'slack', but no mounted channel "
                      "emits it (mounted: ['cli'])"], proc.stderr
