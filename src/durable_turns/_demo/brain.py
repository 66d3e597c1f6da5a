"""The demo's scripted "brain": a deterministic stand-in for an LLM, driven by the transcript.

For "Order a keyboard, a mouse and a monitor …, then tell the team." it makes one
``create_order`` call per model call (three in sequence), then one ``notify`` call, then
answers with a summary. For "Refund $30 on order 42." it calls ``issue_refund`` once (which
parks the turn until a person answers), then reports what came of it. Which reply comes next
is decided by how many model calls the current turn has made, counted from the transcript
(:func:`calls_this_turn`), never by a counter in memory — so a new process replaying the turn
gets exactly the reply the killed one would have.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..messages import Message, ToolCall
from ..model import ModelRequest
from ..models.scripted import ModelReply, ScriptedModel, calls_this_turn, scripted
from .refunds import money

_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
            "seven": 7, "eight": 8, "nine": 9, "ten": 10}
# Where the list of things to order ends: the recipient, the sentence, or the "tell" clause.
_END_OF_ITEMS = re.compile(
    r"\s+for\s|[.!?;]|,?\s+(?:and\s+|then\s+)*(?:tell|notify|let|inform)\b", re.IGNORECASE
)
_TELLS = re.compile(r"\b(?:tell|notify|let\s+\w+\s+know|inform)\b", re.IGNORECASE)
_REFUND = re.compile(r"\brefund\s+\$?(\d+(?:\.\d+)?)\s+(?:on|for)\s+order\s+#?([\w-]+)",
                     re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Item:
    """One thing to order."""

    name: str
    quantity: int = 1


def parse_request(text: str) -> tuple[list[Item], bool]:
    """The items an "order …" request asks for, and whether it asks to tell the team."""
    m = re.search(r"\border\s+(.*)", text, re.IGNORECASE | re.DOTALL)
    if m is None:
        return [], False
    listed = _END_OF_ITEMS.split(m.group(1), maxsplit=1)[0]
    items = []
    for part in re.split(r",\s*(?:and\s+)?|\s+and\s+", listed):
        words = part.strip().split(maxsplit=1)
        if not words:
            continue
        count = _NUMBERS.get(words[0].lower()) or (int(words[0]) if words[0].isdigit() else 0)
        if count and len(words) == 2:
            name = words[1]
            if count > 1 and name.endswith("s"):
                name = name[:-1]
        else:
            count, name = 1, part.strip()
        items.append(Item(name, count))
    return items, bool(_TELLS.search(text))


def _this_turn(messages: Sequence[Message]) -> list[Message]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].is_opening:
            return list(messages[i:])
    return []


def _describe(item: Item) -> str:
    return item.name if item.quantity == 1 else f"{item.quantity} {item.name}s"


def parse_refund(text: str) -> tuple[str, float] | None:
    """The order id and amount a "refund $… on order …" request names, if it is one."""
    m = _REFUND.search(text)
    return (m.group(2), float(m.group(1))) if m else None


def _refund_brain(turn: list[Message], i: int, order_id: str, amount: float) -> ModelReply:
    what = f"{money(amount)} on order {order_id}"
    if i == 0:
        number: float | int = int(amount) if amount.is_integer() else amount
        return ModelReply(
            f"Refunding {what}; that needs a person's approval first.",
            [ToolCall("refund-1", "issue_refund", {"order_id": order_id, "amount": number})],
        )
    result = next((m.result for m in turn if m.role == "tool" and m.call_id == "refund-1"),
                  None)
    if isinstance(result, dict) and result.get("refunded") is True:
        return ModelReply(f"Refunded {what} (refund #{result.get('refund_id')}), as approved.")
    if isinstance(result, dict) and result.get("refunded") is False:
        return ModelReply(f"The refund of {what} was not approved, so nothing was refunded.")
    return ModelReply(f"The refund of {what} failed: {result}")


def ops_brain(request: ModelRequest) -> ModelReply:
    """The reply to the i-th model call of the turn (see the module docstring)."""
    turn = _this_turn(request.messages)
    opening = turn[0].text if turn else ""
    refund = parse_refund(opening)
    if refund is not None:
        return _refund_brain(turn, calls_this_turn(request), *refund)
    items, tell = parse_request(opening)
    if not items:
        return ModelReply(
            "I place orders, tell the team and refund orders. Try: "
            "“order a keyboard and a mouse, then tell the team”, or “refund $30 on order 42”."
        )
    i = calls_this_turn(request)
    results: dict[str, Any] = {m.call_id: m.result for m in turn if m.role == "tool" and m.call_id}
    if i < len(items):
        item = items[i]
        return ModelReply(
            f"Ordering {_describe(item)} ({i + 1} of {len(items)}).",
            [ToolCall(f"order-{i + 1}", "create_order",
                      {"item": item.name, "quantity": item.quantity})],
        )
    placed = []
    for n, item in enumerate(items, 1):
        result = results.get(f"order-{n}")
        if isinstance(result, dict) and "order_id" in result:
            placed.append(f"{_describe(item)} (order #{result['order_id']})")
        else:
            placed.append(f"{_describe(item)} (FAILED: {result})")
    summary = ", ".join(placed)
    if tell and i == len(items):
        return ModelReply(
            "All orders are in; telling the team.",
            [ToolCall("notify-1", "notify",
                      {"channel": "#ops", "text": f"New orders for the new hire: {summary}."})],
        )
    told = ""
    if tell:
        posted = results.get("notify-1")
        ok = isinstance(posted, dict) and posted.get("posted")
        told = " and told #ops" if ok else f"; telling #ops failed ({posted})"
    return ModelReply(f"Done: I ordered {summary}{told}.")


def ops_model() -> ScriptedModel:
    """The scripted model the demo runs on."""
    return scripted(ops_brain)


__all__ = ["Item", "ops_brain", "ops_model", "parse_refund", "parse_request"]
