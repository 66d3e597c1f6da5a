"""F12: ``durable-turns``: the CLI, and the demo run for real (child processes, SIGKILL, replay)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import select
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_turns import Agent, Message, Runtime, SqliteStore
from durable_turns._demo import KILL_POINTS
from durable_turns._demo.reach import WatchedModel, unreachable
from durable_turns.errors import ModelError
from durable_turns.records import Answer, StepResult
from durable_turns.testing import get_turn, step_result
from fakes.anthropic_api import Fail, Reply, Text, ToolUse, anthropic_app
from fakes.serving import serving

TIMEOUT = 120
"""The bound on every wait on a CLI process: a backstop, not a timing claim (the demo runs
several Python processes in turn; about 10 s on an idle 2-core machine, over 60 s on a busy one)."""


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_turns.cli", *args],
        capture_output=True, text=True, timeout=TIMEOUT, env=env,
    )


def read_line(fd: int, timeout: float = TIMEOUT) -> bytes:
    """One line from the pipe ``fd``, waiting at most ``timeout`` seconds for it.

    Reads a byte at a time, so nothing after the line is taken from the pipe.
    """
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"timed out waiting for a line on the pipe (got {line!r})")
        byte = os.read(fd, 1)
        if not byte:  # EOF: the writer went away
            break
        line += byte
    return line


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@dataclass
class Left:
    """What a demo run left in its SQLite file and outbox."""

    turn_status: str | None
    transcript: list[Message]
    steps: dict[str, StepResult | None]
    orders: list[tuple[Any, ...]]
    outbox: list[dict[str, Any]]


async def read_left(db: Path, stdout: str) -> Left:
    m = re.search(r"session\s+(\S+), turn (\S+)", stdout)
    assert m, stdout
    session_id, turn_id = m.groups()
    store = SqliteStore(db)
    async with Runtime([Agent("ops")], store) as rt:
        session = rt.session("ops", session_id)
        transcript = [x for x in await session.transcript() if x.turn_id == turn_id]
        rec = await get_turn(store, session.key, turn_id)
        steps = {}
        for i, msg in enumerate(await session.transcript()):
            if msg.turn_id != turn_id:
                continue
            if msg.role == "assistant":
                steps[f"model:{i}"] = await step_result(store, session.key, f"model:{i}")
                for c in msg.tool_calls:
                    sid = f"tool:{i}:{c.id}"
                    steps[sid] = await step_result(store, session.key, sid)
        orders = store.unwrap().execute(
            "SELECT call_id, item, quantity, delivery FROM orders WHERE turn_id = ? "
            "ORDER BY order_id", (turn_id,)
        ).fetchall()
    outbox_file = db.with_name(db.name + "-outbox.jsonl")
    lines = outbox_file.read_text().splitlines() if outbox_file.exists() else []
    outbox = [e for e in map(json.loads, lines) if e["turn_id"] == turn_id]
    return Left(rec.status if rec else None, transcript, steps, orders, outbox)


def assert_well_formed(t: list[Message]) -> None:
    """One opening; one tool message per call id; ends on an answer without calls."""
    assert [m.role for m in t if m.is_opening] == ["user"]
    assert t[0].is_opening
    calls = [c.id for m in t if m.role == "assistant" for c in m.tool_calls]
    answered = Counter(m.call_id for m in t if m.role == "tool")
    assert len(calls) == len(set(calls))
    assert answered == Counter(calls)
    assert t[-1].role == "assistant" and not t[-1].tool_calls
    assert not any(m.is_error for m in t)


# -- help ------------------------------------------------------------------------------------


def test_help() -> None:
    top = cli("--help")
    assert top.returncode == 0
    assert "demo" in top.stdout
    assert "demo-child" not in top.stdout  # the child's subcommand stays hidden
    for command in ("approve", "deny", "pending", "serve", "chat"):
        assert command in top.stdout
    demo = cli("demo", "--help")
    assert demo.returncode == 0
    for word in ("--db", "--keep", "--kill-at", *KILL_POINTS, "exit status", "--model",
                 "ANTHROPIC_API_KEY", "scripted"):
        assert word in demo.stdout
    for command, words in {"refund": ("--order", "--amount", "--user", "--approver"),
                           "approve": ("--turn", "--input", "--deny", "--by")}.items():
        out = cli("demo", command, "--help")
        assert out.returncode == 0
        for word in (*words, "--db", "--model", "exit status"):
            assert word in out.stdout


def test_no_command_is_a_usage_error() -> None:
    out = cli()
    assert out.returncode == 2
    assert "COMMAND" in out.stderr


# -- the demo --------------------------------------------------------------------------------

ORDER_DELIVERIES = {  # which delivery wrote each order, by kill point
    "after-order-2": [1, 1, 2],
    "inside-order-2": [1, 2, 2],  # the killed process's 2nd INSERT was rolled back
    "inside-notify": [1, 1, 1],
}


@pytest.mark.parametrize("kill_at", list(KILL_POINTS))
async def test_demo_kills_mid_turn_and_nothing_runs_twice(tmp_path: Path, kill_at: str) -> None:
    db = tmp_path / "demo.sqlite"
    out = cli("demo", "--db", str(db), "--kill-at", kill_at)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr == ""
    text = out.stdout
    assert "scripted" in text and "no ANTHROPIC_API_KEY is set" in text
    assert "SIGKILL sent to pid" in text and "(exit status -9)" in text
    assert "VERDICT: PASS" in text and "✗" not in text.split("SIGKILL sent")[1]
    assert "\x1b[" not in text  # not a terminal: no escape codes
    # The redelivery streams only the steps it runs: no cached model text is re-emitted.
    second = text.split("delivery 2 · pid")[1].split("what the store shows")[0]
    assert "Ordering keyboard" not in second

    left = await read_left(db, text)
    assert left.turn_status == "completed"
    assert_well_formed(left.transcript)
    assert left.transcript[-1].text.startswith("Done: I ordered keyboard (order #1)")
    assert all(v is not None for v in left.steps.values())
    assert len(left.steps) == 9  # 5 model steps, 4 tool steps
    assert [(c, i, q) for c, i, q, _ in left.orders] == [
        ("order-1", "keyboard", 1), ("order-2", "mouse", 1), ("order-3", "monitor", 1)
    ]
    assert [d for *_, d in left.orders] == ORDER_DELIVERIES[kill_at]
    keys = {e["key"] for e in left.outbox}
    assert len(keys) == 1
    deliveries = [e["delivery"] for e in left.outbox]
    assert deliveries == ([1, 2] if kill_at == "inside-notify" else [2])


async def test_demo_twice_on_one_database(tmp_path: Path) -> None:
    db = tmp_path / "ops.sqlite"
    first = cli("demo", "--db", str(db))
    second = cli("demo", "--db", str(db))
    assert first.returncode == 0 and second.returncode == 0, second.stdout + second.stderr
    for out in (first, second):
        left = await read_left(db, out.stdout)
        assert_well_formed(left.transcript)
        assert len(left.orders) == 3
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (6,)
    conn.close()


def test_demo_temp_dir_is_removed_unless_kept(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = cli("demo", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []
    kept = cli("demo", "--keep", env=env)
    assert kept.returncode == 0
    (workdir,) = tmp_path.iterdir()
    assert f"kept {workdir}" in kept.stdout
    assert (workdir / "demo.sqlite").exists()
    assert (workdir / "demo.sqlite-outbox.jsonl").exists()


# -- bad input -------------------------------------------------------------------------------


def test_demo_refuses_a_file_that_is_not_sqlite_and_leaves_it_alone(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"groceries: milk, eggs\n" * 100)
    before = digest(notes)
    out = cli("demo", "--db", str(notes))
    assert out.returncode == 2
    assert "durable-turns demo: error:" in out.stderr
    assert "not a SQLite database or is corrupt" in out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout == ""
    assert digest(notes) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_demo_refuses_another_applications_database(tmp_path: Path) -> None:
    db = tmp_path / "crm.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.close()
    before = digest(db)
    out = cli("demo", "--db", str(db))
    assert out.returncode == 2
    assert "another application" in out.stderr
    assert digest(db) == before


@pytest.mark.parametrize("where", ["directory", "missing-parent"])
def test_demo_refuses_a_path_it_cannot_use(tmp_path: Path, where: str) -> None:
    db = tmp_path if where == "directory" else tmp_path / "nowhere" / "demo.sqlite"
    out = cli("demo", "--db", str(db))
    assert out.returncode == 2
    assert ("is a directory" if where == "directory" else "does not exist") in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_child_kill_point_needs_a_control_pipe(tmp_path: Path) -> None:
    out = cli("demo-child", "--db", str(tmp_path / "x.sqlite"), "--session", "s",
              "--turn", "t", "--delivery", "1", "--kill-at", "after-order-2")
    assert out.returncode == 2
    assert "--control-fd" in out.stderr


def test_a_paused_child_leaves_when_its_parent_goes_away(tmp_path: Path) -> None:
    """Closing the paused child's stdin (what the parent's death does) ends it: no orphan."""
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_turns.cli", "demo-child",
         "--db", str(tmp_path / "w.sqlite"), "--session", "s", "--turn", "t",
         "--delivery", "1", "--kill-at", "after-order-2", "--control-fd", str(write_fd)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=(write_fd,),
    )
    os.close(write_fd)
    try:
        assert read_line(read_fd) == b"paused after-order-2\n"
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=TIMEOUT) == 70
    finally:
        os.close(read_fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)


# -- approval across processes: refund, pending, approve -------------------------------------

ALICE = {"USER": "alice", "LOGNAME": "alice"}


def run(*args: str, user: str = "alice", **env: str) -> tuple[int, str, str, int]:
    """One CLI process: (exit code, stdout, stderr, pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_turns.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "USER": user, "LOGNAME": user, **env},
    )
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err, proc.pid


def demo(*args: str, user: str = "alice", **env: str) -> tuple[int, str, str, int]:
    """``durable-turns demo …`` in a process of its own: as :func:`run`."""
    return run("demo", *args, user=user, **env)


def parked_turn(stdout: str) -> str:
    m = re.search(r"--turn (turn-[0-9a-f]+) --input approve-refund", stdout)
    assert m, stdout
    return m.group(1)


def refunds(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT order_id, amount, requested_by, pid, attempts, key "
                            "FROM refunds ORDER BY refund_id").fetchall()
    conn.close()
    return rows


async def turn_of(db: Path, turn_id: str
                  ) -> tuple[str | None, list[Message], StepResult | None]:
    """The turn's status, its messages, and the stored answer step."""
    store = SqliteStore(db)
    async with Runtime([Agent("ops")], store) as rt:
        (agent, session_id), = store.unwrap().execute(
            "SELECT s.agent, s.session FROM turns t JOIN sessions s USING (sid) "
            "WHERE t.turn_id = ?", (turn_id,)).fetchall()
        session = rt.session(agent, session_id)
        rec = await get_turn(store, session.key, turn_id)
        messages = [m for m in await session.transcript() if m.turn_id == turn_id]
        answer = await step_result(store, session.key, f"input:{turn_id}:approve-refund")
    return (rec.status if rec else None), messages, answer


def assert_refused(code: int, out: str, err: str, command: str, *needles: str) -> None:
    assert code == 2, out + err
    assert err.startswith(f"durable-turns {command}: error: "), err
    assert err.count("\n") == 1, err  # one line
    for needle in needles:
        assert needle in err
    assert "Traceback" not in err and out == ""


async def test_refund_parks_and_a_second_process_approves_it(tmp_path: Path) -> None:
    db = tmp_path / "shop.sqlite"
    code, out, err, refund_pid = demo("refund", "--db", str(db), "--order", "42",
                                     "--amount", "30")
    assert code == 0 and err == "", out + err
    assert "scripted" in out and "no ANTHROPIC_API_KEY is set" in out
    assert "input.requested" in out and "Approve a $30 refund on order 42?" in out
    assert f"The turn is parked. pid {refund_pid} now exits" in out
    turn = parked_turn(out)
    # The refund process is gone and paid nothing: the park is a row in the file, no more.
    assert refunds(db) == []
    status, messages, answer = await turn_of(db, turn)
    assert status == "suspended" and answer is None
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].by == "alice"

    code, out, err, _ = demo("pending", "--db", str(db))
    assert code == 0 and err == ""
    assert turn in out and "approve-refund" in out and "only cli:alice may answer" in out
    assert f"--turn {turn} --input approve-refund --by cli:alice" in out

    # Bad answers are refused with a clear message, exit 2, no traceback, nothing stored.
    assert_refused(*demo("approve", "--db", str(db), "--turn", turn, user="mallory")[:3],
                   "demo approve", "ResumeAuthorizationError", "only user 'cli:alice' may answer",
                   "'mallory' may not")
    assert_refused(*demo("approve", "--db", str(db), "--turn", turn, "--by", "bob")[:3],
                   "demo approve", "ResumeAuthorizationError")
    assert_refused(*demo("approve", "--db", str(db), "--turn", turn, "--input", "approve")[:3],
                   "demo approve", "ResumeConflictError", "waits for input 'approve-refund'")
    assert_refused(*demo("approve", "--db", str(db), "--turn", "turn-nope")[:3],
                   "demo approve", "no turn 'turn-nope'", "durable-turns demo pending")
    assert refunds(db) == []
    assert (await turn_of(db, turn))[0] == "suspended"

    code, out, err, approve_pid = demo("approve", "--db", str(db), "--turn", turn,
                                      "--input", "approve-refund")
    assert code == 0 and err == "", out + err
    assert f"pid {approve_pid} replays the turn" in out
    assert "issue_refund → {\"refunded\": true" in out
    assert "answer: Refunded $30 on order 42 (refund #1), as approved." in out
    assert f"pid {approve_pid} (this process)" in out
    # Paid exactly once, by the approving process, after the answer; keyed by the step.
    (row,) = refunds(db)
    assert row[:5] == ("42", 30.0, "alice", approve_pid, 1)
    assert row[5][:12] + "…" in out
    status, messages, answer = await turn_of(db, turn)
    assert status == "completed"
    assert_well_formed(messages)
    assert answer == Answer(True, "alice")
    (result,) = [m.result for m in messages if m.role == "tool"]
    assert result["refunded"] is True and result["idempotency_key"] == row[5]

    # Answering twice: the same answer by the same person is one answer (a double click),
    # another answer is a conflict; nothing is paid again either way.
    code, out, err, _ = demo("approve", "--db", str(db), "--turn", turn)
    assert code == 0 and err == "", out + err
    assert "(given already: the same answer)" in out and "nothing runs again" in out
    assert "replays the turn" not in out
    assert_refused(*demo("approve", "--db", str(db), "--turn", turn, "--deny")[:3], "demo approve",
                   "ResumeConflictError", "answered already", "already completed")
    assert len(refunds(db)) == 1
    code, out, _, _ = demo("pending", "--db", str(db))
    assert code == 0 and "nothing" in out and "is waiting for input" in out


async def test_a_denied_refund_pays_nothing(tmp_path: Path) -> None:
    db = tmp_path / "shop.sqlite"
    code, out, err, _ = demo("refund", "--db", str(db), "--order", "A-7", "--amount", "12.50")
    assert code == 0, out + err
    turn = parked_turn(out)
    code, out, err, _ = demo("approve", "--db", str(db), "--turn", turn, "--deny")
    assert code == 0 and err == "", out + err
    assert "approve-refund = no (--deny), by alice" in out
    assert "answer: The refund of $12.50 on order A-7 was not approved" in out
    assert refunds(db) == []
    status, messages, answer = await turn_of(db, turn)
    assert status == "completed"
    assert answer == Answer(False, "alice")
    assert [m.result for m in messages if m.role == "tool"] == [
        {"refunded": False, "order_id": "A-7", "amount": 12.5}]


async def test_an_approver_other_than_the_asker(tmp_path: Path) -> None:
    db = tmp_path / "shop.sqlite"
    code, out, err, _ = demo("refund", "--db", str(db), "--order", "7", "--amount", "5",
                            "--approver", "bob", "--session", "desk-1")
    assert code == 0, out + err
    assert "ops/desk-1" in out and "--by cli:bob" in out
    turn = parked_turn(out)
    # One park at a time: the session takes no other turn until this one is answered.
    busy = demo("refund", "--db", str(db), "--order", "8", "--amount", "5", "--session",
               "desk-1")
    assert_refused(*busy[:3], "demo refund", "is parked on turn", "durable-turns demo pending")
    assert_refused(*demo("approve", "--db", str(db), "--turn", turn)[:3], "demo approve",
                   "only user 'cli:bob' may answer", "'alice' may not")
    code, out, err, pid = demo("approve", "--db", str(db), "--turn", turn, "--by", "bob")
    assert code == 0, out + err
    assert [r[:4] for r in refunds(db)] == [("7", 5.0, "alice", pid)]


def test_approval_commands_refuse_bad_input(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite"
    assert_refused(*demo("approve", "--db", str(missing), "--turn", "t")[:3], "demo approve",
                   "no such file")
    assert_refused(*demo("pending", "--db", str(missing))[:3], "demo pending", "no such file")
    assert not missing.exists()
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n" * 50)
    before = digest(notes)
    assert_refused(*demo("pending", "--db", str(notes))[:3], "demo pending",
                   "not a SQLite database")
    assert digest(notes) == before
    for bad in (["--amount", "-5"], ["--amount", "1.234"], ["--amount", "ten"],
                ["--order", "4 2"], ["--user", " "]):
        args = {"--order": "42", "--amount": "30", **dict(zip(bad[::2], bad[1::2], strict=True))}
        out = cli("demo", "refund", "--db", str(tmp_path / "r.sqlite"),
                  *[x for kv in args.items() for x in kv])
        assert out.returncode == 2 and "Traceback" not in out.stderr, (bad, out.stderr)
        assert bad[0] in out.stderr
    assert not (tmp_path / "r.sqlite").exists()


def test_approve_refuses_a_turn_that_is_not_parked(tmp_path: Path) -> None:
    db = tmp_path / "ops.sqlite"
    ran = cli("demo", "--db", str(db))
    assert ran.returncode == 0
    m = re.search(r"session\s+\S+, turn (\S+)", ran.stdout)
    assert m
    assert_refused(*demo("approve", "--db", str(db), "--turn", m.group(1))[:3], "demo approve",
                   "ResumeConflictError", "not waiting for input", "already completed")


# -- which model -------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "needle"), [
    ("nope:x", "unknown provider 'nope'"),
    ("claude", "expected 'scripted' or '<provider>:<model>'"),
    ("openai:gpt-4o", "OPENAI_API_KEY"),
    ("anthropic:claude-sonnet-4-5", "no credentials"),
])
def test_an_unusable_model_fails_clearly_before_anything_runs(tmp_path: Path, spec: str,
                                                              needle: str) -> None:
    db = tmp_path / "m.sqlite"
    for command in (["demo"], ["demo", "refund", "--order", "1", "--amount", "1"]):
        code, out, err, _ = run(*command, "--db", str(db), "--model", spec, HOME=str(tmp_path))
        assert code == 2, out + err
        assert f"durable-turns {' '.join(command[:2])}: error: --model: " in err and needle in err
        assert "Traceback" not in err and out == ""
    assert not db.exists()


def test_model_scripted_overrides_an_anthropic_key(tmp_path: Path) -> None:
    # The base URL is a closed port: had the demo called Anthropic, it would have failed.
    code, out, err, _ = demo("--db", str(tmp_path / "d.sqlite"), "--model", "scripted",
                            ANTHROPIC_API_KEY="sk-test", ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    assert code == 0, out + err
    assert "model    scripted (offline, deterministic): chosen with --model" in out
    assert "VERDICT: PASS" in out


def ops_replies(body: dict[str, Any]) -> Reply:
    """The fake Anthropic model's side of the demo's two stories, read off the request."""
    messages = body["messages"]
    opening = messages[0]["content"]
    opening = opening if isinstance(opening, str) else opening[0]["text"]
    results = [b for m in messages if m["role"] == "user" and not isinstance(m["content"], str)
               for b in m["content"] if b.get("type") == "tool_result"]
    if opening.startswith("Refund"):
        if not results:
            return Reply([Text("I need approval for that."),
                          ToolUse("issue_refund", {"order_id": "42", "amount": 30})])
        paid = json.loads(results[0]["content"]).get("refunded")
        return Reply([Text("Refund issued." if paid else "Refund declined.")])
    items = ["keyboard", "mouse", "monitor"]
    if len(results) < len(items):
        return Reply([ToolUse("create_order", {"item": items[len(results)]})])
    if len(results) == len(items):
        return Reply([ToolUse("notify", {"channel": "#ops", "text": "three orders placed"})])
    return Reply([Text("Ordered a keyboard, a mouse and a monitor, and told #ops.")])


async def arun(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """A CLI process that does not block this loop (which serves the fake API)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_turns.cli", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    finally:
        if proc.returncode is None:  # timed out: leave no child behind
            proc.kill()
            await asyncio.wait_for(proc.wait(), TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def fake_anthropic(tmp_path: Path) -> AsyncIterator[tuple[Any, dict[str, str]]]:
    """The fake Messages API on loopback, and an environment whose key points at it."""
    app = anthropic_app([ops_replies] * 20)
    async with serving(app) as url:
        yield app, {**os.environ, **ALICE, "HOME": str(tmp_path),
                    "ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": url}


async def test_demo_uses_anthropic_when_its_key_is_set(
    tmp_path: Path, fake_anthropic: tuple[Any, dict[str, str]]
) -> None:
    app, env = fake_anthropic
    db = tmp_path / "demo.sqlite"
    code, out, err = await arun("demo", "--db", str(db), env=env)
    assert code == 0, out + err
    assert ("model    anthropic:claude-sonnet-4-5 (a real model, over the network): "
            "ANTHROPIC_API_KEY is set") in out
    assert "VERDICT: PASS" in out and "SIGKILL sent to pid" in out
    models = {r["body"]["model"] for r in app.state.requests}
    assert models == {"claude-sonnet-4-5"}
    # Five model steps; the two committed before the kill were not asked again.
    assert len(app.state.requests) == 5
    left = await read_left(db, out)
    assert left.turn_status == "completed"
    assert_well_formed(left.transcript)
    assert [item for _, item, *_ in left.orders] == ["keyboard", "mouse", "monitor"]
    assert [d for *_, d in left.orders] == ORDER_DELIVERIES["after-order-2"]
    assert len({call for call, *_ in left.orders}) == 3


async def test_refund_and_approve_on_anthropic_across_processes(
    tmp_path: Path, fake_anthropic: tuple[Any, dict[str, str]]
) -> None:
    app, env = fake_anthropic
    db = tmp_path / "shop.sqlite"
    code, out, err = await arun("demo", "refund", "--db", str(db), "--order", "42",
                                "--amount", "30", env=env)
    assert code == 0, out + err
    assert "anthropic:claude-sonnet-4-5" in out and len(app.state.requests) == 1
    turn = parked_turn(out)
    assert refunds(db) == []
    code, out, err = await arun("demo", "approve", "--db", str(db), "--turn", turn, env=env)
    assert code == 0, out + err
    assert "answer: Refund issued." in out
    assert len(app.state.requests) == 2  # the first model step was replayed from the store
    (row,) = refunds(db)
    assert row[:3] == ("42", 30.0, "alice")


# -- a model that cannot be reached ------------------------------------------------------------


def closed_port() -> int:
    """A loopback port nothing listens on (it was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_demo_says_it_could_not_reach_the_model_on_its_last_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "durable_turns.cli", "demo", "--db", str(tmp_path / "d.sqlite"),
         "--model", "anthropic:claude-x"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT,
        env={**os.environ, **ALICE, "ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": url},
    )
    assert proc.returncode == 1, proc.stdout
    assert last_line(proc.stdout).startswith(
        f"durable-turns demo: error: could not reach the model at {url}/"
    ), proc.stdout
    assert "connection failed" in last_line(proc.stdout)
    assert "kill point" not in last_line(proc.stdout)  # the model's behaviour is not blamed
    assert "Traceback" not in proc.stdout


async def test_demo_says_it_could_not_reach_the_model_on_redelivery(tmp_path: Path) -> None:
    # Delivery 1 gets the two replies it needs to reach its kill point; then the API is
    # overloaded (retryable) for delivery 2, past the engine's three retries.
    overloaded = Fail(529, "Overloaded", headers={"x-should-retry": "false"})
    app = anthropic_app([ops_replies, ops_replies, *[overloaded] * 4])
    async with serving(app) as url:
        env = {**os.environ, **ALICE, "HOME": str(tmp_path),
               "ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": url}
        code, out, err = await arun("demo", "--db", str(tmp_path / "d.sqlite"), env=env)
    assert code == 1, out + err
    assert "SIGKILL sent to pid" in out
    assert last_line(err).startswith(f"durable-turns demo: error: could not reach the model "
                                     f"at {url}/v1/messages: HTTP 529 overloaded_error: "
                                     "Overloaded"), err


class _Client:
    base_url = "http://models.internal:8000/v1/"


class _Model:
    client = _Client()


class ConnectError(Exception):
    """Named like httpx's: recognised by name, so no SDK is imported to tell."""


def test_which_model_errors_mean_the_model_was_not_reached() -> None:
    answered = ModelError("anthropic: HTTP 400 invalid_request_error: bad", provider="anthropic",
                          status=400)
    assert unreachable(answered, _Model()) is None  # the model was reached and said no
    refused = ModelError("openai: connection failed: refused", provider="openai",
                         retryable=True)
    refused.__cause__ = ConnectionRefusedError("refused")
    assert unreachable(refused, WatchedModel(_Model())) == (  # type: ignore[arg-type]
        "could not reach the model at http://models.internal:8000/v1/: connection failed: "
        "refused")
    odd = ModelError("x: the stream broke", provider="x")
    odd.__context__ = ConnectError("reset")
    assert unreachable(odd) == "could not reach the model at its API: the stream broke"
