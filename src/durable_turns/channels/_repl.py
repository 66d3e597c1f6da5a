"""A terminal chat on :func:`~durable_turns.channels.mount_agent` (``durable-turns chat``).

Streamed text, a line per tool call and its result, approvals asked inline. What a person
does at the keyboard:

- **at the prompt**: a line starts a turn; Ctrl-D or Ctrl-C ends the chat (the terminal
  drops a half-typed line);
- **while a turn runs**: Ctrl-C cancels it (durably, at its next checkpoint); keys typed
  are kept out of the reply's line and wait for the next prompt;
- **at an approval** (``? … [y/n]``): the answer is stored and the turn goes on; ``/cancel``
  withdraws the request (the turn ends cancelled); Ctrl-D or Ctrl-C ends the chat and leaves
  the turn parked. Reopening the chat on that session shows the waiting request and asks it
  again.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import (
    DurableTurnsError,
    InvalidInputError,
    ResumeAuthorizationError,
    SessionBusyError,
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
from ._context import ChannelContext, TurnStream
from ._terminal import StdioTerminal, Terminal

PROMPT = "you> "
SOURCE = "cli"
"""The inbound events' source: a policy for ``cli`` in ``surfaces`` applies to the REPL."""
CANCEL = "/cancel"
"""Typed at an approval: withdraw the request (the turn ends cancelled)."""
STORE_WAIT = 30.0
"""Seconds the REPL offers a line's turn again while the store is away."""
STORE_RETRY = 0.5
"""Seconds between those offers."""

Write = Callable[[str], None]


class _Withdrawn(Exception):
    """The person typed ``/cancel`` at an approval."""


async def chat(channel: ChannelContext, *, session: str, user: str,
               terminal: Terminal | None = None) -> None:
    """Run the REPL until the input ends (Ctrl-D, or the end of a piped stdin).

    A session parked on a request when the chat opens (a chat that ended at its approval, a
    turn started elsewhere) shows the request first and asks it.

    Args:
        channel: the mounted agent.
        session: the session the conversation lives in (it survives restarts).
        user: who types; the REPL attests it (it is the terminal's user).
        terminal: where it reads and writes (default: this process's stdin and stdout,
            :class:`~durable_turns.channels._terminal.StdioTerminal`).
    """
    if terminal is None:
        with StdioTerminal() as own:
            return await chat(channel, session=session, user=user, terminal=own)
    term = terminal
    parked = (await channel.session(session).summary()).pending
    if parked is not None:
        term.write(f"(turn {parked.turn_id} of this session waits for an answer)\n")
        if not await _settle(channel, session, user, parked, term):
            return
    while True:
        try:
            text = await term.prompt(PROMPT)
        except EOFError:
            return
        if not text.strip():
            continue
        if text.strip() == CANCEL:
            term.write("  (nothing is waiting for an answer)\n")
            continue
        event = InboundEvent(SOURCE, {"id": user, "attested": True}, text)
        try:
            stream = await _open_turn(channel, text, session, event, term)
            request = await _show(stream, term)
        except SessionBusyError:
            # Parked meanwhile, by a turn started elsewhere: that request comes first.
            request = (await channel.session(session).summary()).pending
            term.write("(this session waits for an answer first; your message was not sent)\n")
        except DurableTurnsError as e:
            term.write(f"! {type(e).__name__}: {e}\n")
            continue
        if request is not None and not await _settle(channel, session, user, request, term):
            return


async def _open_turn(channel: ChannelContext, text: str, session: str, event: InboundEvent,
                     term: Terminal) -> TurnStream:
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
            term.write("! the store is unavailable; trying again…\n")
            await asyncio.sleep(STORE_RETRY)  # a backoff, not a wait for a condition


async def _settle(channel: ChannelContext, session: str, user: str, request: InputRequest,
                  term: Terminal) -> bool:
    """Ask the person for the request's answer, and the next one's, until the turn ends;
    ``False`` when they ended the chat at a question (the turn stays parked)."""
    current: InputRequest | None = request
    while current is not None:
        try:
            value = await _ask(current, term)
        except EOFError:
            term.write(f"(the turn stays parked, waiting for {current.id!r}: reopen this chat "
                       "to answer it, or answer it with durable-turns approve)\n")
            return False
        except _Withdrawn:
            s = channel.session(session)
            await s.cancel(current.turn_id, reason="withdrawn at the terminal")
            ended = await s.result(current.turn_id)
            term.write(f"(turn cancelled: {ended.reason or 'withdrawn at the terminal'})\n")
            return True
        try:
            stream = await channel.open_resume(current.turn_id, current.id, value,
                                               session=session, by=user)
            current = await _show(stream, term)
        except (InvalidInputError, ResumeAuthorizationError) as e:
            term.write(f"! {e}\n")
            if isinstance(e, ResumeAuthorizationError):
                return True  # this person may not answer: the request waits for another
        except DurableTurnsError as e:
            term.write(f"! {type(e).__name__}: {e}\n")
            return True
    return True


async def _show(stream: TurnStream, term: Terminal) -> InputRequest | None:
    """Print the turn as it runs; returns what it parked on, if it did. Ctrl-C cancels it."""
    loop = asyncio.get_running_loop()
    session = stream.session

    def interrupt() -> None:
        term.write("\n^C cancelling the turn…\n")
        task = loop.create_task(session.cancel(stream.turn_id, reason="cancelled at the terminal"))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    term.on_interrupt(interrupt)
    try:
        with term.quiet():
            async with stream:
                return await render(aiter(stream), term.write)
    finally:
        term.on_interrupt(None)


async def render(events: AsyncIterator[TurnEvent], out: Write) -> InputRequest | None:
    """Write a turn's events as the chat shows them, up to its end or its park.

    ``agent> `` and the reply's text (streamed as it comes, or whole when it was not
    streamed here), a line per tool call and per result, nested lines for a subagent's
    work, the failure or the cancellation.

    Args:
        events: the turn's events (a :class:`~durable_turns.channels.TurnStream`).
        out: writes text without a newline of its own.

    Returns:
        The request the turn parked on, or ``None`` when it ended.
    """
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


async def _ask(request: InputRequest, term: Terminal) -> Any:
    """Ask the person at the terminal for the request's answer, until it parses.

    Raises:
        EOFError: they ended the input.
        _Withdrawn: they typed ``/cancel``.
    """
    kind = (request.schema or {}).get("type")
    while True:
        if kind == "boolean":
            line = (await term.prompt(f"? {request.prompt} [y/n] ")).strip()
            if line.lower() in ("y", "yes", "n", "no"):
                return line.lower().startswith("y")
        else:
            line = (await term.prompt(
                f"? {request.prompt} (JSON{', or text' if kind == 'string' else ''}) ")).strip()
            if line and line != CANCEL:
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    if kind == "string":
                        return line
        if line == CANCEL:
            raise _Withdrawn
        term.write(f"  (answer again{', y or n' if kind == 'boolean' else ''}; {CANCEL} "
                   "withdraws the request, Ctrl-D leaves it waiting)\n")


__all__ = ["CANCEL", "PROMPT", "SOURCE", "STORE_RETRY", "STORE_WAIT", "Write", "chat", "render"]
