"""F12, F6: ``durable-turns pending | approve | deny`` for any app folder, on SQLite and PostgreSQL:
real processes, the shipped ``examples/ops`` app, and the refusals that keep one app's
command off another app's database."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from durable_turns import (
    Agent,
    InboundEvent,
    ModelReply,
    PostgresStore,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    load_agent,
    scripted,
    tool,
)
from durable_turns.models.scripted import calls_this_turn
from durable_turns.scheduling import NoDriveScheduler
from durable_turns.stores import SessionStore

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "examples" / "ops"
HELPDESK = ROOT / "examples" / "slack_app"
WAIT = 120
"""The bound on every command's run, in seconds."""


def cli(*args: str, user: str = "ann") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "USER": user, "LOGNAME": user}
    return subprocess.run([sys.executable, "-m", "durable_turns.cli", *args],
                          capture_output=True, text=True, timeout=WAIT, env=env,
                          stdin=subprocess.DEVNULL)


async def park_a_refund(store: SessionStore, session: str = "s1") -> str:
    """``examples/ops`` asked by ann to refund order 42: parked on ``approve-refund``."""
    async with Runtime([load_agent(OPS)], store) as rt:
        s = rt.session("ops", session)
        done = await s.turn("order a keyboard")
        assert done.text == "Ordered keyboard (order #1)."
        text = "refund order 42, $30"
        started = await s.start(text, event=InboundEvent("http", {"id": "ann",
                                                                  "attested": True}, text))
        parked = await s.result(started.turn_id)
        assert parked.status == "suspended"
        return started.turn_id


def tables(db: Path) -> list[str]:
    with closing(sqlite3.connect(db)) as conn:
        return sorted(r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"))


def refused(out: subprocess.CompletedProcess[str], command: str, *needles: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith(f"durable-turns {command}: error: "), out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    for needle in needles:
        assert needle in out.stderr, out.stderr


async def test_pending_lists_an_app_s_park_and_approve_finishes_it(tmp_path: Path) -> None:
    db = tmp_path / "ops.sqlite"
    turn = await park_a_refund(SqliteStore(db))

    listed = cli("pending", str(OPS), "--db", str(db))
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert f"session s1, turn {turn}, input 'approve-refund' (in tool refund)" in listed.stdout
    assert "Refund $30.00 on order 42?" in listed.stdout
    assert "asked by ann; only http:ann may answer" in listed.stdout
    suggested = [line.strip() for line in listed.stdout.splitlines()
                 if line.strip().startswith("durable-turns ")]
    assert [s.split()[1] for s in suggested] == ["approve", "deny"]
    assert f"--session s1 --turn {turn} --input approve-refund --by http:ann" in suggested[0]

    refused(cli("approve", str(OPS), "--db", str(db), "--session", "s1", user="bob"),
            "approve", "only user 'http:ann' may answer", "'bob' may not")
    done = cli(*suggested[0].split()[1:])  # the command pending suggested, as printed
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(f"answered 'approve-refund' of turn {turn} (ops/s1): "
                                  "true, by http:ann (stored)\n")
    assert "  ✓ refund: {\"refunded\": true" in done.stdout
    assert "agent> Refunded $30.00 on order 42" in done.stdout
    assert done.stdout.endswith("the turn completed\n")

    # (the answer's by is the identity the request named, as the suggestion said it)
    again = cli("approve", str(OPS), "--db", str(db), "--turn", turn, "--by", "http:ann")
    assert again.returncode == 0, again.stderr
    assert "was answered already, true by http:ann: the same answer, so nothing runs again" \
        in again.stdout
    refused(cli("deny", str(OPS), "--db", str(db), "--turn", turn), "deny",
            "answered already by 'http:ann' (true), with another answer than this one")
    refused(cli("approve", str(OPS), "--db", str(db), "--turn", turn, user="bob"), "approve",
            "answered already by 'http:ann' (true), with the same answer")
    nothing = cli("pending", "--app", str(OPS), "--db", str(db))
    assert nothing.stdout == f"nothing in {db} is waiting for input\n"


async def test_deny_and_an_answer_that_is_not_yes_or_no(tmp_path: Path) -> None:
    db = tmp_path / "ops.sqlite"
    await park_a_refund(SqliteStore(db))
    denied = cli("deny", str(OPS), "--db", str(db), "--session", "s1")
    assert denied.returncode == 0, denied.stderr
    assert "agent> The $30.00 refund on order 42 was not approved: nothing was paid." in \
        denied.stdout

    @tool
    async def pick(ctx: ToolContext) -> dict[str, Any]:
        """Ask which size."""
        return {"size": await ctx.request_input("size", "Which size?",
                                                schema={"enum": ["S", "M"]})}

    def reply(request: Any) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("", [ToolCall("p1", "pick", {})])
        return ModelReply(f"Size {request.messages[-1].result['size']}.")

    app = tmp_path / "shop"
    (app / "tools").mkdir(parents=True)
    (app / "instructions.md").write_text("You pick sizes.")
    (app / "agent.py").write_text("name = 'ops'\n")
    (app / "tools" / "pick.py").write_text(PICK)
    async with Runtime([Agent("ops", "", [pick])], SqliteStore(db), scripted(reply)) as rt:
        s = rt.session("ops", "s2")
        started = await s.start("which size?")
        assert (await s.result(started.turn_id)).status == "suspended"
    refused(cli("approve", str(app), "--db", str(db), "--session", "s2", "--model",
                "scripted"), "approve", "asks for more than yes or no", "--value JSON")
    refused(cli("deny", str(app), "--db", str(db), "--session", "s2", "--model", "scripted"),
            "deny", "approve --value JSON")
    refused(cli("approve", str(app), "--db", str(db), "--session", "s2", "--model",
                "scripted", "--value", '"XL"'), "approve", "'XL' is not one of ['S', 'M']")
    sized = cli("approve", str(app), "--db", str(db), "--session", "s2", "--model", "scripted",
                "--value", '"M"')
    assert sized.returncode == 0, sized.stderr
    assert "answered 'size' of turn" in sized.stdout and '"M", by ann' in sized.stdout
    assert 'agent> pick answered: {"size": "M"}' in sized.stdout  # --model scripted


PICK = '''
from durable_turns import ToolContext, tool

@tool
async def pick(ctx: ToolContext) -> dict:
    """Ask which size."""
    return {"size": await ctx.request_input("size", "Which size?",
                                            schema={"enum": ["S", "M"]})}
'''


async def park_helpdesk(db: Path) -> str:
    """``examples/slack_app`` (agent ``helpdesk``) parked on its refund's approval."""
    def reply(request: Any) -> ModelReply:
        return ModelReply("", [ToolCall("c1", "refund", {"order_id": "A-12", "amount": 5})])

    async with Runtime([load_agent(HELPDESK)], SqliteStore(db), scripted(reply)) as rt:
        s = rt.session("helpdesk", "s1")
        started = await s.start("refund A-12", event=InboundEvent(
            "http", {"id": "ann", "attested": True}, "refund A-12"))
        assert (await s.result(started.turn_id)).status == "suspended"
        return started.turn_id


async def test_approve_refuses_another_app_s_database_and_creates_nothing(tmp_path: Path
                                                                          ) -> None:
    helpdesk = tmp_path / "helpdesk.sqlite"
    turn = await park_helpdesk(helpdesk)
    before = tables(helpdesk)
    for command in (["approve", str(OPS), "--db", str(helpdesk), "--turn", turn],
                    ["approve", str(OPS), "--db", str(helpdesk), "--session", "s1"],
                    ["deny", str(OPS), "--db", str(helpdesk), "--turn", turn],
                    ["pending", str(OPS), "--db", str(helpdesk)]):
        refused(cli(*command), command[0], f"{helpdesk} holds agent(s) 'helpdesk', not 'ops'",
                "it is another app's store")
    assert tables(helpdesk) == before  # no 'orders', no 'refunds': nothing was created

    # The demo's database: its agent is named "ops" too, but its turn waits in a tool this
    # app does not have, so the app's agent is never run on it.
    shop = tmp_path / "shop.sqlite"
    made = cli("demo", "refund", "--db", str(shop), "--order", "42", "--amount", "30")
    assert made.returncode == 0, made.stderr
    found = re.search(r"--turn (turn-[0-9a-f]+)", made.stdout)
    assert found
    before = tables(shop)
    refused(cli("approve", str(OPS), "--db", str(shop), "--turn", found.group(1)), "approve",
            "waits in tool 'issue_refund', which the app's agent does not have",
            "durable-turns demo approve")
    pending = cli("pending", str(OPS), "--db", str(shop))
    assert pending.returncode == 0
    assert "(tool 'issue_refund' is not one of this app's: the turn is another app's)" in \
        pending.stdout and "durable-turns approve" not in pending.stdout
    assert tables(shop) == before
    # And the other way round: the demo's approve refuses the app's database.
    ops = tmp_path / "ops.sqlite"
    await park_a_refund(SqliteStore(ops))
    before = tables(ops)
    refused(cli("demo", "approve", "--db", str(ops), "--turn", "t"), "demo approve",
            "not one the demo made")
    assert tables(ops) == before == ["log", "log_transcript", "orders", "schedules", "sessions",
                                           "timers", "turns"]


async def test_approve_on_postgresql(pg_dsn: str) -> None:
    turn = await park_a_refund(PostgresStore(pg_dsn))
    listed = cli("pending", str(OPS), "--dsn", pg_dsn)
    assert listed.returncode == 0, listed.stderr
    assert f"turn {turn}, input 'approve-refund'" in listed.stdout
    assert "durable-turns approve" in listed.stdout and "--store" in listed.stdout
    done = cli("approve", str(OPS), "--store", pg_dsn, "--turn", turn)
    assert done.returncode == 0, done.stderr
    assert "agent> Refunded $30.00 on order 42" in done.stdout
    async with Runtime([load_agent(OPS)], PostgresStore(pg_dsn),
                       scheduler=NoDriveScheduler()) as rt:
        s = rt.session("ops", "s1")
        assert [t.status.value for t in await s.turns()] == ["completed", "completed"]
        answers = [json.dumps(m.result) for m in await s.transcript() if m.role == "tool"]
        assert '"refunded": true' in answers[-1]


def test_a_postgresql_schema_with_no_store_is_refused_and_left_empty(pg_dsn: str) -> None:
    import psycopg

    for command in (["pending", str(OPS)], ["approve", str(OPS), "--turn", "t"],
                    ["sessions", "list"]):
        out = cli(*command, "--dsn", pg_dsn)
        refused(out, command[0] if command[0] != "sessions" else "sessions list",
                "holds no durable_turns store")
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM information_schema.tables "
                            "WHERE table_schema = current_schema()").fetchone() == (0,)


@pytest.mark.parametrize("where", ["--db", "--store"])
def test_a_missing_file_is_refused_and_not_made(tmp_path: Path, where: str) -> None:
    db = tmp_path / "nothing.sqlite"
    refused(cli("pending", str(OPS), where, str(db)), "pending", "no such file")
    assert not db.exists()
