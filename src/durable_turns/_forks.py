"""Forks: a new session that shares a session's past up to one of its checkpoints.

:func:`plan_fork` reads the source's checkpoints and chain and works out what the fork holds:
the log up to the checkpoint, and each turn as it stood there — ended (completed, failed,
cancelled, with its outcome), parked (with its request: answerable in the fork on its own),
or under way (queued in the fork: the next runtime that drives the fork goes on from the
checkpoint, a timeline of its own). Subagent children the copied steps started are forked
with it, each up to what the parent had seen of it, under an id derived from the fork (as a
child's id derives from its parent); nothing is shared. The store writes every plan in one
transaction (``SessionStore.fork``): a fork is whole or absent.

A fork is a new timeline: idempotency keys derive from the session, so a remote tool that
runs after the fork point is a new effect, not a replay of the source's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from .agent import Agent
from .errors import ForkRerunsToolsError
from .events import InputRequested, TurnCancelled, TurnCompleted, TurnEvent, TurnFailed
from .history import Checkpoint, ForkPlan
from .messages import ToolCall
from .records import (
    ChainEntry,
    ChildMemo,
    ChildStepId,
    InputRequest,
    SessionKey,
    SessionStatus,
    TurnStatus,
)
from .stores import SessionStore
from .subagents import child_ids

__all__ = ["ForkTools", "checked_fork", "plan_fork", "rerun_calls"]

ForkTools = Literal["live", "recorded"]
"""How a fork runs the owed tool calls of a turn under way at its checkpoint: ``live`` for
real, ``recorded`` answered from the source's recording (``durable_turns.replay.fork``)."""


async def checked_fork(store: SessionStore, agent: Agent, src: SessionKey, dst: SessionKey,
                       at: Checkpoint | None, *, then: str | None, tools: ForkTools | None,
                       owner: str | None) -> tuple[list[ForkPlan], list[str]]:
    """The plans of a fork (:func:`plan_fork`), checked, and the turns under way in it.

    Raises:
        ValueError: ``then`` at a checkpoint where a turn is under way.
        ForkRerunsToolsError: ``tools`` is not given and the fork would run local tool calls
            of a turn under way again.
        LookupError: no such checkpoint.
    """
    plans = await plan_fork(store, src, dst, at)
    under_way = [t.turn_id for t in plans[-1].chain if t.status == TurnStatus.QUEUED]
    if then is not None and under_way:
        raise ValueError(f"turn {under_way[0]!r} is under way at that checkpoint: fork "
                         "at a turn's end to start another turn with then=…")
    if tools is None and under_way:
        calls = [(c.id, c.name) for c in await rerun_calls(store, src, plans[-1], under_way)
                 if c.name in agent.tools_by_name and not agent.tools_by_name[c.name].remote]
        if calls:
            raise ForkRerunsToolsError(str(src), calls)
    if owner is not None:  # the fork's children too: its owner reads them
        plans = [replace(p, owner=owner) for p in plans]
    return plans, under_way


async def rerun_calls(store: SessionStore, src: SessionKey, plan: ForkPlan,
                      under_way: list[str]) -> list[ToolCall]:
    """The tool calls the fork's turns ``under_way`` asked for and had no result of at the
    checkpoint: what driving the fork runs first."""
    if plan.upto is None:
        return []
    at = [cp for cp in await store.checkpoints(src, generation=plan.generation)
          if cp.position == plan.upto]
    copied = (await store.read_messages(src, generation=plan.generation))[:at[0].messages]
    answered = {m.call_id for m in copied if m.role == "tool"}
    return [c for m in copied if m.role == "assistant" and m.turn_id in under_way
            for c in m.tool_calls if c.id not in answered]


async def plan_fork(store: SessionStore, src: SessionKey, dst: SessionKey,
                    at: Checkpoint | None = None) -> list[ForkPlan]:
    """The plans of a fork of ``src`` at ``at`` (default: its last checkpoint) as ``dst``,
    its children's first (the store writes them all at once).

    Raises:
        LookupError: ``src`` has no such checkpoint (or no checkpoint at all).
    """
    every = await store.checkpoints(src)
    if at is None:
        if not every:
            raise LookupError(f"session {src} has no checkpoint to fork from")
        at = every[-1]
    elif at not in every:
        raise LookupError(f"session {src} has no checkpoint {at.position} of generation "
                          f"{at.generation}")
    return await _plans(store, src, dst, at.generation, at.position, every)


async def _plans(store: SessionStore, src: SessionKey, dst: SessionKey, generation: int,
                 upto: tuple[int, int] | None,
                 every: list[Checkpoint] | None = None) -> list[ForkPlan]:
    if every is None:
        every = await store.checkpoints(src, generation=generation)
    copied = [cp for cp in every if cp.generation == generation and upto is not None
              and cp.position <= upto]
    own = [e for cp in copied for e in cp.events if e.child is None]
    chain = await store.entries(src)
    plans: list[ForkPlan] = []
    renames: dict[str, str] = {}
    for step_id, memo in _children(copied):
        child = SessionKey(memo.agent, memo.session)
        new_id, _turn = child_ids(step_id.turn_id, step_id.call_id)
        renames[memo.session] = new_id
        seen = max((int(e.child["seq"]) for cp in copied for e in cp.events
                    if e.child is not None and e.child.get("session") == memo.session),
                   default=0)
        child_every = await store.checkpoints(child)
        gen = next((cp.generation for cp in child_every if cp.turn_id == memo.turn_id), 0)
        plans += await _plans(store, child, SessionKey(memo.agent, new_id), gen,
                              (seen, 0) if seen else None, child_every)
    entries = _entries(chain, own, renames)
    plans.append(ForkPlan(src, dst, generation, upto, tuple(entries), _status(entries),
                          renames))
    return plans


def _children(copied: list[Checkpoint]) -> list[tuple[ChildStepId, ChildMemo]]:
    out = []
    for cp in copied:
        for s in cp.steps:
            step, memo = s.step, s.result
            if isinstance(step, ChildStepId) and isinstance(memo, ChildMemo):
                out.append((step, memo))
    return out


def _entries(chain: list[ChainEntry], own: list[TurnEvent],
             renames: dict[str, str]) -> list[ChainEntry]:
    """The source's turns that had begun by the checkpoint (an event of theirs was logged),
    each as it stood there."""
    by_turn: dict[str, list[TurnEvent]] = {}
    for e in own:
        by_turn.setdefault(e.turn_id, []).append(e)
    out = []
    for t in chain:
        events = by_turn.get(t.turn_id)
        if t.kind != "turn" or not events:
            continue
        out.append(replace(_as_of(t, events[-1], renames), cancel=None, data=None,
                           deliver=None))
    return out


def _as_of(t: ChainEntry, last: TurnEvent, renames: dict[str, str]) -> ChainEntry:
    """Turn ``t`` as it stood after its event ``last``."""
    blank = replace(t, text=None, error=None, reason=None, request=None)
    if isinstance(last, TurnCompleted):
        return replace(blank, status=TurnStatus.COMPLETED, text=last.text)
    if isinstance(last, TurnFailed):
        return replace(blank, status=TurnStatus.FAILED, error=last.error)
    if isinstance(last, TurnCancelled):
        return replace(blank, status=TurnStatus.CANCELLED, reason=last.reason)
    if isinstance(last, InputRequested):
        return replace(blank, status=TurnStatus.SUSPENDED,
                       request=_renamed(last.request, renames))
    # Under way at the checkpoint: queued, so that driving the fork goes on from there.
    return replace(blank, status=TurnStatus.QUEUED)


def _renamed(r: InputRequest, renames: dict[str, str]) -> InputRequest:
    child = r.child
    if child is not None and child.get("session") in renames:
        child = {**child, "session": renames[child["session"]]}
    return replace(r, child=child, more=tuple(_renamed(m, renames) for m in r.more))


def _status(entries: list[ChainEntry]) -> SessionStatus:
    if any(t.status == TurnStatus.SUSPENDED for t in entries):
        return "suspended"
    return "idle" if entries else "new"
