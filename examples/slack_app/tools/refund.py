"""Refund an order, once the person who asked clicks Approve in Slack."""

from __future__ import annotations

from typing import Any

from durable_turns import ToolContext, tool


@tool
async def refund(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order. Asks the person who asked for approval first (Slack buttons)."""
    approved = await ctx.request_input(
        "approve-refund", f"Refund ${amount:.2f} for order {order_id}?",
        schema={"type": "boolean"})
    if not approved:
        return {"refunded": False}
    # Your payment provider here, with ctx.idempotency_key as its Idempotency-Key: a remote
    # tool runs at least once, the key makes a repeat a no-op.
    return {"refunded": True, "order_id": order_id, "amount": amount,
            "idempotency_key": ctx.idempotency_key}
