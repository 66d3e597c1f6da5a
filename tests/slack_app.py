"""The agent the Slack tests talk to, in the test process or in a child (``slack_child.py``).

Its model is a function of the turn's opening text, so a replay in another process answers
the same:

- ``refund <order>``: calls ``refund`` (parks for the speaker's approval), then says what
  happened;
- ``status <order>``: calls ``lookup`` (answers) and ``crm`` (raises: an error in the
  timeline), then says when the order ships;
- ``slow``: streams ``Part one. ``, then waits for the file ``GATE`` (if set) to exist,
  then streams ``Part two.`` (a reply cut by a crash mid-stream);
- ``hold``: calls ``hold``, which waits for the test to open its gate;
- ``wait``: says nothing until the file ``GATE`` (if set) exists, then ``Waited.``;
- ``digest``: calls ``approve_digest`` (parks for U1, named), then ``Digest sent.`` or
  ``Digest held.``;
- ``flaky``: the first attempt streams ``Half an ans`` and fails (retryable); the retry
  says ``Whole answer.``;
- anything else: ``You said: <text>``.

``refund`` appends a line to ``EFFECTS`` (a file, if set) when it pays.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from durable_turns import Agent, ModelRequest, Stop, TextDelta, ToolCall, ToolContext, tool
from durable_turns.errors import ModelError
from durable_turns.messages import Message
from durable_turns.models import ModelEvent
from durable_turns.models.scripted import calls_this_turn

AGENT = "helper"
held: dict[str, asyncio.Event] = {}
paid: list[str] = []
attempts: list[str] = []


def _opening(request: ModelRequest) -> Message:
    return next(m for m in reversed(request.messages) if m.is_opening)


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once the speaker approves it."""
    ok = await ctx.request_input("approve", f"Refund order {order_id}?",
                                 schema={"type": "boolean"})
    if ok:
        paid.append(order_id)
        effects = os.environ.get("EFFECTS")
        if effects:
            with open(effects, "a") as f:
                f.write(json.dumps({"order": order_id, "key": ctx.idempotency_key,
                                    "pid": os.getpid()}) + "\n")
    return {"refunded": bool(ok)}


@tool
async def approve_digest(ctx: ToolContext) -> bool:
    """Ask U1 whether the digest may go out."""
    ok = await ctx.request_input("send", "Send today's digest?", schema={"type": "boolean"},
                                 answerers={"user": "U1"})
    return bool(ok)


@tool
async def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order": order_id, "ships": "tomorrow"}


@tool
async def crm(order_id: str) -> str:
    """Ask the CRM (down in these tests)."""
    raise ConnectionError("crm unreachable")


@tool
async def hold(ctx: ToolContext) -> str:
    """Wait until the test opens the gate."""
    await held.setdefault("hold", asyncio.Event()).wait()
    return "released"


class Brain:
    """The model of these tests (see the module docstring)."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        opening = _opening(request)
        words = opening.text.split()
        n = calls_this_turn(request)
        head = words[0] if words else ""
        arg = words[1] if len(words) > 1 else "?"
        if head == "refund" and n == 0:
            yield TextDelta("Let me ask for approval. ")
            yield ToolCall("call-refund", "refund", {"order_id": arg})
            yield Stop("tool_use")
            return
        if head == "refund":
            result = request.messages[-1].result or {}
            done = isinstance(result, dict) and result.get("refunded")
            text = f"Refunded order {arg}." if done else f"Order {arg} was not refunded."
            for part in (text[:8], text[8:]):
                yield TextDelta(part)
            yield Stop("end_turn")
            return
        if head == "status" and n == 0:
            yield ToolCall("call-lookup", "lookup", {"order_id": arg})
            yield ToolCall("call-crm", "crm", {"order_id": arg})
            yield Stop("tool_use")
            return
        if head == "status":
            for part in (f"Order {arg} ", "ships ", "tomorrow."):
                yield TextDelta(part)
            yield Stop("end_turn")
            return
        if head == "digest" and n == 0:
            yield ToolCall("call-digest", "approve_digest", {})
            yield Stop("tool_use")
            return
        if head == "digest":
            yield TextDelta("Digest sent." if request.messages[-1].result else "Digest held.")
            yield Stop("end_turn")
            return
        if head == "hold" and n == 0:
            yield ToolCall("call-hold", "hold", {})
            yield Stop("tool_use")
            return
        if head == "flaky":
            attempts.append(opening.text)
            if len(attempts) == 1:
                yield TextDelta("Half an ans")
                raise ModelError("connection reset", provider="brain", retryable=True)
            yield TextDelta("Whole answer.")
            yield Stop("end_turn")
            return
        if head == "wait":
            gate = os.environ.get("GATE")
            if gate:
                while not Path(gate).exists():  # the child is SIGKILLed while it waits
                    await asyncio.sleep(0.05)
            yield TextDelta("Waited.")
            yield Stop("end_turn")
            return
        if head == "slow":
            yield TextDelta("Part one. ")
            gate = os.environ.get("GATE")
            if gate:
                while not Path(gate).exists():  # the child is SIGKILLed while it waits
                    await asyncio.sleep(0.05)
            yield TextDelta("Part two.")
            yield Stop("end_turn")
            return
        yield TextDelta(f"You said: {opening.text}")
        yield Stop("end_turn")


def build_agent() -> Agent:
    return Agent(name=AGENT, instructions="Help in Slack.",
                 tools=[refund, lookup, crm, hold, approve_digest], model=Brain(),
                 model_retry_delay=0.01)
