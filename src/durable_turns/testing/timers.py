"""Checks of wake-ups (F24): a park arms its timers in its own commit; the due ones are
claimed once, each by one claimer at a time, until dropped or their hold ends."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from ..records import InputRequest
from ..stores import SessionStore, Timer
from .helpers import KEY, park

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def check_a_park_arms_its_timers(store: SessionStore) -> None:
    """A turn parked on a request with a deadline and reminders, and one parked on a sleep,
    have their timers armed by the park's commit, read back to the millisecond; a park made
    again keeps the times it had."""
    assert await store.next_timer([KEY.agent]) is None
    ask = InputRequest("ok", "ok?", expires=_at(60).isoformat(), default=False,
                       remind_every=20.0, remind_at=_at(20.5).isoformat())
    await park(store, KEY, "t1", ask)
    assert await store.next_timer([KEY.agent]) == _at(20.5)
    assert await store.next_timer(["another agent"]) is None
    await park(store, KEY, "t1", replace(ask, remind_at=_at(40).isoformat()))
    assert await store.next_timer([KEY.agent]) == _at(20.5)
    assert await store.claim_timers([KEY.agent], _at(20)) == []
    claimed = await store.claim_timers([KEY.agent], _at(61))
    assert {(t.kind, t.id, t.due, t.turn_id, t.input_id) for t in claimed} == {
        ("remind", "remind:t1:ok", _at(20.5), "t1", "ok"),
        ("wake", "wake:t1:ok", _at(60), "t1", "ok"),
    }
    assert all(t.key == KEY for t in claimed)


async def check_due_timers_are_claimed_once(store: SessionStore) -> None:
    """Claims made at once never share a timer; a claimed timer is not due again until its
    hold ends (then it is claimed again), nor after it was dropped; one armed again moves."""
    for i in range(6):
        await park(store, type(KEY)(KEY.agent, f"s{i}"), f"t{i}",
                   InputRequest("zz", "", expires=_at(i).isoformat(), sleep=True))
    now = _at(10)
    got = await asyncio.gather(*(store.claim_timers([KEY.agent], now, limit=2, hold=30)
                                 for _ in range(4)))
    ids = [(t.key, t.id) for batch in got for t in batch]
    assert len(ids) == len(set(ids)) == 6, got
    assert await store.claim_timers([KEY.agent], now) == []
    assert await store.next_timer([KEY.agent]) == now + timedelta(seconds=30)
    first: Timer = got[0][0]
    await store.drop_timer(first)
    again = await store.claim_timers([KEY.agent], _at(41))
    assert len(again) == 5 and (first.key, first.id) not in {(t.key, t.id) for t in again}
    moved = replace(again[0], due=_at(100))
    await store.arm_timer(moved)
    await store.drop_timer(again[0])  # the fire of the old due: the moved one stays
    held = await store.claim_timers([KEY.agent], _at(99), hold=300)  # the others' holds ended
    assert len(held) == 4 and moved.id not in {t.id for t in held if t.key == moved.key}
    assert [(t.key, t.id) for t in await store.claim_timers([KEY.agent], _at(100))] == [
        (moved.key, moved.id)]


__all__ = ["T0", "check_a_park_arms_its_timers", "check_due_timers_are_claimed_once"]
