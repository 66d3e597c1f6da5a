"""The ops example's agent: its name, and a model that runs offline, with no key.

``model`` below is a scripted brain: it reads what the person asked and which tools
answered off the transcript, so a turn it drives replays in another process (after a crash,
or when ``durable-turns approve`` answers a park) exactly as it ran. It understands three
requests: "order a keyboard and a mouse", "list orders", "refund order 42, $30" (or
"refund $30 on order 42").

To put a real model behind the same tools, pass ``--model anthropic:claude-sonnet-4-5`` (or
``openai:…``) to ``serve``, ``chat``, ``worker`` or ``approve``: ``--model`` overrides the
``model`` named here. ``model = "anthropic:claude-sonnet-4-5"`` here would make it the app's
own.
"""

from __future__ import annotations

import json
import re

from durable_turns import ModelReply, ToolCall, scripted
from durable_turns.models import ModelRequest

name = "ops"

_ORDER = re.compile(r"\b(?:order|buy)\s+(?!#?\d)(.+)", re.IGNORECASE)
_REFUND = re.compile(r"\brefund\b.*?\border\s+#?([A-Za-z0-9][\w-]*)", re.IGNORECASE)
"""A refund: the order's id is the word after "order" (the whole word: "order 42." is 42)."""
_DOLLARS = re.compile(r"\$\s*(\d+(?:\.\d{1,2})?)")
"""The amount, where it says "$": "refund $30 on order 42" as well as "refund order 42, $30"."""
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d{1,2})?)(?![\w.]*\w)")
"""Else the first number after the order's id: "refund order 42, 30"."""
_LIST = re.compile(r"\b(?:list|show)\b.*\borders?\b|^\s*orders\s*\??\s*$", re.IGNORECASE)
_ARTICLE = re.compile(r"^(?:an?|one|the|some)\s+", re.IGNORECASE)
HELP = ("I am the ops example's offline model. Ask me to \"order a keyboard and a mouse\", "
        "to \"list orders\", or to \"refund order 42, $30\" (a person approves a refund first).")


def _items(text: str) -> list[str]:
    rest = re.split(r"\s+for\s+|[.!?]", text)[0]
    parts = re.split(r",\s*(?:and\s+)?|\s+and\s+|\s+then\s+", rest)
    return [_ARTICLE.sub("", p).strip() for p in parts if _ARTICLE.sub("", p).strip()]


def _results(request: ModelRequest) -> list[dict[str, object]]:
    """The results of this turn's tool calls, in order."""
    out: list[dict[str, object]] = []
    for m in reversed(request.messages):
        if m.is_opening:
            break
        if m.role == "tool":
            out.insert(0, m.result if isinstance(m.result, dict) else {"error": m.result})
    return out


def _brain(request: ModelRequest) -> ModelReply:
    opening = next((m.text for m in reversed(request.messages) if m.is_opening), "")
    done = _results(request)
    if (refund := _REFUND.search(opening)) is not None and \
            (amount_said := _DOLLARS.search(opening)
             or _NUMBER.search(opening, refund.end())) is not None:
        order_id, amount = refund.group(1), float(amount_said.group(1))
        if not done:
            return ModelReply(f"A person has to approve a ${amount:.2f} refund on order "
                              f"{order_id} first.",
                              [ToolCall("refund-1", "refund", {"order_id": order_id,
                                                                "amount": amount})])
        if done[0].get("refunded") is True:
            return ModelReply(f"Refunded ${amount:.2f} on order {order_id} (refund "
                              f"{done[0].get('refund')}), as approved.")
        return ModelReply(f"The ${amount:.2f} refund on order {order_id} was not approved: "
                          f"nothing was paid.")
    if _LIST.search(opening):
        if not done:
            return ModelReply("", [ToolCall("list-1", "list_orders", {})])
        orders = done[0].get("orders") or []
        if not isinstance(orders, list) or not orders:
            return ModelReply("Nothing has been ordered yet.")
        return ModelReply(f"{len(orders)} order(s): " + ", ".join(
            f"#{o['order']} {o['item']}" for o in orders) + ".")
    if (order := _ORDER.search(opening)) is not None and (items := _items(order.group(1))):
        if len(done) < len(items):
            item = items[len(done)]
            return ModelReply(f"Ordering {item}." if not done else "",
                              [ToolCall(f"order-{len(done) + 1}", "create_order",
                                        {"item": item})])
        placed = [f"{r.get('item')} (order #{r.get('order')})" for r in done
                  if "order" in r]
        failed = [json.dumps(r) for r in done if "order" not in r]
        return ModelReply((f"Ordered {', '.join(placed)}." if placed else "Nothing ordered.")
                          + (f" Failed: {'; '.join(failed)}." if failed else ""))
    return ModelReply(HELP)


model = scripted(_brain)
