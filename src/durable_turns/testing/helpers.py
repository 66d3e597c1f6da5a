"""What the conformance checks share, and helpers users need to test their own agents."""

from __future__ import annotations

from typing import Any

from ..events import MessageCompleted, TurnCompleted, TurnStarted
from ..messages import Message
from ..records import (
    ChainEntry,
    InputRequest,
    NewEntry,
    SessionKey,
    StepResult,
    TurnResult,
    TurnStatus,
)
from ..stores import SessionStore

KEY = SessionKey("agent", "s1")
"""The session most checks use."""


def opening(turn_id: str, text: str = "hello") -> Message:
    """A turn's opening message."""
    return Message("user", text, turn_id=turn_id)


def event_ids(turn_id: str) -> dict[str, Any]:
    """The ids an event of a turn of :data:`KEY` carries."""
    return {"agent": KEY.agent, "session": KEY.session, "turn_id": turn_id}


async def park(store: SessionStore, key: SessionKey, turn_id: str,
               request: InputRequest | None = None) -> None:
    """Accept the turn ``turn_id`` (if new) and park it on ``request`` (default: ``ok?``), as a
    driver would: the turn suspended and the session's status with it."""
    await store.enqueue(key, NewEntry(turn_id, opening(turn_id)))
    lease = await store.claim(key)
    async with lease.transaction() as tx:
        tx.set_turn(TurnResult(turn_id, TurnStatus.SUSPENDED,
                               request=request or InputRequest("ok", "ok?")))
        tx.set_status("suspended")
    await lease.release()


async def get_turn(store: SessionStore, key: SessionKey, turn_id: str) -> ChainEntry | None:
    """The chain entry ``turn_id`` of a session, or ``None``."""
    found = await store.entries(key, turn_id=turn_id)
    return found[0] if found else None


async def step_result(store: SessionStore, key: SessionKey,
                      step_id: str) -> StepResult | None:
    """What a checkpointed step of the live generation keeps, or ``None``."""
    steps = await store.read_steps(key, step_id=step_id)
    return steps[step_id].result if step_id in steps else None


async def commit_events(store: SessionStore, key: SessionKey, turn_id: str, n: int) -> None:
    """Commit ``n`` ``turn.started`` events of a turn under a lease of their own."""
    lease = await store.claim(key)
    try:
        async with lease.transaction() as tx:
            for i in range(n):
                tx.add_event(TurnStarted(agent=key.agent, session=key.session, turn_id=turn_id,
                                         text=f"e{lease.last_seq + i + 1}"))
    finally:
        await lease.release()


async def grow(store: SessionStore, turns: range, per_turn: int) -> list[Message]:
    """Turns of ``per_turn`` messages each (an opening, replies, a two-message commit, a
    commit without events), every turn started and ended: what a long session is made of."""
    written: list[Message] = []
    for t in turns:
        tid = f"g{t}"
        await store.enqueue(KEY, NewEntry(tid, opening(tid)))
        lease = await store.claim(KEY)
        async with lease.transaction() as tx:
            tx.add_message(opening(tid))
            tx.add_event(TurnStarted(**event_ids(tid), text="hello"))
            tx.set_turn(TurnResult(tid, TurnStatus.RUNNING))
        step = [opening(tid)]
        for k in range(1, per_turn - 1):
            reply = Message("assistant", f"{tid} reply {k}", turn_id=tid)
            pair = [Message("tool", call_id=f"{tid}-{k}", result={"k": k}, turn_id=tid),
                    Message("assistant", f"{tid} after {k}", turn_id=tid)]
            batch = pair if k % 5 == 0 else [reply]
            async with lease.transaction() as tx:
                for m in batch:
                    tx.add_message(m)
                if k % 7:  # and every seventh commit has no event
                    tx.add_event(MessageCompleted(**event_ids(tid), text=batch[-1].text))
            step += batch
        last = Message("assistant", f"{tid} done", turn_id=tid)
        async with lease.transaction() as tx:
            tx.add_message(last)
            tx.add_event(TurnCompleted(**event_ids(tid), text=last.text))
            tx.set_turn(TurnResult(tid, TurnStatus.COMPLETED, text=last.text))
        await lease.release()
        written += [*step, last]
    return written


__all__ = [
    "KEY",
    "commit_events",
    "event_ids",
    "get_turn",
    "grow",
    "opening",
    "park",
    "step_result",
]
