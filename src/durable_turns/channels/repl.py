"""A terminal chat on :func:`~durable_turns.channels.mount_agent` (``durable-turns chat``).

Streamed text, a line per tool call and its result, approvals asked inline; Ctrl-C during a
turn cancels it (durably, at its next checkpoint), Ctrl-C or Ctrl-D at the prompt quits.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import DurableTurnsError, InvalidInputError, ResumeAuthorizationError
from ..events import TurnEvent
from ..inbound import InboundEvent
from ..records import InputRequest
from . import ChannelContext, TurnStream

PROMPT = "you> "
SOURCE = "cli"
"""The inbound events' source: a policy for ``cli`` in ``surfaces`` applies to the REPL."""

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
            stream = await channel.open_turn(text, session=session, event=event)
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
        d = e.to_dict()
        if e.child is not None:  # a subagent's work, nested under the call that runs it
            if open_line:
                out("\n")
                open_line = False
            _nested(e.child.get("agent", "?"), d, out)
        elif e.type == "turn.started":
            out("agent> ")
            open_line, streamed = True, False
        elif e.type == "message.delta":
            if not open_line:
                out("agent> ")
                open_line = True
            out(d["text"])
            streamed = True
        elif e.type == "message.retry":
            out(f"\n  (the model failed, retrying: {d['error']})\nagent> ")
            streamed = False
        elif e.type == "message.completed":
            if d["text"] and not streamed:  # replayed, or streamed by another process
                out(("" if open_line else "agent> ") + d["text"])
                open_line = True
            if open_line:
                out("\n")
            open_line, streamed = False, False
        else:
            if open_line:
                out("\n")
                open_line = False
            if e.type == "action.requested":
                call = d["call"]
                out(f"  → {call['name']} {json.dumps(call['input'])}\n")
            elif e.type == "action.completed":
                mark = "✗" if d["error"] else "✓"
                out(f"  {mark} {d['call']['name']}: {json.dumps(d['result'])[:200]}\n")
            elif e.type == "input.requested":
                return InputRequest.from_dict(d["request"])
            elif e.type == "turn.failed":
                out(f"! the turn failed: {d['error']}\n")
            elif e.type == "turn.cancelled":
                out(f"(turn cancelled: {d['reason']})\n")
    return None


def _nested(agent: str, d: dict[str, Any], out: Write) -> None:
    """One line for a subagent's event (its question is asked as the parent's, after)."""
    kind = d["type"]
    if kind == "message.completed" and d["text"]:
        out(f"    [{agent}] {d['text']}\n")
    elif kind == "action.requested":
        out(f"    [{agent}] → {d['call']['name']} {json.dumps(d['call']['input'])}\n")
    elif kind == "action.completed":
        mark = "✗" if d["error"] else "✓"
        out(f"    [{agent}] {mark} {d['call']['name']}: {json.dumps(d['result'])[:200]}\n")
    elif kind in ("turn.failed", "turn.cancelled"):
        out(f"    [{agent}] {kind.split('.')[1]}: {d.get('error') or d.get('reason')}\n")


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
