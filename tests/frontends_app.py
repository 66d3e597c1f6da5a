"""The app the frontend-protocol tests serve (tests/server/test_frontends.py): an agent with a
lookup, an approval, a question that is no yes/no, and a model that reasons, calls tools and can
wait at a gate in the middle of its text (a file the JavaScript client writes once it has
cut the stream and resumed it: the test needs the turn to be running right then).

Served by uvicorn on loopback in a thread of the test process, with ``authenticate`` reading
``Authorization: Bearer <name>`` (the principal ``{"id": name}``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.requests import Request

from durable_turns import Agent, Limits, MemoryStore, Runtime, ToolContext, tool
from durable_turns.messages import ToolCall
from durable_turns.model import ModelEvent, ModelRequest, Stop, TextDelta, ThinkingDelta
from durable_turns.server import create_app, mount_ag_ui, mount_ai_sdk
from servekit import served_in_thread

WAIT = 30.0
"""The bound on the gate."""
BOSS = "boss"
"""Who may approve a refund."""


@tool
def lookup(city: str) -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "celsius": 21}


def refund_tool(answerers: dict[str, str] | None) -> Any:
    """``refund``: refunds an order once ``answerers`` said yes (``None``: anyone may)."""

    @tool
    async def refund(order: str, ctx: ToolContext) -> str:
        """Refund an order, once it is approved."""
        yes = await ctx.request_input("approve", f"Refund order {order}?", {"type": "boolean"},
                                      answerers)
        return f"refunded {order}" if yes else f"kept {order}"

    return refund


@tool
async def ask_color(ctx: ToolContext) -> str:
    """Ask the user for a color (not a yes/no question)."""
    color = await ctx.request_input("color", "Which color?", {"type": "string"})
    return f"painted {color}"


class DeskModel:
    """Replies by the turn's opening text: ``weather`` reasons, looks up and answers;
    ``refund`` and ``color`` call their tools; ``gated`` streams half its text, waits for the
    gate file, then streams the rest; anything else is echoed."""

    def __init__(self, gate: Path) -> None:
        self.gate = gate

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        opening = next(m.text for m in reversed(request.messages) if m.is_opening).lower()
        done = request.messages[-1].role == "tool"
        if "weather" in opening and not done:
            yield ThinkingDelta("The user wants the weather; ")
            yield ThinkingDelta("I will look it up.")
            yield TextDelta("Let me check.")
            yield ToolCall("call-1", "lookup", {"city": "Paris"})
            yield Stop("tool_use")
        elif "weather" in opening:
            yield TextDelta("It is 21 degrees ")
            yield TextDelta("in Paris.")
            yield Stop("end_turn")
        elif ("refund" in opening or "color" in opening) and not done:
            name, args = (("refund", {"order": "A-12"}) if "refund" in opening
                          else ("ask_color", {}))
            yield ToolCall("call-1", name, args)
            yield Stop("tool_use")
        elif "refund" in opening or "color" in opening:
            yield TextDelta(f"Done: {request.messages[-1].result}.")
            yield Stop("end_turn")
        elif "gated" in opening:
            for piece in ("One, ", "two, "):
                yield TextDelta(piece)
            await _wait_for(self.gate)
            for piece in ("three, ", "four."):
                yield TextDelta(piece)
            yield Stop("end_turn")
        else:
            yield TextDelta(f"You said: {opening}")
            yield Stop("end_turn")


async def _wait_for(path: Path) -> None:
    """Wait until ``path`` exists (another process makes it), at most :data:`WAIT` seconds."""
    deadline = time.monotonic() + WAIT
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never came")
        await asyncio.sleep(0.01)  # a bounded poll of a file another process writes


def bearer(request: Request) -> dict[str, str] | None:
    """``Authorization: Bearer <name>`` → ``{"id": name}``."""
    header = request.headers.get("authorization", "")
    return {"id": header[7:]} if header.startswith("Bearer ") and header[7:] else None


def build(gate: Path, *, name: str = "desk",
          development: bool = False) -> tuple[Runtime, Any]:
    """The runtime and the app (both protocols mounted): authenticated, where only the boss
    may approve a refund; or in development mode, where anyone may. Agent ``capped`` is the
    same with a limit of one model call per turn that asks (F25)."""
    refund = refund_tool(None if development else {"user": BOSS})
    agent = Agent(name, "You help.", tools=[lookup, refund, ask_color])
    capped = Agent("capped", "You help.", tools=[lookup],
                   limits=Limits(model_calls=1, on_exceed="ask"))
    rt = Runtime([agent, capped], MemoryStore(), DeskModel(gate))
    app = create_app(rt, None if development else bearer)
    mount_ai_sdk(app)
    mount_ag_ui(app)
    return rt, app


@contextmanager
def served(gate: Path, *, name: str = "desk",
           development: bool = False) -> Iterator[tuple[str, Runtime]]:
    """The app of :func:`build` on ``127.0.0.1`` (a free port) in a thread: its URL and
    runtime."""
    rt, app = build(gate, name=name, development=development)
    try:
        with served_in_thread(app, lifespan="on") as url:
            yield url, rt
    finally:
        app.state.end_streams()
