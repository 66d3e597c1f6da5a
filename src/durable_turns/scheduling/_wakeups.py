"""The store's wake-ups as a due source of the clock loop (F24): a sleep's end, a request's
deadline, a reminder. A due timer is claimed (one claimer each: PostgreSQL's ``SKIP
LOCKED``), then fired as a queued command (``commands.Wake``, ``commands.Remind``) whose
chain entry id is its own, so a timer fired twice (a claim whose holder died) is one wake."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Protocol

from ..agent import Agent
from ..clock import Clock
from ..commands import Remind, Wake
from ..records import ChainEntry, InputRequest, NewEntry, SessionKey
from ..stores import SessionStore, Timer

__all__ = ["CLAIM_HOLD", "StoreWakeups", "Woken"]

log = logging.getLogger("durable_turns")

CLAIM_HOLD = 30.0
"""Seconds a claimed timer is held before another claimer may fire it (its holder died)."""


class Woken(Protocol):
    """What :class:`StoreWakeups` uses of its runtime (:class:`~durable_turns.Runtime`)."""

    @property
    def store(self) -> SessionStore: ...

    @property
    def agents(self) -> Mapping[str, Agent]: ...

    @property
    def clock(self) -> Clock: ...

    async def accept(self, key: SessionKey, entry: NewEntry) -> tuple[ChainEntry, bool]: ...


class StoreWakeups:
    """The runtime's store's timers for its agents' sessions, as a
    :class:`~durable_turns.scheduling.DueSource` (every runtime's clock loop has one)."""

    def __init__(self, runtime: Woken, *, limit: int = 100) -> None:
        self.runtime = runtime
        self.limit = limit

    def __repr__(self) -> str:
        return "StoreWakeups()"

    async def next_due(self) -> datetime | None:
        return await self.runtime.store.next_timer(list(self.runtime.agents))

    async def fire_due(self, now: datetime) -> None:
        rt = self.runtime
        while True:
            claimed = await rt.store.claim_timers(list(rt.agents), now, limit=self.limit,
                                                  hold=CLAIM_HOLD)
            for timer in claimed:
                try:
                    await self._fire(timer, now)
                except Exception:  # its claim ends, and it is fired again then
                    log.exception("durable_turns: firing %s of %s failed", timer.id, timer.key)
            if len(claimed) < self.limit:
                return

    async def _fire(self, timer: Timer, now: datetime) -> None:
        store = self.runtime.store
        request = _standing(await store.entries(timer.key, unfinished=True), timer)
        if request is None:  # answered, cancelled or reset meanwhile
            await store.drop_timer(timer)
            return
        if timer.kind == "wake":
            by = "clock" if request.sleep else "timeout"
            value = None if request.sleep else request.default
            await self.runtime.accept(timer.key, Wake(timer.turn_id, timer.input_id, value, by,
                                                      now.timestamp()).entry())
            await store.drop_timer(timer)
            return
        await self.runtime.accept(timer.key, Remind(timer.turn_id, timer.input_id,
                                                    timer.due.isoformat()).entry())
        every = request.remind_every or 0.0
        later = timer.due + timedelta(seconds=every)
        while every > 0 and later <= now:  # reminders missed while no process ran: one
            later += timedelta(seconds=every)
        expires = None if request.expires is None else datetime.fromisoformat(request.expires)
        if every > 0 and (expires is None or later < expires):
            await store.arm_timer(replace(timer, due=later))
        else:
            await store.drop_timer(timer)


def _standing(pending: list[ChainEntry], timer: Timer) -> InputRequest | None:
    """The request the timer is for, if its turn is still parked on it."""
    for entry in pending:
        if entry.parked and entry.turn_id == timer.turn_id and entry.request is not None:
            return next((r for r in entry.request.all if r.id == timer.input_id), None)
    return None
