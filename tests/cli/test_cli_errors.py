"""F12: Every ``durable-turns`` command, given what a person gets wrong: one line on stderr, the
documented exit status, no traceback, and nothing created.

Each row of :data:`BAD` runs one command in a process of its own (as a shell would) on a
bad path, a directory, a file that is not a store, a folder that is not an app, a bad or
busy port, a bad model or a usage error.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

WAIT = 120
"""The bound on every command's run, in seconds."""

AGENT_PY = """
from durable_turns import ModelReply, scripted

name = "desk"
model = scripted(lambda request: ModelReply("Hello."))
"""

Row = tuple[str, list[str], int, str]
"""(id, argv with {placeholders}, exit status, a phrase the one line must hold)."""

STORES = ["--db", "{db}"]
BAD: list[Row] = []
for where, code, said in (("{missing}", 2, "does not exist"), ("{dir}", 2, "is a directory"),
                          ("{notes}", 2, "not a SQLite database")):
    tag = {"{missing}": "missing-dir", "{dir}": "directory", "{notes}": "not-sqlite"}[where]
    BAD += [
        (f"serve-{tag}", ["serve", "{app}", "--db", where], code, said),
        (f"chat-{tag}", ["chat", "{app}", "--db", where], code, said),
        (f"worker-{tag}", ["worker", "{app}", "--store", where], code, said),
        (f"receive-{tag}", ["receive", "{app}", "--channel", "slack", "--target", "C1",
                            "--seed", "hi", "--db", where], code, said),
        (f"demo-{tag}", ["demo", "--db", where], code, said),
        (f"demo-refund-{tag}", ["demo", "refund", "--db", where, "--order", "1", "--amount",
                                "1"], code, said),
    ]
for where, said in (("{missing}", "no such file"), ("{dir}", "is a directory"),
                    ("{notes}", "not a SQLite database")):
    tag = {"{missing}": "missing", "{dir}": "directory", "{notes}": "not-sqlite"}[where]
    BAD += [
        (f"pending-{tag}", ["pending", "{app}", "--db", where], 2, said),
        (f"approve-{tag}", ["approve", "{app}", "--db", where, "--session", "s1"], 2, said),
        (f"deny-{tag}", ["deny", "--app", "{app}", "--db", where, "--turn", "t1"], 2, said),
        (f"sessions-list-{tag}", ["sessions", "list", "--db", where], 2, said),
        (f"sessions-show-{tag}", ["sessions", "show", "desk/s1", "--db", where], 2, said),
        (f"sessions-cancel-{tag}", ["sessions", "cancel", "desk/s1", "--db", where], 2, said),
        (f"sessions-reset-{tag}", ["sessions", "reset", "desk/s1", "--db", where], 2, said),
        (f"sessions-retry-{tag}", ["sessions", "retry", "--db", where, "--turn", "t"], 2, said),
        (f"demo-approve-{tag}", ["demo", "approve", "--db", where, "--turn", "t"], 2,
         said if tag != "missing" else "no such file"),
        (f"demo-pending-{tag}", ["demo", "pending", "--db", where], 2, said),
    ]
BAD += [
    ("serve-port-too-high", ["serve", "{app}", *STORES, "--port", "99999"], 2,
     "'99999' is not a port (1 to 65535)"),
    ("serve-port-zero", ["serve", "{app}", *STORES, "--port", "0"], 2, "is not a port"),
    ("serve-port-word", ["serve", "{app}", *STORES, "--port", "http"], 2, "is not a port"),
    ("serve-port-busy", ["serve", "{app}", *STORES, "--port", "{busy}"], 2,
     "address already in use"),
    ("serve-public-host", ["serve", "{app}", *STORES, "--host", "0.0.0.0"], 2,
     "loopback only"),
    ("serve-no-app", ["serve", "{nowhere}", *STORES], 2, "is not an app folder"),
    ("serve-bad-model", ["serve", "{app}", *STORES, "--model", "nope:x"], 2,
     "unknown provider 'nope'"),
    ("serve-model-without-provider", ["serve", "{app}", *STORES, "--model", "claude"], 2,
     "expected 'scripted' or 'test' (offline) or '<provider>:<model>'"),
    ("serve-no-app-dir", ["serve"], 2, "required: APP_DIR"),
    ("chat-no-app", ["chat", "{nowhere}", *STORES], 2, "is not an app folder"),
    ("chat-bad-model", ["chat", "{app}", *STORES, "--model", "nope:x"], 2, "unknown provider"),
    ("worker-no-app", ["worker", "{nowhere}", "--store", "{db}"], 2, "is not an app folder"),
    ("worker-no-store", ["worker", "{app}"], 2, "required: --store"),
    ("receive-no-app", ["receive", "{nowhere}", "--channel", "slack", "--target", "C1",
                        "--seed", "hi", *STORES], 2, "is not an app folder"),
    ("receive-unknown-channel", ["receive", "{app}", "--channel", "fax", "--target", "C1",
                                 "--seed", "hi", *STORES], 2, "known channels: slack"),
    ("pending-no-app", ["pending", "{nowhere}", *STORES], 2, "is not an app folder"),
    ("pending-no-app-given", ["pending", *STORES], 2, "which app?"),
    ("pending-two-apps", ["pending", "{app}", "--app", "{nowhere}", *STORES], 2,
     "two app folders given"),
    ("pending-db-and-store", ["pending", "{app}", *STORES, "--store", "{db}"], 2,
     "not allowed with argument --db"),
    ("approve-nothing-named", ["approve", "{app}", *STORES], 2, "which turn?"),
    ("approve-no-store-given", ["approve", "{app}", "--turn", "t"], 2,
     "one of the arguments --db --store/--dsn is required"),
    ("sessions-show-bad-key", ["sessions", "show", "nonsense", *STORES], 2,
     "expected AGENT/ID"),
    ("demo-bad-kill-point", ["demo", "--kill-at", "nowhere"], 2, "invalid choice"),
    ("demo-refund-bad-amount", ["demo", "refund", *STORES, "--order", "1", "--amount", "-5"],
     2, "an amount is above 0"),
    ("no-command", [], 2, "required: COMMAND"),
    ("unknown-command", ["launch"], 2, "invalid choice: 'launch'"),
]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def places(tmp_path: Path, busy: int) -> dict[str, str]:
    app = tmp_path / "desk"
    app.mkdir()
    (app / "instructions.md").write_text("You help.")
    (app / "agent.py").write_text(AGENT_PY)
    notes = tmp_path / "notes.txt"
    notes.write_text("groceries: milk, eggs\n" * 50)
    (tmp_path / "a-directory").mkdir()
    return {"app": str(app), "db": str(tmp_path / "fine.sqlite"),
            "missing": str(tmp_path / "no-such-folder" / "x.sqlite"),
            "dir": str(tmp_path / "a-directory"), "notes": str(notes),
            "nowhere": str(tmp_path / "no-app-here"), "busy": str(busy)}


@pytest.mark.parametrize(("argv", "code", "said"), [row[1:] for row in BAD],
                         ids=[row[0] for row in BAD])
def test_a_bad_input_is_one_line_and_its_exit_status(tmp_path: Path, busy_port: int,
                                                     argv: list[str], code: int,
                                                     said: str) -> None:
    where = places(tmp_path, busy_port)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "SLACK_"))},
           "USER": "alice", "SLACK_BOT_TOKEN": "xoxb-test", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "durable_turns.cli",
                           *[a.format(**where) for a in argv]],
                          capture_output=True, text=True, timeout=WAIT, env=env,
                          stdin=subprocess.DEVNULL)
    lines = proc.stderr.splitlines()
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert len(lines) == 1 and lines[0].startswith("durable-turns"), proc.stderr
    assert " error: " in lines[0] and said in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing was created


def test_a_closed_output_ends_a_command_quietly(tmp_path: Path) -> None:
    """``durable-turns sessions list | head -1`` on a store with many sessions."""
    db = tmp_path / "many.sqlite"
    made = subprocess.run([sys.executable, "-c", MANY, str(db)], capture_output=True,
                          text=True, timeout=WAIT)
    assert made.returncode == 0, made.stderr
    proc = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m durable_turns.cli sessions list --db "{db}" | '
                       'head -1; echo "exit ${PIPESTATUS[0]}" >&2'],
        capture_output=True, text=True, timeout=WAIT)
    assert proc.stdout.startswith("desk/"), proc.stdout
    assert proc.stderr == "exit 141\n", proc.stderr


MANY = """
import asyncio, sys
from durable_turns import Agent, ModelReply, Runtime, SqliteStore, scripted

async def main():
    model = scripted(lambda request: ModelReply("Hello."))
    async with Runtime([Agent("desk")], SqliteStore(sys.argv[1]), model) as rt:
        for i in range(3000):
            await rt.session("desk", f"s{i}").start("hi", turn_id="t")
        await rt.idle()

asyncio.run(main())
"""
