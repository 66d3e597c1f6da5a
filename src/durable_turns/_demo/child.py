"""One delivery of the demo's turn, in its own process (``durable-turns demo-child``).

The child opens the SQLite store, delivers the turn id it was given, and prints the turn's
events as they come. With a *kill point* it stops dead there — the whole process, event loop
included, so no further step can start — and tells the parent through a pipe, which then
SIGKILLs it. That makes the crash land on an exact checkpoint boundary, every run:

- ``after-order-2``: right after the 2nd ``create_order`` step committed;
- ``inside-order-2``: inside the 2nd ``create_order``, after its INSERT, before its commit;
- ``inside-notify``: inside ``notify``, after it posted, before its step committed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.text import Text

from ..events import (
    ActionCompleted,
    ActionRequested,
    InputRequested,
    MessageCompleted,
    MessageDelta,
    TurnCancelled,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
    TurnStarted,
)
from ..messages import Message
from ..records import ModelStepId, ToolStepId
from ..runtime import Runtime
from ..stores.sqlite import SqliteStore
from .choice import SCRIPTED, ModelChoice, build_model
from .ops import AGENT_NAME, REQUEST, build_agent, ensure_schema
from .reach import WatchedModel, unreachable
from .term import call_text, compact

KILL_POINTS: dict[str, str] = {
    "after-order-2": "right after the 2nd create_order step commits",
    "inside-order-2": "inside the 2nd create_order: its row inserted, its step not committed",
    "inside-notify": "inside notify: the message posted, its step not committed",
}
EXIT_ORPHANED = 70
"""The child's exit code when its parent went away while it waited at a kill point."""
LEASE_TIMEOUT = 15.0
TURN_TIMEOUT = 30.0
REAL_MODEL_TURN_TIMEOUT = 300.0
"""A real model takes seconds per call, and the turn makes five."""


@dataclass(frozen=True, slots=True)
class ChildOptions:
    """What one delivery needs: where, which turn, and where to stop."""

    db: Path
    session: str
    turn_id: str
    delivery: int
    kill_at: str | None = None
    control_fd: int | None = None
    """A pipe to the parent: the child writes one line there when it reaches ``kill_at``
    (``paused <point>``), or when the turn failed because the model could not be reached
    (``unreachable <message>``)."""
    model: str = SCRIPTED
    """``scripted`` or ``PROVIDER:NAME``, as the parent chose it."""


class Freezer:
    """Stops this process at its kill point and tells the parent, which SIGKILLs it."""

    def __init__(self, console: Console, kill_at: str | None, control_fd: int | None) -> None:
        if kill_at is not None and (kill_at not in KILL_POINTS or control_fd is None):
            raise ValueError(f"kill point {kill_at!r} needs a known name and a control fd")
        self.console = console
        self.kill_at = kill_at
        self.control_fd = control_fd
        self.effects: Counter[str] = Counter()

    def effect(self, tool_name: str) -> None:
        """A tool's side effect just happened (called from inside the tool)."""
        self.effects[tool_name] += 1
        if tool_name == "create_order" and self.effects[tool_name] == 2:
            self.reached("inside-order-2", "the 2nd create_order inserted its row (not committed)")
        elif tool_name == "notify" and self.effects[tool_name] == 1:
            self.reached("inside-notify", "notify posted its message (its step not committed)")

    def reached(self, point: str, where: str) -> None:
        if point != self.kill_at or self.control_fd is None:
            return
        self.console.print(
            Text(f"   ⏸  paused: {where}; pid {os.getpid()} waits for SIGKILL", style="yellow")
        )
        self.console.file.flush()
        os.write(self.control_fd, f"paused {point}\n".encode())
        # Block the whole process, event loop included: no further step may start, so the
        # parent's SIGKILL lands at exactly this point. Should the parent die instead, our
        # stdin (its pipe) reaches EOF and this orphan leaves without finishing the turn.
        sys.stdin.buffer.read()
        os._exit(EXIT_ORPHANED)


class EventPrinter:
    """Prints a turn's events, one line each; the model's live tokens on a line of their own.

    It keeps the transcript index each committed message gets, so it can name every step by
    its id (``model:<n>``, ``tool:<n>:<call_id>``), as the engine does.
    """

    def __init__(self, console: Console, transcript: list[Message],
                 freezer: Freezer | None = None) -> None:
        self.console = console
        self.freezer = freezer
        self.next_index = len(transcript)
        self.step_of_call = {
            c.id: str(ToolStepId(i, c.id)) for i, m in enumerate(transcript)
            for c in m.tool_calls
        }
        self.streaming = False
        self.orders_done = 0

    def __call__(self, e: TurnEvent) -> None:
        if isinstance(e, MessageDelta):
            if not self.streaming:
                self.console.print(Text("        model ▸ ", style="dim"), end="")
                self.streaming = True
            self.console.print(Text(e.text, style="italic"), end="")
            return
        self.end_line()
        if isinstance(e, TurnStarted):
            self.next_index += 1
            self.line(e, "", compact(e.text), "cyan")
        elif isinstance(e, MessageCompleted):
            step = str(ModelStepId(self.next_index))
            for c in e.tool_calls:
                self.step_of_call[c.id] = str(ToolStepId(self.next_index, c.id))
            self.next_index += 1
            calls = ", ".join(c.name for c in e.tool_calls)
            self.line(e, step, f"asks for {calls}" if calls else "answers", "blue")
        elif isinstance(e, ActionRequested):
            self.line(e, "", call_text(e.call.name, e.call.input), "dim")
        elif isinstance(e, ActionCompleted):
            self.next_index += 1
            step = self.step_of_call.get(e.call.id, f"tool:?:{e.call.id}")
            if e.error is not None:
                self.line(e, step, f"{e.call.name} failed: {compact(e.error)}", "red")
            else:
                self.line(e, step, f"{e.call.name} → {compact(e.result, 70)}", "green")
            if e.call.name == "create_order" and e.error is None:
                self.orders_done += 1
                if self.orders_done == 2 and self.freezer is not None:
                    self.freezer.reached("after-order-2", f"step {step} committed")
        elif isinstance(e, InputRequested):
            req = e.request
            self.line(e, "", f"parked on input {req.id!r}: {req.prompt} "
                             f"(answerers: {compact(req.answerers)})", "bold yellow")
        elif isinstance(e, TurnCompleted):
            self.line(e, "", "turn completed", "bold green")
        elif isinstance(e, TurnFailed):
            self.line(e, "", f"turn failed: {e.error}", "bold red")
        elif isinstance(e, TurnCancelled):
            self.line(e, "", f"turn cancelled: {e.reason}", "bold red")
        else:
            self.line(e, "", compact(e.payload()), "")

    def line(self, e: TurnEvent, step: str, detail: str, style: str) -> None:
        text = Text()
        text.append(f"  #{e.seq:<3} ", style="dim")
        text.append(f"{e.type:<18} ", style=style)
        text.append(f"{step:<18} ", style="magenta")
        text.append(detail)
        self.console.print(text)

    def end_line(self) -> None:
        if self.streaming:
            self.console.print()
            self.streaming = False


async def run_child(opts: ChildOptions, console: Console) -> int:
    """Deliver the turn once; 0 when it completed, 1 when it failed or was cancelled.

    Raises:
        ConfigurationError: the model cannot be built (unknown provider, no SDK, no key).
        StoreError: the database cannot be used.
        TimeoutError: the turn did not end in time (for instance, another process holds
            the session's lease).
    """
    freezer = Freezer(console, opts.kill_at, opts.control_fd)
    choice = ModelChoice(opts.model, "chosen by the parent")
    model = WatchedModel(build_model(choice))
    store = SqliteStore(opts.db)
    agent = build_agent(opts.db, opts.delivery, freezer.effect)
    timeout = TURN_TIMEOUT if choice.scripted else REAL_MODEL_TURN_TIMEOUT
    async with Runtime([agent], store, model, lease_timeout=LEASE_TIMEOUT) as runtime:
        ensure_schema(store.unwrap())
        session = runtime.session(AGENT_NAME, opts.session)
        before = await session.transcript()
        mine = [m for m in before if m.turn_id == opts.turn_id]
        head = Text(f"delivery {opts.delivery} · pid {os.getpid()} · ", style="bold")
        if mine:
            head.append(f"redelivery of turn {opts.turn_id}: the store holds {len(mine)} of "
                        "its messages; the engine resumes after them")
        else:
            head.append(f"new turn {opts.turn_id}")
        console.print(head)
        printer = EventPrinter(console, before, freezer)
        session.observe(printer, turn_id=opts.turn_id)
        await session.start(REQUEST, turn_id=opts.turn_id)
        result = await asyncio.wait_for(session.result(opts.turn_id), timeout)
        printer.end_line()
    if result.status == "completed":
        console.print(Text(f"  answer: {result.text}", style="bold"))
        return 0
    console.print(Text(f"  the turn ended {result.status}: {result.error or result.reason}",
                       style="bold red"))
    failure = model.last_error  # the turn failed of it if its error is that error's text
    why = (unreachable(failure, model) if failure is not None and result.error
           and result.error.startswith(str(failure)) else None)
    if why is not None and opts.control_fd is not None:
        os.write(opts.control_fd, f"{UNREACHABLE}{' '.join(why.split())}\n".encode())
    return 1


UNREACHABLE = "unreachable "
"""How a child's line to its parent starts when the model could not be reached."""


__all__ = [
    "EXIT_ORPHANED",
    "KILL_POINTS",
    "LEASE_TIMEOUT",
    "REAL_MODEL_TURN_TIMEOUT",
    "TURN_TIMEOUT",
    "UNREACHABLE",
    "ChildOptions",
    "EventPrinter",
    "Freezer",
    "run_child",
]
