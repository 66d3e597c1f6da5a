"""Checks of a store's schedules (F24, ``store.schedules``): stored and read back, claimed
once, moved on once."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from ..schedules import Schedule
from ..stores import SessionStore

__all__ = ["check_due_schedules_are_claimed_once", "check_schedules_are_stored_and_read_back"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _every(name: str, seconds: float, agent: str = "agent") -> Schedule:
    return Schedule.define(name, agent=agent, seed=f"run {name}", every=seconds, start=T0,
                           channel="slack", target={"channel_id": "C1"}, overlap="queue",
                           missed="run_once")


async def check_schedules_are_stored_and_read_back(store: SessionStore) -> None:
    """A schedule is read back as put (by name, of an agent), replaced by a put of its name,
    and deleted once."""
    book = store.schedules
    a, b = _every("b-report", 60), _every("a-digest", 3600, agent="other")
    assert await book.all() == []
    await book.put(a)
    await book.put(b)
    assert await book.all() == [b, a]
    assert await book.all("agent") == [a]
    assert await book.get("b-report") == a
    assert await book.get("nope") is None
    moved = replace(a, seed="another", next_fire=T0 + timedelta(hours=5))
    await book.put(moved)
    assert await book.get("b-report") == moved
    assert await book.delete("b-report") is True
    assert await book.delete("b-report") is False
    assert await book.all() == [b]


async def check_due_schedules_are_claimed_once(store: SessionStore) -> None:
    """Due schedules are claimed oldest first, by one claimer each (also when two claim at
    once), not before they are due, not while a claim holds (and again once it ran out);
    ``advance`` moves one on only from the time it was claimed at."""
    book = store.schedules
    for name, seconds in (("s1", 60), ("s2", 30), ("s3", 600)):
        await book.put(_every(name, seconds))
    await book.put(_every("elsewhere", 30, agent="other"))
    now = T0 + timedelta(seconds=60)
    assert await book.next_due(["agent"]) == T0 + timedelta(seconds=30)
    until = now + timedelta(seconds=30)
    got = await asyncio.gather(*(book.claim(now, until, f"w{i}", 10, agents=["agent"])
                                 for i in range(2)))
    names = sorted(s.name for claimed in got for s in claimed)
    assert names == ["s1", "s2"], names  # each once; s3 is not due; "other"'s not asked for
    assert await book.claim(now, until, "w3", 10, agents=["agent"]) == []
    # A claim held: the earliest time one can be claimed is when it runs out.
    assert await book.next_due(["agent"]) == until
    s1 = await book.get("s1")
    assert s1 is not None and s1.next_fire == now
    moved = replace(s1, next_fire=now + timedelta(seconds=60), last_fire=now,
                    last_turn="schedule:s1:x")
    assert await book.advance(moved, now) is True
    assert await book.advance(moved, now) is False  # moved on already from that time
    assert await book.get("s1") == moved
    later = until + timedelta(seconds=1)  # s2's claim ran out
    again = await book.claim(later, later + timedelta(seconds=30), "w3", 10, agents=["agent"])
    assert [s.name for s in again] == ["s2"]
    assert await book.release("s2", "w3") is True
    assert [s.name for s in await book.claim(later, later, "w4", 10)] == ["elsewhere", "s2"]
