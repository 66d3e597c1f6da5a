"""Schedules (F24): a turn nobody typed, started at its times, once per time.

A :class:`Schedule` says when (``cron`` in a time zone, ``every`` so many seconds, or once
``at`` a time), which session of which agent gets the turn and with what opening text
(``seed``), and what happens when a fire finds a turn of the session still running
(``overlap``) or comes after a downtime that covered several of its times (``missed``).
Each fire's turn id is derived from the schedule's name and the fire's *nominal* time
(:func:`fire_turn_id`), never from the clock of whichever process fires it: two workers, a
restart, or two machines whose clocks disagree all start the same turn, which the store
accepts once.

>>> s = Schedule.define("report", agent="ops", seed="Post the report", every=3600,
...                     start=datetime(2026, 1, 1, tzinfo=UTC))
>>> s.next_fire.isoformat()
'2026-01-01T01:00:00+00:00'
>>> fire_turn_id("report", s.next_fire)
'schedule:report:20260101T010000Z'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, cast, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .clock import utc
from .errors import DurableTurnsError

__all__ = [
    "MAX_EVERY",
    "MISSED",
    "MISSED_AFTER",
    "OVERLAP",
    "Missed",
    "Overlap",
    "Schedule",
    "ScheduleBook",
    "ScheduleError",
    "UnknownScheduleError",
    "fire_turn_id",
]

Overlap = Literal["skip", "queue", "replace"]
"""What a fire does while a turn of its session is unfinished: ``skip`` the fire,
``queue`` its turn behind, or ``replace`` the unfinished turns (they are cancelled)."""
Missed = Literal["skip", "run_once"]
"""What a fire that comes late does: ``skip`` every time that was missed (the next one on
time fires), or ``run_once`` for all of them (one turn, at the latest missed time)."""

OVERLAP: tuple[str, ...] = ("skip", "queue", "replace")
MISSED: tuple[str, ...] = ("skip", "run_once")

MISSED_AFTER = timedelta(seconds=10)
"""A fire found later than this after its time, or with a later time of the schedule also
due, was *missed* (a downtime): ``missed`` decides whether it runs."""

MAX_EVERY = 10 * 366 * 86400
"""The longest ``every``, in seconds (ten years)."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class ScheduleError(DurableTurnsError, ValueError):
    """A schedule that cannot be: two of ``cron``/``every``/``at`` (or none), a cron
    expression or a time zone that does not parse, an unknown policy, a bad name; nothing
    was stored."""


class UnknownScheduleError(DurableTurnsError, LookupError):
    """No schedule of that name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")
        self.name = name


def fire_turn_id(name: str, at: datetime) -> str:
    """The turn id of the fire of schedule ``name`` at its nominal time ``at`` (UTC, to the
    second): the same in every process that fires it."""
    return f"schedule:{name}:{utc(at).strftime('%Y%m%dT%H%M%SZ')}"


def _zone(tz: str) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise ScheduleError(f"tz must be a time zone name such as 'Europe/Paris', not {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ScheduleError(f"unknown time zone {tz!r}: use an IANA name such as "
                            "'UTC' or 'Europe/Paris'") from e


def _cron_after(expr: str, tz: str, after: datetime) -> datetime | None:
    """The first time the cron expression matches strictly after ``after``, in ``tz``."""
    from cronsim import CronSim, CronSimError  # only schedules with ``cron`` need it

    local = utc(after).astimezone(_zone(tz)).replace(microsecond=0)
    try:
        it = CronSim(expr, local)
        nxt = next(it)
    except StopIteration:
        return None
    except (CronSimError, ValueError, LookupError, OverflowError) as e:
        raise ScheduleError(f"cron {expr!r} does not parse: {e}") from e
    return utc(nxt)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A stored schedule and where it stands; make one with :meth:`define` (it checks).

    Attributes:
        name: unique in the store (letters, digits, ``_.-``; up to 100).
        agent: the agent whose session gets the turns.
        session: the session (default ``schedule:<name>``).
        seed: the turn's opening text (a ``trigger`` message attributed to ``by``).
        cron: a cron expression (5 fields, or 6 with seconds), read in ``tz``.
        every: seconds between fires.
        at: the one time it fires.
        tz: the cron's time zone (IANA name).
        target: where the channel delivers (Slack: ``{"channel_id": "C…"}``).
        channel: the channel (by name) that delivers each fire's turn, as ``receive`` does.
        by: who the trigger is attributed to (default ``schedule:<name>``).
        overlap: see :data:`Overlap`.
        missed: see :data:`Missed`.
        next_fire: its next time (``None``: it will not fire again, an ``at`` that fired).
        last_fire: the nominal time of its last fire (run or skipped).
        last_turn: the turn id its last fire started (``None``: none yet, or skipped).
        start: what ``every`` counts from.
    """

    name: str
    agent: str
    seed: str
    session: str = ""
    cron: str | None = None
    every: float | None = None
    at: datetime | None = None
    tz: str = "UTC"
    target: Mapping[str, Any] | None = None
    channel: str | None = None
    by: str = ""
    overlap: Overlap = "skip"
    missed: Missed = "skip"
    next_fire: datetime | None = None
    last_fire: datetime | None = None
    last_turn: str | None = None
    start: datetime | None = None

    @classmethod
    def define(cls, name: str, *, agent: str, seed: str, session: str | None = None,
               cron: str | None = None, every: float | timedelta | None = None,
               at: datetime | str | None = None, tz: str = "UTC",
               target: Mapping[str, Any] | None = None, channel: str | None = None,
               by: str | None = None, overlap: str = "skip", missed: str = "skip",
               start: datetime | None = None) -> Schedule:
        """A checked schedule, its next fire after ``start`` (default: now).

        Raises:
            ScheduleError: what is wrong with it, in words.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ScheduleError(
                f"schedule name {name!r}: letters, digits, '_', '.', '-' (up to 100), "
                "starting with a letter or digit")
        if not isinstance(agent, str) or not agent:
            raise ScheduleError("a schedule needs an agent")
        if not isinstance(seed, str) or not seed.strip():
            raise ScheduleError("a schedule needs a seed: the text that opens its turns")
        given = [k for k, v in (("cron", cron), ("every", every), ("at", at)) if v is not None]
        if len(given) != 1:
            raise ScheduleError(
                "a schedule needs exactly one of cron=, every= or at=, not "
                + (" and ".join(given) if given else "none"))
        if overlap not in OVERLAP:
            raise ScheduleError(f"overlap must be one of {', '.join(OVERLAP)}, not {overlap!r}")
        if missed not in MISSED:
            raise ScheduleError(f"missed must be one of {', '.join(MISSED)}, not {missed!r}")
        _zone(tz)
        if isinstance(every, timedelta):
            every = every.total_seconds()
        if every is not None:
            if isinstance(every, bool) or not isinstance(every, (int, float)) \
                    or not math.isfinite(every) or not 1 <= every <= MAX_EVERY:
                raise ScheduleError(f"every must be a number of seconds from 1 to {MAX_EVERY} "
                                    f"(ten years), not {every!r}")
            every = float(every)
        if isinstance(at, str):
            try:
                at = datetime.fromisoformat(at)
            except ValueError as e:
                raise ScheduleError(f"at={at!r} is no ISO 8601 time") from e
        if at is not None:
            if not isinstance(at, datetime):
                raise ScheduleError(f"at must be a datetime, not {at!r}")
            if at.tzinfo is None:
                at = at.replace(tzinfo=ZoneInfo(tz))
            try:
                at = utc(at).replace(microsecond=0)
            except OverflowError as e:
                raise ScheduleError(f"at={at.isoformat()} is out of range") from e
        if cron is not None and not isinstance(cron, str):
            raise ScheduleError(f"cron must be a string, not {cron!r}")
        if target is not None and not isinstance(target, Mapping):
            raise ScheduleError(f"target must be an object, not {target!r}")
        if channel is not None and (not isinstance(channel, str) or not channel):
            raise ScheduleError(f"channel must be a channel's name, not {channel!r}")
        if target is not None and channel is None:
            raise ScheduleError("a target needs the channel that delivers to it (channel=…)")
        begin = utc(start).replace(microsecond=0) if start is not None \
            else datetime.now(UTC).replace(microsecond=0)
        s = cls(name=name, agent=agent, seed=seed, session=session or f"schedule:{name}",
                cron=cron, every=every, at=at, tz=tz,
                target=dict(target) if target is not None else None, channel=channel,
                by=by or f"schedule:{name}", overlap=cast(Overlap, overlap),
                missed=cast(Missed, missed), start=begin)
        return replace(s, next_fire=at if at is not None else s.after(begin))

    def same_definition(self, other: Schedule) -> bool:
        """Whether ``other`` defines the same schedule (where each stands aside): an app
        folder's schedules, put again at each start, keep their times."""
        keep = ("next_fire", "last_fire", "last_turn", "start")
        mine, theirs = self.to_dict(), other.to_dict()
        return all(mine[k] == theirs[k] for k in mine if k not in keep)

    def after(self, when: datetime) -> datetime | None:
        """Its first time strictly after ``when`` (``None``: no more)."""
        when = utc(when)
        if self.at is not None:
            return self.at if self.at > when else None
        if self.every is not None:
            origin = self.start or when
            n = math.floor((when - origin).total_seconds() / self.every) + 1
            t = origin + timedelta(seconds=n * self.every)
            while t <= when:  # float rounding
                t += timedelta(seconds=self.every)
            return t.replace(microsecond=0) if self.every.is_integer() else t
        assert self.cron is not None
        return _cron_after(self.cron, self.tz, when)

    def due(self, now: datetime) -> tuple[datetime | None, datetime | None, list[datetime]]:
        """What a fire at ``now`` does: ``(fire, next, skipped)`` — the nominal time to fire
        (``None``: nothing, every due time was missed and ``missed="skip"``), its next time
        after ``now``, and the due times it lets go without a turn."""
        now = utc(now)
        if self.next_fire is None or self.next_fire > now:
            return None, self.next_fire, []
        times = [self.next_fire]
        while True:
            t = self.after(times[-1])
            if t is None or t > now:
                nxt = t
                break
            times.append(t)
            if len(times) > 100_000:  # a tiny interval over a long downtime
                nxt = self.after(now)
                break
        latest = times[-1]
        # Late counts from when it could first have fired: an ``at`` already past when it
        # was defined fires at once, on time.
        since = max(latest, self.start) if self.start is not None else latest
        on_time = len(times) == 1 and now - since <= MISSED_AFTER
        if on_time or self.missed == "run_once":
            return latest, nxt, times[:-1]
        if now - latest <= MISSED_AFTER:  # the earlier ones were missed; this one is on time
            return latest, nxt, times[:-1]
        return None, nxt, times

    def to_dict(self) -> dict[str, Any]:
        """Its JSON form (times in ISO 8601), as the HTTP routes and the CLI show it."""
        def iso(t: datetime | None) -> str | None:
            return None if t is None else t.isoformat()

        return {"name": self.name, "agent": self.agent, "session": self.session,
                "seed": self.seed, "cron": self.cron, "every": self.every, "at": iso(self.at),
                "tz": self.tz, "target": None if self.target is None else dict(self.target),
                "channel": self.channel, "by": self.by, "overlap": self.overlap,
                "missed": self.missed, "next_fire": iso(self.next_fire),
                "last_fire": iso(self.last_fire), "last_turn": self.last_turn,
                "start": iso(self.start)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        """Read back :meth:`to_dict` (as stored; not checked again)."""
        def time(v: Any) -> datetime | None:
            return None if v is None else utc(datetime.fromisoformat(v))

        return cls(name=data["name"], agent=data["agent"], seed=data["seed"],
                   session=data["session"], cron=data.get("cron"), every=data.get("every"),
                   at=time(data.get("at")), tz=data.get("tz", "UTC"),
                   target=data.get("target"), channel=data.get("channel"),
                   by=data.get("by", ""), overlap=data.get("overlap", "skip"),
                   missed=data.get("missed", "skip"), next_fire=time(data.get("next_fire")),
                   last_fire=time(data.get("last_fire")), last_turn=data.get("last_turn"),
                   start=time(data.get("start")))


@runtime_checkable
class ScheduleBook(Protocol):
    """Where a store keeps its schedules (``store.schedules``): every shipped store has one,
    in its ``schedules`` table; the conformance suite checks it."""

    async def put(self, schedule: Schedule) -> None:
        """Store it under its name, replacing one of that name (and a claim of it)."""
        ...

    async def get(self, name: str) -> Schedule | None:
        """The schedule of that name, or ``None``."""
        ...

    async def delete(self, name: str) -> bool:
        """Delete it; whether there was one."""
        ...

    async def all(self, agent: str | None = None) -> list[Schedule]:
        """Every schedule (of ``agent``), by name."""
        ...

    async def claim(self, now: datetime, until: datetime, owner: str, limit: int = 100, *,
                    agents: Sequence[str] | None = None) -> list[Schedule]:
        """Claim up to ``limit`` schedules (of ``agents``) due at ``now`` (``next_fire <=
        now``) that nobody holds (or whose claim ran out), for ``owner`` until ``until``,
        oldest due first: two claimers at once never get the same one."""
        ...

    async def advance(self, schedule: Schedule, claimed: datetime) -> bool:
        """Store where ``schedule`` stands after its fire of the time ``claimed`` (its
        ``next_fire``, ``last_fire``, ``last_turn``) and drop its claim, unless someone
        already moved it on from ``claimed``; whether it did."""
        ...

    async def release(self, name: str, owner: str) -> bool:
        """Give ``owner``'s claim back without moving the schedule."""
        ...

    async def next_due(self, agents: Sequence[str] | None = None) -> datetime | None:
        """The earliest time a schedule (of ``agents``) can be claimed: its ``next_fire``,
        or when a claim of it runs out."""
        ...

    def watch(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` after each put or delete made through this book; returns the undo."""
        ...
