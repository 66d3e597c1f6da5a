"""The demo's ops agent: an ``orders`` table written by a local tool, an outbox by a remote one.

- ``create_order`` is a plain ``def``: it runs inside the step's transaction and inserts its
  row through ``ctx.store.unwrap()`` (the store's ``sqlite3.Connection``), so the row commits
  with the step — exactly once, whatever happens to the process.
- ``notify`` is an ``async def``: it stands for a call to another service (a chat webhook).
  It cannot join the transaction, so it is at-least-once; it appends one line per attempt to
  an outbox file, keyed by ``ctx.idempotency_key``, which is what a receiver deduplicates on.
- ``list_orders`` reads the session's orders (a local tool that only reads);
- ``issue_refund`` (:mod:`.refunds`) parks the turn until a person approves, then pays.

Each row and outbox line records which *delivery* of the turn (1 = the process that gets
killed, 2 = the redelivery) and which process wrote it, so the report can prove who ran what.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agent import Agent
from ..context import ToolContext
from ..errors import FatalToolError, StoreError
from ..tools import Tool, tool
from .refunds import REFUND_COLUMNS, ensure_refunds_schema, refund_tool

AGENT_NAME = "ops"
INSTRUCTIONS = (
    "You are an office operations agent. Place orders with create_order, one call per "
    "item; tell the team with notify when asked to; refund an order with issue_refund (it "
    "waits for a person to approve it, so call it once and report what came of it). Then "
    "summarise what you did in one or two sentences."
)
REQUEST = "Order a keyboard, a mouse and a monitor for the new hire, then tell the team."

# No UNIQUE (turn_id, call_id) on purpose: if a step ever ran twice, the demo must *show* two
# rows rather than have a constraint turn the second run into an error result.
ORDERS_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    item TEXT NOT NULL,
    quantity INTEGER NOT NULL,
    delivery INTEGER NOT NULL,
    pid INTEGER NOT NULL
)
"""
ORDER_COLUMNS = ("order_id", "session", "turn_id", "call_id", "item", "quantity", "delivery",
                 "pid")

AfterEffect = Callable[[str], None]
"""Called by a tool right after its side effect, with the tool's name (the demo's kill hook)."""


@dataclass(frozen=True, slots=True)
class OrderRow:
    """One row of the ``orders`` table."""

    order_id: int
    session: str
    turn_id: str
    call_id: str
    item: str
    quantity: int
    delivery: int
    pid: int


def outbox_path(db: Path) -> Path:
    """Where ``notify`` appends: beside the database, like SQLite's ``-wal`` file."""
    return db.with_name(db.name + "-outbox.jsonl")


def ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the ``orders`` and ``refunds`` tables, or check that existing ones are the demo's.

    Raises:
        StoreError: the database has an ``orders`` or ``refunds`` table of another shape.
    """
    conn.execute(ORDERS_SCHEMA)
    columns = tuple(r[1] for r in conn.execute("PRAGMA table_info(orders)"))
    if columns != ORDER_COLUMNS:
        raise StoreError(
            f"the database already has an 'orders' table that is not the demo's "
            f"(columns {', '.join(columns)}); point --db at a fresh file"
        )
    ensure_refunds_schema(conn)


def check_schema(conn: sqlite3.Connection) -> None:
    """Check that the database is one the demo made, creating nothing.

    Raises:
        StoreError: it has no ``orders`` or ``refunds`` table of the demo's shape.
    """
    for table, columns in (("orders", ORDER_COLUMNS), ("refunds", REFUND_COLUMNS)):
        found = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
        if found != columns:
            raise StoreError(
                "the database is not one the demo made (it has no demo "
                f"'{table}' table): the demo's commands answer the demo's refunds only; "
                "answer an app's parked turn with durable-turns approve APP_DIR")


def read_orders(conn: sqlite3.Connection, turn_id: str | None = None) -> list[OrderRow]:
    """The orders (of one turn, or all), oldest first."""
    rows = conn.execute(
        f"SELECT {', '.join(ORDER_COLUMNS)} FROM orders "
        "WHERE ? IS NULL OR turn_id = ? ORDER BY order_id",
        (turn_id, turn_id),
    ).fetchall()
    return [OrderRow(*r) for r in rows]


def read_outbox(path: Path, turn_id: str | None = None) -> list[dict[str, Any]]:
    """The outbox's entries (of one turn, or all), in the order they were appended."""
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if turn_id is None or e.get("turn_id") == turn_id]


def _append_line(path: Path, entry: dict[str, Any]) -> None:
    # fsync: the effect must be on disk before the step can be killed, like a real delivery.
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def ops_tools(db: Path, delivery: int, after_effect: AfterEffect | None = None
              ) -> list[Tool]:
    """The ops agent's tools on the SQLite file ``db``, writing as delivery ``delivery``."""
    outbox = outbox_path(db)

    def effect_done(name: str) -> None:
        if after_effect is not None:
            after_effect(name)

    def connection(ctx: ToolContext, name: str) -> sqlite3.Connection:
        conn = ctx.store.unwrap()
        if not isinstance(conn, sqlite3.Connection):
            raise FatalToolError(f"{name} writes through SQL: run the ops agent on SqliteStore")
        return conn

    @tool
    def create_order(item: str, ctx: ToolContext, quantity: int = 1) -> dict[str, Any]:
        """Place an order for ``quantity`` units of ``item``. Returns the order id."""
        if quantity < 1:
            raise ValueError("quantity must be at least 1")
        cur = connection(ctx, "create_order").execute(
            "INSERT INTO orders (session, turn_id, call_id, item, quantity, delivery, pid) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ctx.session, ctx.turn_id, ctx.call_id, item, quantity, delivery, os.getpid()),
        )
        effect_done("create_order")
        return {"order_id": cur.lastrowid, "item": item, "quantity": quantity}

    @tool
    def list_orders(ctx: ToolContext) -> list[dict[str, Any]]:
        """List the orders placed in this conversation."""
        rows = connection(ctx, "list_orders").execute(
            "SELECT order_id, item, quantity FROM orders WHERE session = ? ORDER BY order_id",
            (ctx.session,),
        ).fetchall()
        return [{"order_id": r[0], "item": r[1], "quantity": r[2]} for r in rows]

    @tool
    async def notify(text: str, ctx: ToolContext, channel: str = "#ops") -> dict[str, Any]:
        """Post a message to a team channel."""
        entry = {
            "key": ctx.idempotency_key, "channel": channel, "text": text,
            "turn_id": ctx.turn_id, "call_id": ctx.call_id,
            "delivery": delivery, "pid": os.getpid(),
        }
        await asyncio.to_thread(_append_line, outbox, entry)
        effect_done("notify")
        return {"posted": True, "channel": channel, "key": ctx.idempotency_key}

    return [create_order, list_orders, notify, refund_tool(db)]


def build_agent(db: Path, delivery: int = 0, after_effect: AfterEffect | None = None
                ) -> Agent:
    """The ops agent on the SQLite file ``db`` (its model is the runtime's)."""
    return Agent(AGENT_NAME, INSTRUCTIONS, ops_tools(db, delivery, after_effect))


__all__ = [
    "AGENT_NAME",
    "INSTRUCTIONS",
    "ORDERS_SCHEMA",
    "ORDER_COLUMNS",
    "REQUEST",
    "AfterEffect",
    "OrderRow",
    "build_agent",
    "check_schema",
    "ensure_schema",
    "ops_tools",
    "outbox_path",
    "read_orders",
    "read_outbox",
]
