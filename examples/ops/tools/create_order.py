"""Order an item: a local tool, so its row commits with its step, exactly once."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from durable_turns import ToolContext, tool

ORDERS = ("CREATE TABLE IF NOT EXISTS orders (key TEXT PRIMARY KEY, item TEXT NOT NULL, "
          "quantity INTEGER NOT NULL, ordered_by TEXT, turn_id TEXT NOT NULL, at REAL NOT NULL)")


@tool
def create_order(item: str, ctx: ToolContext, quantity: int = 1) -> dict[str, Any]:
    """Order ``quantity`` of ``item`` for the person asking; returns the order's number."""
    if not item.strip() or not 0 < quantity <= 100:
        raise ValueError("an order is 1 to 100 of a named item")
    # The step's own transaction: SQLite's connection, or PostgreSQL's (psycopg), whichever
    # store the app runs on. Nothing here commits: the step commits it, with its result.
    db = ctx.store.unwrap()
    mark = "?" if isinstance(db, sqlite3.Connection) else "%s"
    db.execute(ORDERS)
    db.execute(f"INSERT INTO orders VALUES ({', '.join([mark] * 6)})",
               (ctx.idempotency_key, item.strip(), quantity, ctx.user.id if ctx.user else None,
                ctx.turn_id, time.time()))
    (number,) = db.execute("SELECT count(*) FROM orders").fetchone()
    return {"order": int(number), "item": item.strip(), "quantity": quantity}
