"""What was ordered: a local tool that reads the step's transaction."""

from __future__ import annotations

from typing import Any

from durable_turns import ToolContext, tool

ORDERS = ("CREATE TABLE IF NOT EXISTS orders (key TEXT PRIMARY KEY, item TEXT NOT NULL, "
          "quantity INTEGER NOT NULL, ordered_by TEXT, turn_id TEXT NOT NULL, at REAL NOT NULL)")


@tool
def list_orders(ctx: ToolContext) -> dict[str, Any]:
    """Every order so far, oldest first: its number, item, quantity and who ordered it."""
    db = ctx.store.unwrap()
    db.execute(ORDERS)  # a store no order was written to yet has no table
    rows = db.execute("SELECT item, quantity, ordered_by FROM orders ORDER BY at, key")
    return {"orders": [{"order": n, "item": item, "quantity": quantity, "by": by}
                       for n, (item, quantity, by) in enumerate(rows.fetchall(), 1)]}
