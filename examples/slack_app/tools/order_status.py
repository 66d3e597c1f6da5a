"""Where an order is (a stand-in for your order system)."""

from __future__ import annotations

from typing import Any

from durable_turns import tool


@tool
async def order_status(order_id: str) -> dict[str, Any]:
    """Look an order up by its id: its state and when it ships."""
    return {"order_id": order_id, "state": "packed", "ships": "tomorrow"}
