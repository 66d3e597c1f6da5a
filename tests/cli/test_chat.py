"""F12: ``durable-turns chat``: the terminal REPL on mount_agent, driven through a pty (pexpect).

Each test runs the real command in a pseudo-terminal and types at it as a person does:
lines, Ctrl-C (``sendintr``), Ctrl-D (``sendeof``), keys while a reply streams.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pexpect

from durable_turns import Runtime, SqliteStore, load_agent
from durable_turns.scheduling import NoDriveScheduler

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
    if not first:
        result = request.messages[-1].result
        return ModelReply("Refund settled." if result["refunded"] else "Refund refused.")
    return ModelReply(f"You said: {opening}")

model = scripted(_reply)
'''

SLOW = '''
import asyncio, pathlib
from durable_turns import Stop, TextDelta

name = "desk"

class Slow:
    """Streams "Thinking", then (for "slow PATH") waits for PATH to exist, then the rest."""

    async def stream(self, request):
        opening = next(m.text for m in reversed(request.messages) if m.is_opening)
        yield TextDelta("Thinking")
        go = pathlib.Path(opening.removeprefix("slow "))
        if opening.startswith("slow "):
            async with asyncio.timeout(60):
                while not go.exists():
                    await asyncio.sleep(0.01)
        yield TextDelta(" about " + go.name + ", done.")
        yield Stop("end_turn")

model = Slow()
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


def make_app(tmp_path: Path, agent_py: str = AGENT_PY) -> Path:
    app = tmp_path / "desk"
    (app / "tools").mkdir(parents=True)
    (app / "instructions.md").write_text("You help.")
    (app / "agent.py").write_text(agent_py)
    for name, text in TOOLS.items():
        (app / "tools" / name).write_text(text)
    return app


@contextmanager
def chatting(app: Path, db: Path) -> Iterator[pexpect.spawn[str]]:
    """``durable-turns chat`` in a pseudo-terminal, as a person runs it (killed if a test
    leaves it running)."""
    child = pexpect.spawn(sys.executable, ["-m", "durable_turns.cli", "chat", str(app),
                                           "--db", str(db), "--user", "ann"],
                          timeout=WAIT, encoding="utf-8")
    try:
        yield child
    finally:
        child.close(force=True)


def ends_cleanly(child: pexpect.spawn[str]) -> None:
    """The chat ends by itself: exit status 0, and no traceback or error on the way."""
    child.expect(pexpect.EOF)
    rest = str(child.before)
    child.close()
    assert child.exitstatus == 0, rest
    assert "Traceback" not in rest and "Error" not in rest, rest


def quits(child: pexpect.spawn[str]) -> None:
    """At the next prompt, Ctrl-D: the chat ends cleanly."""
    child.expect_exact("you> ")
    child.sendeof()
    ends_cleanly(child)


def asks_to_refund(child: pexpect.spawn[str]) -> None:
    """At the next prompt, a turn that parks on the refund's approval."""
    child.expect_exact("you> ")
    child.sendline("refund it")
    child.expect_exact("? Refund order 42? [y/n] ")


async def statuses(app: Path, db: Path) -> list[str]:
    """The statuses of the chat session's turns, as the store has them."""
    async with Runtime([load_agent(app)], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        return [t.status.value for t in await rt.session("desk", "chat").turns()]


def test_chat_streams_asks_inline_and_cancels_on_ctrl_c(tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "chat.sqlite"
    with chatting(app, db) as child:
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
        quits(child)
    asyncio.run(_check_the_store(app, db))  # the chat lives in the store, speaker and all


async def _check_the_store(app: Path, db: Path) -> None:
    async with Runtime([load_agent(app)], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        session = rt.session("desk", "chat")
        opened = [(m.text, m.by) for m in await session.transcript() if m.role == "user"]
        assert opened == [("hi", "ann"), ("refund it", "ann"), ("hold on", "ann")]
        assert [t.status for t in await session.turns()] == ["completed", "completed",
                                                              "cancelled"]


def test_ctrl_d_at_an_approval_ends_the_chat_and_a_reopen_asks_again(tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "chat.sqlite"
    with chatting(app, db) as child:
        asks_to_refund(child)
        child.sendeof()  # Ctrl-D: the chat ends, the turn stays parked
        child.expect_exact("(the turn stays parked, waiting for 'approve': reopen this chat")
        ends_cleanly(child)
    assert asyncio.run(statuses(app, db)) == ["suspended"]

    with chatting(app, db) as child:  # reopened: the waiting request comes first
        child.expect(r"\(turn \w+ of this session waits for an answer\)")
        child.expect_exact("? Refund order 42? [y/n] ")
        child.sendline("maybe")
        child.expect_exact("(answer again, y or n; /cancel withdraws the request, Ctrl-D "
                           "leaves it waiting)")
        child.expect_exact("? Refund order 42? [y/n] ")
        child.sendline("n")
        child.expect_exact("  ✓ refund: {\"refunded\": false}")
        child.expect_exact("agent> Refund refused.")
        child.expect_exact("you> ")
        child.sendline("hi")  # the session takes turns again
        child.expect_exact("agent> You said: hi")
        quits(child)
    assert asyncio.run(statuses(app, db)) == ["completed", "completed"]


def test_ctrl_c_at_an_approval_ends_cleanly_and_the_answer_after_a_reopen_counts(
        tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "chat.sqlite"
    with chatting(app, db) as child:
        asks_to_refund(child)
        child.send("ye")
        child.sendintr()  # Ctrl-C: the chat ends at once, nothing waits for another key
        child.expect_exact("(the turn stays parked, waiting for 'approve'")
        ends_cleanly(child)
    assert asyncio.run(statuses(app, db)) == ["suspended"]

    with chatting(app, db) as child:
        child.expect_exact("? Refund order 42? [y/n] ")
        child.sendline("y")  # the answer typed after the reopen is the one stored
        child.expect_exact("agent> Refund settled.")
        child.expect_exact("you> ")
        child.sendintr()  # Ctrl-C at the prompt ends the chat too
        ends_cleanly(child)
    assert asyncio.run(statuses(app, db)) == ["completed"]


def test_cancel_at_an_approval_withdraws_it(tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "chat.sqlite"
    with chatting(app, db) as child:
        asks_to_refund(child)
        child.sendline("/cancel")
        child.expect_exact("(turn cancelled: withdrawn at the terminal)")
        quits(child)
    assert asyncio.run(statuses(app, db)) == ["cancelled"]


def test_keys_typed_while_the_reply_streams_stay_out_of_its_line(tmp_path: Path) -> None:
    app, db, go = make_app(tmp_path, SLOW), tmp_path / "chat.sqlite", tmp_path / "go"
    with chatting(app, db) as child:
        child.expect_exact("you> ")
        child.sendline(f"slow {go}")
        child.expect_exact("agent> Thinking")
        child.sendline("next one")  # typed while the reply streams: not echoed into it
        go.touch()
        child.expect_exact(" about go, done.\r\n")
        assert "next one" not in str(child.before)
        # The line typed meanwhile is kept: shown after the next prompt, and sent.
        child.expect_exact("you> next one\r\n")
        child.expect_exact("agent> Thinking about next one, done.")
        quits(child)


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


def test_a_piped_chat_reads_as_a_typed_one_and_leaves_a_park_waiting(tmp_path: Path) -> None:
    app, db = make_app(tmp_path), tmp_path / "chat.sqlite"
    proc = subprocess.run([sys.executable, "-m", "durable_turns.cli", "chat", str(app),
                           "--db", str(db), "--user", "ann"], input="hi\nrefund it\n",
                          capture_output=True, text=True, timeout=WAIT)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "you> hi\nagent> You said: hi\n" in proc.stdout
    assert "you> refund it\nagent> Asking first.\n" in proc.stdout
    assert proc.stdout.endswith("? Refund order 42? [y/n] \n(the turn stays parked, waiting "
                                "for 'approve': reopen this chat to answer it, or answer it "
                                "with durable-turns approve)\n")
    assert asyncio.run(statuses(app, db)) == ["completed", "suspended"]



LOCAL_HOLD = '''
from durable_turns import ModelReply, ToolCall, scripted
from durable_turns.models.scripted import calls_this_turn

name = "desk"

def _reply(request):
    opening = next(m.text for m in reversed(request.messages) if m.is_opening)
    if calls_this_turn(request) == 0 and opening.startswith("hold "):
        gate = opening.removeprefix("hold ")
        return ModelReply("Holding.", [ToolCall("c1", "hold", {"gate": gate}),
                                       ToolCall("c2", "hold", {"gate": gate})])
    return ModelReply("asked again")

model = scripted(_reply)
'''
HOLD_TOOL = '''
import pathlib, time
from durable_turns import tool

@tool
def hold(gate: str) -> str:
    """A local tool that holds its step (and the store's write lock) until GATE exists."""
    path = pathlib.Path(gate)
    pathlib.Path(gate + ".running").write_text("yes")
    for _ in range(6000):  # a bounded wait on a file the test writes
        if path.exists():
            return "released"
        time.sleep(0.01)
    return "never released"
'''


def test_ctrl_c_while_a_local_tool_runs_cancels_the_turn_at_its_step(tmp_path: Path) -> None:
    """F7 in the chat: Ctrl-C while a plain-def tool holds its step ends the turn when the
    tool's step ends; the model is not asked again and the batch's next call never runs."""
    app, db = make_app(tmp_path, LOCAL_HOLD), tmp_path / "chat.sqlite"
    (app / "tools" / "hold.py").write_text(HOLD_TOOL)
    gate = tmp_path / "gate"
    running = Path(f"{gate}.running")
    with chatting(app, db) as child:
        child.expect_exact("you> ")
        child.sendline(f"hold {gate}")
        deadline = time.monotonic() + WAIT
        while not running.exists():  # a bounded poll of the file the tool writes
            assert time.monotonic() < deadline, "the local tool never ran"
            time.sleep(0.01)
        child.sendintr()
        child.expect_exact("cancelling the turn")
        gate.write_text("open")
        child.expect_exact("(turn cancelled: cancelled at the terminal)")
        quits(child)
    assert asyncio.run(statuses(app, db))[-1] == "cancelled"
    asyncio.run(_check_one_model_call(app, db))


async def _check_one_model_call(app: Path, db: Path) -> None:
    async with Runtime([load_agent(app)], SqliteStore(db), scheduler=NoDriveScheduler()) as rt:
        transcript = await rt.session("desk", "chat").transcript()
        assert [m.text for m in transcript if m.role == "assistant"] == ["Holding."]
        assert [m.result for m in transcript if m.role == "tool"] == [
            "released", {"cancelled": True}]
