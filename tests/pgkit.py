"""A child process for the PostgreSQL lease tests: real processes, real signals.

Run as a script, it drives the turn ``t1`` of session ``ops/s1`` on a PostgreSQL store with a
short lease (``lease_ttl=1.0``)::

    python tests/pgkit.py DSN WORK --tag a --start --hold   # accept, drive, hold in the tool
    python tests/pgkit.py DSN WORK --tag b                  # recover() and drive
    python tests/pgkit.py DSN WORK --tag w1 --work          # a ClaimingScheduler until no
                                                            # session has unfinished turns

The agent has one local tool, ``create_order``: a row in ``orders`` through
``ctx.store.unwrap()``, inside the step's transaction. Files in WORK are the signals:

- ``held-<tag>`` (``--hold``): the child sits inside ``create_order`` for call ``c1``, its row
  written, the step not committed; it goes on once the test writes ``go-<tag>``. The file
  holds the step connection's server pid;
- ``ready-<tag>`` (``--work``): the worker is open; it starts working once ``go`` exists;
- ``report-<tag>.json``: how the turn ended, as this child saw it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from durable_turns import (
    Agent,
    ModelReply,
    ModelRequest,
    PostgresStore,
    Runtime,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.models.scripted import calls_this_turn
from durable_turns.scheduling import ClaimingScheduler

AGENT, SESSION, TURN_ID = "ops", "s1", "t1"
SCRIPT = [
    ModelReply("Ordering the apple.", [ToolCall("c1", "create_order", {"item": "apple"})]),
    ModelReply("And the pear.", [ToolCall("c2", "create_order", {"item": "pear"})]),
    ModelReply("Done."),
]
# One row per call: a second writer of the same call waits on the first one's row lock until
# that transaction ends (what a paused worker must not make last forever).
ORDERS_DDL = ("CREATE TABLE IF NOT EXISTS orders (call_id TEXT NOT NULL, item TEXT, pid INTEGER, "
              "session TEXT, turn_id TEXT, UNIQUE (session, turn_id, call_id))")
CHILD_TIMEOUT = 30.0
"""The bound on every wait of a child, and of the test on a child."""


def _wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + CHILD_TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {path.name}")
        time.sleep(0.005)


def build_agent(work: Path, tag: str, hold: bool) -> Agent:
    @tool
    def create_order(item: str, ctx: ToolContext) -> dict[str, Any]:
        """Place an order for one item."""
        conn = ctx.store.unwrap()
        conn.execute("INSERT INTO orders (call_id, item, pid, session, turn_id) "
                     "VALUES (%s, %s, %s, %s, %s)",
                     (ctx.call_id, item, os.getpid(), ctx.session, ctx.turn_id))
        if hold and ctx.call_id == "c1":
            # The step's server process, for a test that kills it.
            (work / f"held-{tag}.tmp").write_text(str(conn.info.backend_pid))
            (work / f"held-{tag}.tmp").rename(work / f"held-{tag}")
            _wait_for_file(work / f"go-{tag}")  # on the store's thread, like any local tool
        return {"item": item}

    return Agent(AGENT, "You run the shop's orders.", [create_order])


def ensure_orders(store: PostgresStore) -> None:
    """Create the orders table. Processes start together, and CREATE TABLE IF NOT EXISTS
    races in PostgreSQL's catalog: one at a time, under a transaction-scoped advisory lock."""
    conn = store.unwrap()
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(20251201)")
        conn.execute(ORDERS_DDL)


async def worker(dsn: str, work: Path, tag: str) -> None:
    def reply(request: ModelRequest) -> ModelReply:
        return SCRIPT[1:][calls_this_turn(request)]  # one order, then done

    store = PostgresStore(dsn, lease_ttl=1.0)
    claims = ClaimingScheduler(poll_interval=0.05, max_sessions=10)
    rt = Runtime([build_agent(work, tag, False)], store, scripted(reply), scheduler=claims)
    async with rt:
        ensure_orders(store)
        (work / f"ready-{tag}").touch()
        while not (work / "go").exists():
            await asyncio.sleep(0.005)
        # At most 10 sessions each: the 50 are shared out over both workers as they go.
        working = asyncio.ensure_future(claims.run())
        try:
            while await store.find_sessions("unfinished"):
                await asyncio.sleep(0.05)
        finally:
            working.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await working
        await rt.idle()
    (work / f"report-{tag}.json").write_text(json.dumps({"pid": os.getpid()}))


async def child(dsn: str, work: Path, tag: str, start: bool, hold: bool) -> None:
    def reply(request: ModelRequest) -> ModelReply:
        return SCRIPT[calls_this_turn(request)]

    store = PostgresStore(dsn, lease_ttl=1.0)
    rt = Runtime([build_agent(work, tag, hold)], store, scripted(reply))
    async with rt:
        ensure_orders(store)
        session = rt.session(AGENT, SESSION)
        if start:
            await session.start("order the fruit", turn_id=TURN_ID)
        else:
            await rt.recover()
        res = await session.result(TURN_ID)
        await rt.idle()
        report = {"status": res.status, "text": res.text, "pid": os.getpid()}
    (work / f"report-{tag}.json").write_text(json.dumps(report))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dsn")
    p.add_argument("work", type=Path)
    p.add_argument("--tag", required=True)
    p.add_argument("--start", action="store_true")
    p.add_argument("--hold", action="store_true")
    p.add_argument("--work", dest="working", action="store_true")
    a = p.parse_args()
    job = (worker(a.dsn, a.work, a.tag) if a.working
           else child(a.dsn, a.work, a.tag, a.start, a.hold))
    asyncio.run(asyncio.wait_for(job, timeout=CHILD_TIMEOUT))


def command(dsn: str, work: Path, tag: str, *args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), dsn, str(work), "--tag", tag, *args]


if __name__ == "__main__":
    main()
