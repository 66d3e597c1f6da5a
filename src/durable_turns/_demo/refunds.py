"""The demo's approval flow: ``issue_refund`` asks a person, and only then pays (F6).

``issue_refund`` is an ``async def`` — a remote tool, because only a remote tool may park
(a local one runs inside a store transaction that cannot stay open while a person decides).
Its body, in order:

1. ``await ctx.request_input("approve-refund", …, schema={"type": "boolean"})``. The first
   time, this parks the turn: the process may exit, the park lives in the store. After
   ``resume()`` the engine runs the tool again from the top and the call returns the answer.
2. Denied: return ``{"refunded": False}``; nothing is written.
3. Approved: write the refund — the side effect, strictly *after* the answer — to the
   ``refunds`` table, keyed by ``ctx.idempotency_key``, the way a payment provider takes an
   ``Idempotency-Key``: a repeat of the same step (a remote tool is at-least-once) bumps
   ``attempts`` on the existing row instead of paying twice.

Who may answer: ``{"user": approver}`` when the turn's inbound event names an approver in its
``meta`` (``durable-turns refund --approver``); otherwise nobody is named and the engine's
default applies — the turn's attested speaker (``durable-turns refund --user``).
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..context import ToolContext
from ..errors import StoreError
from ..tools import Tool, tool

APPROVAL_ID = "approve-refund"
"""The input id ``issue_refund`` parks on (``durable-turns approve --input``)."""
ORDER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}")

REFUNDS_SCHEMA = """
CREATE TABLE IF NOT EXISTS refunds (
    refund_id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    session TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    order_id TEXT NOT NULL,
    amount REAL NOT NULL,
    requested_by TEXT,
    pid INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 1
)
"""
REFUND_COLUMNS = ("refund_id", "key", "session", "turn_id", "call_id", "order_id", "amount",
                  "requested_by", "pid", "attempts")


@dataclass(frozen=True, slots=True)
class RefundRow:
    """One row of the ``refunds`` table."""

    refund_id: int
    key: str
    """The idempotency key of the step that paid it."""
    session: str
    turn_id: str
    call_id: str
    order_id: str
    amount: float
    requested_by: str | None
    pid: int
    """The process that wrote it."""
    attempts: int
    """How many times the step tried to pay; more than 1 means the receiver deduplicated."""


def money(amount: float) -> str:
    """``$30`` or ``$30.50`` (no thousands separator: the scripted brain reads it back)."""
    return f"${amount:.0f}" if float(amount).is_integer() else f"${amount:.2f}"


def ensure_refunds_schema(conn: sqlite3.Connection) -> None:
    """Create the ``refunds`` table, or check that an existing one is the demo's.

    Raises:
        StoreError: the database has a ``refunds`` table of another shape.
    """
    conn.execute(REFUNDS_SCHEMA)
    columns = tuple(r[1] for r in conn.execute("PRAGMA table_info(refunds)"))
    if columns != REFUND_COLUMNS:
        raise StoreError(
            f"the database already has a 'refunds' table that is not the demo's "
            f"(columns {', '.join(columns)}); point --db at a fresh file"
        )


def read_refunds(conn: sqlite3.Connection, turn_id: str | None = None) -> list[RefundRow]:
    """The refunds (of one turn, or all), oldest first."""
    rows = conn.execute(
        f"SELECT {', '.join(REFUND_COLUMNS)} FROM refunds "
        "WHERE ? IS NULL OR turn_id = ? ORDER BY refund_id",
        (turn_id, turn_id),
    ).fetchall()
    return [RefundRow(*r) for r in rows]


def _pay(db: Path, ctx: ToolContext, order_id: str, amount: float) -> tuple[int, int]:
    # Its own connection: a remote tool runs outside the step's transaction, and the store's
    # connection belongs to the store. busy_timeout: the store may be committing right now.
    with closing(sqlite3.connect(db, timeout=10.0)) as conn, conn:
        conn.execute(
            "INSERT INTO refunds (key, session, turn_id, call_id, order_id, amount, "
            "requested_by, pid) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET attempts = attempts + 1",
            (ctx.idempotency_key, ctx.session, ctx.turn_id, ctx.call_id, order_id, amount,
             ctx.user.id if ctx.user else None, os.getpid()),
        )
        refund_id, attempts = conn.execute(
            "SELECT refund_id, attempts FROM refunds WHERE key = ?", (ctx.idempotency_key,)
        ).fetchone()
    return int(refund_id), int(attempts)


def refund_tool(db: Path) -> Tool:
    """``issue_refund``, paying into the ``refunds`` table of the SQLite file ``db``."""

    @tool
    async def issue_refund(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
        """Refund ``amount`` dollars on order ``order_id``. A person must approve it first:
        the turn waits for their answer, then the refund is paid (or not)."""
        if not ORDER_ID.fullmatch(order_id):
            raise ValueError(f"{order_id!r} is not an order id")
        if not 0 < amount <= 1_000_000:
            raise ValueError("amount must be above 0 and at most 1,000,000")
        approver = ctx.event.meta.get("approver") if ctx.event else None
        approved = await ctx.request_input(
            APPROVAL_ID,
            f"Approve a {money(amount)} refund on order {order_id}?",
            schema={"type": "boolean"},
            answerers={"user": approver} if approver else None,
        )
        if approved is not True:
            return {"refunded": False, "order_id": order_id, "amount": amount}
        refund_id, attempts = await asyncio.to_thread(_pay, db, ctx, order_id, amount)
        return {"refunded": True, "refund_id": refund_id, "order_id": order_id,
                "amount": amount, "idempotency_key": ctx.idempotency_key,
                "attempts": attempts}

    return issue_refund


__all__ = [
    "APPROVAL_ID",
    "ORDER_ID",
    "REFUNDS_SCHEMA",
    "REFUND_COLUMNS",
    "RefundRow",
    "ensure_refunds_schema",
    "money",
    "read_refunds",
    "refund_tool",
]
