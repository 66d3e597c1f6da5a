"""Refund an order once a person approves: a remote tool, so it may wait for the answer."""

from __future__ import annotations

from typing import Any

from durable_turns import ToolContext, tool


@tool
async def refund(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    """Refund ``amount`` dollars on order ``order_id``, once the person who asked approves."""
    if not 0 < amount <= 10_000:
        raise ValueError("a refund is above $0 and at most $10,000")
    # The first run parks the turn here (the process may exit; the wait is a row in the
    # store); after the answer the tool runs again from the top and this returns it.
    approved = await ctx.request_input(
        "approve-refund", f"Refund ${amount:.2f} on order {order_id}?",
        schema={"type": "boolean"})
    if approved is not True:
        return {"refunded": False, "order_id": order_id}
    # Your payment provider here, with ctx.idempotency_key as its Idempotency-Key: a remote
    # tool runs at least once, and the key makes a repeat a no-op.
    return {"refunded": True, "order_id": order_id, "amount": amount,
            "refund": ctx.idempotency_key[:12]}
