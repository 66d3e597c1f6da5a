"""Firing schedules (F24): the schedules of a runtime's store as a source of due work.

:class:`ScheduleFires` is what ``Runtime.schedule``, ``unschedule`` and ``schedules`` use,
and what the runtime's clock asks (:meth:`ScheduleFires.next_due`) and tells
(:meth:`ScheduleFires.fire_due`) — called with an explicit time, so a test moves a
:class:`~durable_turns.clock.ManualClock` instead of waiting.

A fire, for each schedule due at ``now``:

1. it is claimed in the store (``ScheduleBook.claim``: one worker each; PostgreSQL's claim
   skips the rows another worker is claiming);
2. :meth:`Schedule.due <durable_turns.schedules.Schedule.due>` says which of its due times
   fires (``missed``: after a downtime, none or one);
3. the fire's turn is started (a ``trigger`` message attributed to ``by``, kind
   ``schedule``) with the id :func:`~durable_turns.schedules.fire_turn_id` derives from the
   schedule and that time — unless the turn of that id is in the session already (another
   worker, or this one before a crash, fired it) or ``overlap="skip"`` finds another turn
   of the session unfinished; ``replace`` cancels it, ``queue`` queues behind it. With a
   ``channel`` the turn is owed that channel's delivery, as ``receive`` does;
4. the schedule moves on to its next time (a compare-and-set on the time it claimed).

A crash between 3 and 4 fires the same time again, which starts the same turn id: the store
accepts it once. So a fire runs once across workers, restarts and clocks that disagree.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from .clock import Clock, utc
from .errors import SessionBusyError, TurnConflictError, UnknownAgentError
from .inbound import InboundEvent, Trigger
from .records import SessionKey
from .schedules import Schedule, ScheduleError, UnknownScheduleError, fire_turn_id
from .sessions import AgentSession, RuntimeAPI

__all__ = ["CLAIM_FOR", "SCHEDULE", "Fired", "ScheduleFires", "fire_until"]

log = logging.getLogger("durable_turns")

CLAIM_FOR = timedelta(seconds=30)
"""How long a worker holds a due schedule it claimed: a worker that died holding one has it
fired by another this long after."""

SCHEDULE = "schedule"
"""The name a fire's turn keeps ``{"name", "fire"}`` under in its data, and its trigger's
kind."""


@dataclass(frozen=True, slots=True)
class Fired:
    """What one fire did.

    Attributes:
        schedule: the schedule's name.
        at: the nominal time it fired for (``None``: every due time was missed and let go).
        turn_id: the turn it started (or found started); ``None`` when it started none.
        outcome: ``started``, ``found`` (the turn was there: a second fire of the time),
            ``skipped`` (``overlap="skip"``, or the session is parked), ``missed``
            (``missed="skip"``).
    """

    schedule: str
    at: datetime | None
    turn_id: str | None
    outcome: str


FireHook = Callable[[Schedule, Fired], Awaitable[None]]


class ScheduleFires:
    """A runtime's schedules: defined, listed, and fired when due.

    Args:
        runtime: whose store keeps them and whose sessions get the turns.
        clock: what a new schedule's first time counts from (the runtime's).
        changed: called once a schedule was stored or deleted here (the runtime's clock loop
            looks again: a new schedule may be due before it would have looked).
        owner: this process's name in the claims (default: random).
        claim_for: how long a claim holds (:data:`CLAIM_FOR`).
        batch: how many due schedules one claim takes.
        parallel: how many of them fire at once.
    """

    def __init__(self, runtime: RuntimeAPI, clock: Clock, *, owner: str | None = None,
                 claim_for: timedelta = CLAIM_FOR, batch: int = 100, parallel: int = 16,
                 changed: Callable[[], None] | None = None) -> None:
        self.runtime = runtime
        self.clock = clock
        self.changed = changed
        self.owner = owner or uuid.uuid4().hex
        self.claim_for = claim_for
        self.batch = batch
        self.parallel = parallel
        self._hooks: list[FireHook] = []

    def on_fire(self, hook: FireHook) -> Callable[[], None]:
        """Await ``hook(schedule, fired)`` after each fire that started (or found) a turn —
        a host that has the schedule's channel delivers it (``channels.deliver_fires``).
        Returns the undo."""
        self._hooks.append(hook)

        def undo() -> None:
            if hook in self._hooks:
                self._hooks.remove(hook)
        return undo

    # -- the API Runtime.schedule / unschedule / schedules expose ---------------------------

    async def define(self, name: str, *, agent: str, seed: str, now: datetime | None = None,
                     **spec: Any) -> Schedule:
        """Check and store a schedule (replacing one of that name); returns it with its next
        fire after ``now``. The same definition stored again keeps where it stands (its next
        fire, a fire a downtime missed), so an app folder's schedules may be put at each
        start.

        Raises:
            ScheduleError: what is wrong with it.
            UnknownAgentError: the runtime has no such agent.
        """
        self.runtime.require_open()
        if agent not in self.runtime.agents:
            raise UnknownAgentError(agent, sorted(self.runtime.agents))
        known = {"session", "cron", "every", "at", "tz", "target", "channel", "by",
                 "overlap", "missed"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ScheduleError(f"a schedule has no {', '.join(unknown)}: it takes "
                                f"{', '.join(sorted(known))}")
        s = Schedule.define(name, agent=agent, seed=seed,
                            start=now if now is not None else self.clock.now(), **spec)
        book = self.runtime.store.schedules
        old = await book.get(name)
        if old is not None and old.same_definition(s):
            return old
        await book.put(s)
        if self.changed is not None:
            self.changed()
        return s

    async def remove(self, name: str) -> None:
        """Delete the schedule (turns it started are left as they are).

        Raises:
            UnknownScheduleError: there is none of that name.
        """
        self.runtime.require_open()
        if not await self.runtime.store.schedules.delete(name):
            raise UnknownScheduleError(name)
        if self.changed is not None:
            self.changed()

    async def all(self, agent: str | None = None) -> list[Schedule]:
        """Every schedule (of ``agent``), by name."""
        self.runtime.require_open()
        return await self.runtime.store.schedules.all(agent)

    async def turns(self, schedule: Schedule) -> list[str]:
        """The ids of the turns the schedule's fires started, oldest first (in its session's
        chain)."""
        prefix = f"{SCHEDULE}:{schedule.name}:"
        entries = await self.runtime.store.entries(SessionKey(schedule.agent, schedule.session))
        return [e.turn_id for e in entries if e.turn_id.startswith(prefix)]

    # -- the clock's due source -----------------------------------------------------------

    async def next_due(self) -> datetime | None:
        """``DueSource.next_due``: the earliest time a schedule of this runtime's agents can
        be claimed (its next fire, or when another worker's claim of it runs out)."""
        return await self.runtime.store.schedules.next_due(sorted(self.runtime.agents))

    async def fire_due(self, now: datetime) -> None:
        """``DueSource.fire_due``: :meth:`fire`, for the runtime's clock loop."""
        await self.fire(now)

    async def fire(self, now: datetime) -> list[Fired]:
        """Fire every schedule of this runtime's agents due at ``now``: claimed, fired (or
        let go, as its policies say), moved on. Returns what each fire did."""
        now = utc(now)
        book = self.runtime.store.schedules
        out: list[Fired] = []
        gate = asyncio.Semaphore(self.parallel)
        while True:
            claimed = await book.claim(now, now + self.claim_for, self.owner, self.batch,
                                       agents=sorted(self.runtime.agents))

            async def one(s: Schedule) -> Fired | None:
                async with gate:
                    try:
                        return await self._fire(s, now)
                    except Exception:
                        log.exception("firing schedule %r failed; it is fired again once its "
                                      "claim runs out", s.name)
                        return None

            # Each schedule's fire is its own (its own session, its own row): they run side
            # by side, as many at once as ``parallel`` says.
            out += [f for f in await asyncio.gather(*(one(s) for s in claimed))
                    if f is not None]
            if len(claimed) < self.batch:
                return out

    async def _fire(self, s: Schedule, now: datetime) -> Fired:
        claimed = s.next_fire
        assert claimed is not None  # a claim takes due schedules only
        at, nxt, let_go = s.due(now)
        if at is None:
            fired = Fired(s.name, None, None, "missed")
            log.info("schedule %r missed %d time(s) (missed='skip')", s.name, len(let_go))
            last = let_go[-1] if let_go else s.last_fire
        else:
            fired = await self._start(s, at)
            last = at
        moved = replace(s, next_fire=nxt, last_fire=last,
                        last_turn=fired.turn_id if fired.turn_id is not None else s.last_turn)
        await self.runtime.store.schedules.advance(moved, claimed)
        if fired.turn_id is not None:
            for hook in list(self._hooks):
                try:
                    await hook(moved, fired)
                except Exception:
                    log.exception("a hook of schedule %r's fire failed", s.name)
        return fired

    async def _start(self, s: Schedule, at: datetime) -> Fired:
        turn_id = fire_turn_id(s.name, at)
        key = SessionKey(s.agent, s.session)
        store = self.runtime.store
        if await store.entries(key, turn_id=turn_id):
            return Fired(s.name, at, turn_id, "found")
        others = [e for e in await store.entries(key, unfinished=True)
                  if e.kind == "turn" and e.turn_id != turn_id]
        if others and s.overlap == "skip":
            log.info("schedule %r skipped %s: turn %s is unfinished (overlap='skip')",
                     s.name, at.isoformat(), others[0].turn_id)
            return Fired(s.name, at, None, "skipped")
        event = None
        if s.channel is not None:
            event = InboundEvent(s.channel, None, s.seed, meta={
                "deliver": {"channel": s.channel, "target": dict(s.target or {})}})
        session = AgentSession(self.runtime, key)
        try:
            started = await session.start(
                s.seed, turn_id=turn_id, event=event, trigger=Trigger(SCHEDULE, s.by),
                deliver=s.channel, mode="replace" if others and s.overlap == "replace"
                else "queue", data={SCHEDULE: {"name": s.name, "fire": at.isoformat()}})
        except SessionBusyError as e:
            log.info("schedule %r skipped %s: %s", s.name, at.isoformat(), e)
            return Fired(s.name, at, None, "skipped")
        except TurnConflictError:  # the name was defined anew with another seed
            return Fired(s.name, at, turn_id, "found")
        return Fired(s.name, at, turn_id, "started" if started.new else "found")


async def fire_until(fires: ScheduleFires, until: datetime,
                     stop: asyncio.Event | None = None) -> list[Fired]:
    """Fire every schedule due up to ``until`` as if the clock went there one due time
    after another (a replay of time for tests and benchmarks; a worker's clock does the
    same as time passes)."""
    out: list[Fired] = []
    while stop is None or not stop.is_set():
        nxt = await fires.next_due()
        if nxt is None or nxt > until:
            return out
        got = await fires.fire(nxt)
        if not got:
            return out
        out += got
    return out

