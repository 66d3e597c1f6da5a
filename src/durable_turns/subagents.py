"""Subagents: a tool that runs another agent's turn as a durable child (F13).

``subagent("researcher", description=…)`` is a remote tool (input ``{"task": str}``, result
``{"answer": text}``). When the model calls it, the tool:

1. makes the child's session id, ``subagent:<32 random hex digits>`` (:func:`child_ids`:
   nobody can predict it, so nobody can make the session first, and no host makes a name
   under ``subagent:``), and its turn id ``<turn_id>:<call_id>``, and records them as the
   parent's step ``child:<turn_id>:<call_id>`` **before** the child starts; a replay after
   a crash re-attaches to that child (:func:`find_child` reads it) instead of starting a
   second one;
2. starts the child's turn (a redelivery if it exists: nothing of it runs twice, and the
   child's local tools keep their exactly-once) in a session owned by the parent's owner
   (who may then read it), with the task as its opening text and the parent's inbound
   event, so the child's requests default to the same speaker;
3. forwards the child's logged events into the parent's stream as they commit, each tagged
   ``child: {agent, session, turn_id, seq}`` (``agent``, ``session``, ``turn_id`` of the
   event are the parent's), so an HTTP stream, the console or Slack can show nested work;
   the child's ``message.completed`` events carry its usage (:func:`turn_usage` adds it up),
   and its live text (``message.delta``) reaches the parent's live subscribers, tagged too;
4. returns the child's answer; a child that fails or is cancelled on its own is an error
   result the parent's model reads.

A child that parks parks the parent: the parent's request mirrors the child's (``id`` is
``<child input id>@<call id>``; ``child`` names the child and its own input id), so
``pending()`` on the parent shows it, and ``resume()`` on the parent hands the answer to the
exact child, where the child's answerer rules and schema are enforced (a parent is no way
around an approval gate); the parent then goes on and re-attaches.

Parent-close policy: **cancel**. Cancelling or resetting the parent while the child runs
(or the parent failing mid-batch) cancels the child's turn (durably, so across workers
too) and waits for it to stop. Resetting a parent parked on its children resets their
sessions (:func:`reset_children`), so no stale request of theirs stays open. A runtime
shutting down cancels nothing: both turns replay after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Protocol

from .context import Sessions, StepServices, ToolContext
from .errors import ConfigurationError, Parked
from .events import MessageCompleted, MessageDelta, MessageThinking, TurnEvent
from .history import Checkpoint
from .records import ChainEntry, ChildMemo, ChildStepId, InputRequest, SessionKey, TurnStatus
from .tools import Tool, ToolSpec

log = logging.getLogger("durable_turns")

POLL = 1.0
"""Seconds between looks at the child when no change was reported (a lost notification)."""
CANCEL_WAIT = 30.0
"""How long a cancelled parent waits for its child's turn to stop before giving up on it."""
INPUT = {
    "type": "object",
    "properties": {"task": {"type": "string", "minLength": 1,
                            "description": "What the subagent should do, in full."}},
    "required": ["task"],
    "additionalProperties": False,
}


CHILD = "subagent"
"""The name space of child sessions (``subagent:…``): a host makes no session under it."""


def child_ids(turn_id: str, call_id: str) -> tuple[str, str]:
    """A new child's session id for the parent's call ``call_id`` of ``turn_id``
    (``subagent:<32 random hex digits>``: unpredictable) and its turn id
    (``<turn_id>:<call_id>``)."""
    return f"{CHILD}:{secrets.token_hex(16)}", f"{turn_id}:{call_id}"


class Past(Protocol):
    """What :func:`find_child` reads of a parent session (an ``AgentSession``)."""

    async def history(self, *, generation: int | None = None) -> list[Checkpoint]: ...


async def find_child(parent: Past, turn_id: str, call_id: str) -> tuple[str, str] | None:
    """The session id and turn id of the child the parent's call ``call_id`` of turn
    ``turn_id`` started (its step ``child:<turn_id>:<call_id>``); ``None`` before that step
    was recorded."""
    for cp in await parent.history():
        for step in cp.steps:
            if step.id == str(ChildStepId(turn_id, call_id)) and \
                    isinstance(step.result, ChildMemo):
                return step.result.session, step.result.turn_id
    return None


def turn_usage(events: Iterable[TurnEvent], turn_id: str) -> dict[str, int]:
    """A turn's token usage: its model calls' and, through their forwarded
    ``message.completed`` events, its subagents'."""
    total: dict[str, int] = {}
    for e in events:
        usage = getattr(e, "usage", None)
        if e.turn_id == turn_id and isinstance(e, MessageCompleted) and usage:
            for k, v in usage.items():
                total[k] = total.get(k, 0) + v
    return total


def subagent(agent_name: str, *, description: str, name: str | None = None) -> Tool:
    """A tool that runs agent ``agent_name``'s turn as a child session and returns its answer.

    Args:
        agent_name: the child agent; the runtime must have it.
        description: what the parent's model is told the subagent does.
        name: the tool's name (default: ``agent_name``).

    Returns:
        A remote, interruptible :class:`~durable_turns.Tool` with input ``{"task": str}``
        and result ``{"answer": text}``.
    """

    async def run(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return await _run_child(agent_name, str(args["task"]), ctx)

    return Tool(ToolSpec(name or agent_name, description, INPUT), run, interruptible=True)


async def _run_child(agent_name: str, task: str, ctx: ToolContext) -> dict[str, Any]:
    services = ctx.services
    if services is None:
        raise ConfigurationError(f"subagent {agent_name!r} runs only in a turn a Runtime drives")
    sessions = services.sessions
    if agent_name not in sessions.agent_names():
        raise ConfigurationError(f"subagent {agent_name!r}: the runtime has no such agent "
                                 f"({sorted(sessions.agent_names())})")
    session_id, turn_id = child_ids(ctx.turn_id, ctx.call_id)
    # Recorded before the child starts: a replay re-attaches to exactly this child.
    memo = await services.remember(ChildStepId(ctx.turn_id, ctx.call_id),
                                   ChildMemo(agent_name, session_id, turn_id))
    key, turn_id = SessionKey(memo.agent, memo.session), memo.turn_id
    tag = {"agent": key.agent, "session": key.session, "turn_id": turn_id}
    try:
        await sessions.start(key, task, turn_id=turn_id, event=ctx.event,
                             parent=SessionKey(ctx.agent, ctx.session))
        rec = await _follow(ctx, services, key, turn_id, tag)
    except asyncio.CancelledError:
        reason = services.cancel_reason()
        if reason is not None:  # the parent was cancelled or reset, not shut down
            await sessions.interrupt(key, turn_id, reason=f"parent turn cancelled: {reason}")
            with contextlib.suppress(Exception):
                await sessions.wait(key, turn_id, timeout=CANCEL_WAIT)
        raise
    if rec.status == TurnStatus.COMPLETED:
        return {"answer": rec.text or ""}
    if rec.status == TurnStatus.SUSPENDED and rec.request is not None:
        asked = [_mirror(r, ctx, tag) for r in rec.request.all]
        raise Parked(replace(asked[0], more=tuple(asked[1:])))
    if rec.status == TurnStatus.CANCELLED:
        raise RuntimeError(f"subagent {key.agent!r} was cancelled: {rec.reason}")
    raise RuntimeError(f"subagent {key.agent!r} failed: {rec.error}")


def _mirror(r: InputRequest, ctx: ToolContext, tag: dict[str, str]) -> InputRequest:
    """The parent's request for a child's: answering it answers the child's."""
    return InputRequest(f"{r.id}@{ctx.call_id}", r.prompt, r.schema, r.answerers,
                        ctx.turn_id, ctx.call_id, {**tag, "input_id": r.id})


async def _follow(ctx: ToolContext, services: StepServices, key: SessionKey, turn_id: str,
                  tag: dict[str, str]) -> ChainEntry:
    """Forward the child turn's events into the parent's stream until the turn ends or
    parks; returns its record."""
    sessions = services.sessions
    # Events forwarded before a crash or a park are in the parent's log: go on after them.
    parent = SessionKey(ctx.agent, ctx.session)
    cursor = max((int(e.child["seq"]) for e in await sessions.events(parent, turn_id=ctx.turn_id)
                  if e.child is not None and e.child.get("turn_id") == turn_id
                  and e.child.get("session") == key.session), default=0)
    changed = asyncio.Event()
    unwatch = sessions.watch(key, lambda _events: changed.set())

    def on_live(e: TurnEvent) -> None:
        # The child's live text, from whichever process drives it: handed on as it streams.
        if isinstance(e, MessageDelta | MessageThinking) and e.turn_id == turn_id:
            services.forward_live(replace(e, child={**tag, "seq": e.seq}))

    stop_live = sessions.live(key, on_live)
    try:
        while True:
            if services.cancel_reason() is not None:
                # The parent's cancel is told to this task once (a task.cancel()); should
                # that ever be lost, the flag it sets still stops the child at the next look.
                raise asyncio.CancelledError
            changed.clear()
            rec = await sessions.entry(key, turn_id)
            if rec is None:
                raise RuntimeError(f"subagent session {key} has no turn {turn_id!r}")
            # Read after the record: every event up to an end it shows is read too.
            events = await sessions.events(key, after_seq=cursor, turn_id=turn_id)
            if events:
                await services.forward([replace(e, child={**tag, "seq": e.seq})
                                        for e in events])
                cursor = events[-1].seq
            if rec.settled:
                return rec
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that comes as the
            # wait ends (the change reported, or the poll's time up), and the parent's
            # cancel would never reach the child, which then runs on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL):
                    await changed.wait()
    finally:
        unwatch()
        stop_live()


def _children(sessions: Sessions, parked: Iterable[ChainEntry]) -> dict[SessionKey, str]:
    """The child sessions (and their turns) that parked turns wait on, of agents the
    runtime has."""
    found: dict[SessionKey, str] = {}
    for t in parked:
        for r in t.request.all if t.request is not None else ():
            if r.child is None:
                continue
            agent, session = str(r.child.get("agent")), str(r.child.get("session"))
            if agent not in sessions.agent_names():
                log.warning("a parent parked on a child of agent %r, which this runtime does "
                            "not have: session %s stays parked", agent, session)
                continue
            found[SessionKey(agent, session)] = str(r.child.get("turn_id"))
    return found


async def cancel_children(sessions: Sessions, parked: ChainEntry, reason: str) -> None:
    """Cancel the child turns a parked turn waits on: the parent-close policy for a cancel
    of a parked parent (its driver calls this before the parent's end commits). Their
    requests are withdrawn with them. Waits for each child to end (at most ``CANCEL_WAIT``
    seconds).

    Raises:
        StoreError: a child's cancel could not be made durable (the parent's end is then
            driven again).
    """
    children = _children(sessions, [parked])
    for key, turn_id in children.items():
        await sessions.interrupt(key, turn_id, reason=f"parent turn cancelled: {reason}")
    for key, turn_id in children.items():
        with contextlib.suppress(Exception):
            await sessions.wait(key, turn_id, timeout=CANCEL_WAIT)


async def reset_children(sessions: Sessions, entry_id: str, parked: Iterable[ChainEntry]) -> None:
    """Reset the sessions of the children that parked turns wait on: the parent-close policy
    for a reset of a parked parent (its driver calls this before the reset commits).

    Each child's session gets a reset entry with the parent's reset entry id (so a replay of
    the parent's reset after a crash accepts nothing twice); it cancels the child's parked
    turn (reason ``reset``, its request withdrawn) and archives the child's history. Waits
    for each child's reset to run (at most ``CANCEL_WAIT`` seconds).

    Args:
        sessions: the runtime driving the parent.
        entry_id: the parent's reset entry.
        parked: the parent's parked turns the reset cancels.

    Raises:
        StoreError: a child's reset could not be made durable (the parent's reset is then
            driven again).
    """
    keys = _children(sessions, parked)
    for key in keys:
        await sessions.reset(key, entry_id)
    for key in keys:
        with contextlib.suppress(Exception):
            await sessions.wait(key, entry_id, timeout=CANCEL_WAIT)


__all__ = [
    "CANCEL_WAIT",
    "CHILD",
    "INPUT",
    "POLL",
    "Past",
    "cancel_children",
    "child_ids",
    "find_child",
    "reset_children",
    "subagent",
    "turn_usage",
]
