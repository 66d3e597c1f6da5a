"""A terminal chat on :func:`~durable_turns.channels.mount_agent` (``durable-turns chat``).

Streamed text, a line per tool call and its result, approvals asked inline; Ctrl-C during a
turn cancels it (durably, at its next checkpoint), Ctrl-C or Ctrl-D at the prompt quits.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import (
    DurableTurnsError,
    InvalidInputError,
    ResumeAuthorizationError,
    StoreError,
)
from ..events import (
    ActionCompleted,
    ActionRequested,
    InputRequested,
    MessageCompleted,
    MessageDelta,
    MessageRetry,
    TurnCancelled,
    TurnEvent,
    TurnFailed,
    TurnStarted,
)
from ..inbound import InboundEvent
from ..records import InputRequest
from .context import ChannelContext, TurnStream

PROMPT = "you> "
SOURCE = "cli"
"""The inbound events' source: a policy for ``cli`` in ``surfaces`` applies to the REPL."""

STORE_WAIT = 30.0
"""Seconds the REPL offers a line's turn again while the store is away."""
STORE_RETRY = 0.5
"""Seconds between those offers."""

Read = Callable[[str], str]
Write = Callable[[str], None]


async def chat(channel: ChannelContext, *, session: str, user: str,
               read: Read = input, write: Write | None = None) -> None:
    """Run the REPL until end of input.

    Args:
        channel: the mounted agent.
        session: the session the conversation lives in (it survives restarts).
        user: who types; the REPL attests it (it is the terminal's user).
        read: reads a line (blocking; run in a thread).
        write: writes text without a newline of its own.
    """
    out = write or _write
    while True:
        try:
            text = await asyncio.to_thread(read, PROMPT)
        except EOFError:
            out("\n")
            return
        if not text.strip():
            continue
        event = InboundEvent(SOURCE, {"id": user, "attested": True}, text)
        try:
            stream = await _open_turn(channel, text, session, event, out)
            request = await _show(stream, out)
            while request is not None:
                answer = await asyncio.to_thread(_ask, request, read, out)
                stream = await channel.open_resume(request.turn_id, request.id, answer,
                                                   session=session, by=user)
                request = await _show(stream, out)
        except (InvalidInputError, ResumeAuthorizationError) as e:
            out(f"! {e}\n")
        except DurableTurnsError as e:
            out(f"! {type(e).__name__}: {e}\n")


async def _open_turn(channel: ChannelContext, text: str, session: str, event: InboundEvent,
                     out: Write) -> TurnStream:
    """Start the line's turn. Its id is chosen here, before the first try (the REPL's
    idempotency key): while the store is away the same turn is offered again, and the store
    accepts it once, so a line never becomes two turns.

    Raises:
        StoreError: the store stayed away for :data:`STORE_WAIT` seconds.
    """
    turn_id = uuid.uuid4().hex
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STORE_WAIT
    while True:
        try:
            return await channel.open_turn(text, session=session, event=event,
                                           turn_id=turn_id)
        except StoreError:
            if loop.time() >= deadline:
                raise
            out("! the store is unavailable; trying again…\n")
            await asyncio.sleep(STORE_RETRY)  # a backoff, not a wait for a condition


async def _show(stream: TurnStream, out: Write) -> InputRequest | None:
    """Print the turn as it runs; returns what it parked on, if it did. Ctrl-C cancels it."""
    loop = asyncio.get_running_loop()
    session = stream.session

    def interrupt() -> None:
        out("\n^C cancelling the turn…\n")
        task = loop.create_task(session.cancel(stream.turn_id, reason="cancelled at the terminal"))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        async with stream:
            return await _render(aiter(stream), out)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _render(events: AsyncIterator[TurnEvent], out: Write) -> InputRequest | None:
    open_line = False  # an "agent> " line is being written
    streamed = False
    async for e in events:
        if e.child is not None:  # a subagent's work, nested under the call that runs it
            if open_line:
                out("\n")
                open_line = False
            _nested(e.child.get("agent", "?"), e, out)
        elif isinstance(e, TurnStarted):
            out("agent> ")
            open_line, streamed = True, False
        elif isinstance(e, MessageDelta):
            if not open_line:
                out("agent> ")
                open_line = True
            out(e.text)
            streamed = True
        elif isinstance(e, MessageRetry):
            out(f"\n  (the model failed, retrying: {e.error})\nagent> ")
            streamed = False
        elif isinstance(e, MessageCompleted):
            if e.text and not streamed:  # replayed, or streamed by another process
                out(("" if open_line else "agent> ") + e.text)
                open_line = True
            if open_line:
                out("\n")
            open_line, streamed = False, False
        else:
            if open_line:
                out("\n")
                open_line = False
            call = _call_line(e)
            if call is not None:
                out(f"  {call}\n")
            elif isinstance(e, InputRequested):
                return e.request
            elif isinstance(e, TurnFailed):
                out(f"! the turn failed: {e.error}\n")
            elif isinstance(e, TurnCancelled):
                out(f"(turn cancelled: {e.reason})\n")
    return None


def _nested(agent: str, e: TurnEvent, out: Write) -> None:
    """One line for a subagent's event (its question is asked as the parent's, after)."""
    call = _call_line(e)
    if isinstance(e, MessageCompleted) and e.text:
        out(f"    [{agent}] {e.text}\n")
    elif call is not None:
        out(f"    [{agent}] {call}\n")
    elif isinstance(e, TurnFailed):
        out(f"    [{agent}] failed: {e.error}\n")
    elif isinstance(e, TurnCancelled):
        out(f"    [{agent}] cancelled: {e.reason}\n")


def _call_line(e: TurnEvent) -> str | None:
    """A tool call's line: what it was asked, or what it answered (``None``: no call)."""
    if isinstance(e, ActionRequested):
        return f"→ {e.call.name} {json.dumps(e.call.input)}"
    if isinstance(e, ActionCompleted):
        return f"{'✗' if e.error else '✓'} {e.call.name}: {json.dumps(e.result)[:200]}"
    return None


def _ask(request: InputRequest, read: Read, out: Write) -> Any:
    """Ask the person at the terminal for the request's answer, until it parses."""
    kind = (request.schema or {}).get("type")
    while True:
        if kind == "boolean":
            line = read(f"? {request.prompt} [y/n] ").strip().lower()
            if line in ("y", "yes", "n", "no"):
                return line.startswith("y")
        else:
            line = read(f"? {request.prompt} (JSON{', or text' if kind == 'string' else ''}) ")
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                if kind == "string":
                    return line
        out("  (answer again)\n")


def _write(text: str) -> None:
    print(text, end="", flush=True)
