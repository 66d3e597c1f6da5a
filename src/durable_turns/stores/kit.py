"""The public store kit: what every backend builds on, whatever it keeps its rows in.

- the event feed (:class:`Feed`, :class:`Subscription`, from ``stores._feed``): a store makes
  one, tells it of its own commits (``published``) and of what may have changed elsewhere
  (``changed``), and hands out its subscriptions and watchers;
- the lease's counters (:class:`LeaseCounters`) and the buffered transaction
  (:class:`BufferedTransaction`, collecting a step's :class:`Writes` until commit), so a
  transaction numbers its messages and events itself;
- the chain's rules that are decided in Python (:func:`check_enqueue`, each entry's rule while
  a turn is parked,
  :func:`supersede_reason`, :func:`updated_request`);
- the timers a park arms (:func:`timers_of`, F24) and the times SQL keeps
  (:func:`millis`, :func:`from_millis`);
- claim helpers: :func:`retry_until` (a claim that waits, backing off) and
  :func:`claim_found` (``claim_ready`` from a list of candidates and a claim that does not
  wait);
- :class:`StoreThread` (from ``stores._thread``): a thread of its own for a driver that blocks;
- live events across processes (from ``stores.live``): :class:`LiveRelay` coalesces a store's
  live events into frames over the :class:`LiveWire` its dialect brings, and offers the
  frames other processes send to the feed.

A SQL backend needs less than this: ``durable_turns.stores.sql`` uses the kit and leaves a
dialect only its connection, its SQL's differences, its transactions and its wake-ups.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from ..clock import utc
from ..errors import LeaseTimeoutError, SessionBusyError
from ..events import TurnEvent
from ..messages import Message
from ..records import (
    EntryKind,
    SessionKey,
    SessionStatus,
    StepId,
    StepResult,
    TurnResult,
    TurnStatus,
    WhileParked,
)
from . import Timer
from ._feed import Feed, Subscription
from ._thread import StoreThread
from .live import LiveRelay, LiveWire

__all__ = [
    "BufferedTransaction",
    "Feed",
    "LeaseCounters",
    "LiveRelay",
    "LiveWire",
    "StoreThread",
    "Subscription",
    "Writes",
    "check_enqueue",
    "claim_found",
    "from_millis",
    "millis",
    "retry_until",
    "supersede_reason",
    "timers_of",
    "updated_request",
    "utc_time",
]

T = TypeVar("T")
L = TypeVar("L")


@dataclass(slots=True)
class Writes:
    """Everything one transaction will write, buffered until commit."""

    messages: list[Message] = field(default_factory=list)
    steps: list[tuple[str, str, str]] = field(default_factory=list)
    """``(step_id, turn_id, data)``."""
    events: list[TurnEvent] = field(default_factory=list)
    turns: dict[str, TurnResult] = field(default_factory=dict)
    data: list[tuple[str, str, Any]] = field(default_factory=list)
    """``(turn_id, name, value)``: names of chain entries' data to set, each on its own."""
    status: SessionStatus | None = None
    new_generation: bool = False
    """Archive the live log: bump the generation, status ``new``."""


class LeaseCounters:
    """What a lease knows of its session, so a transaction can number messages and events
    itself (a store's lease class inherits it; the attributes are the ``Lease`` Protocol's).

    Args:
        key: the session.
        epoch: the claim's fencing token.
        generation: the live generation when claimed.
        last_seq: the newest event seq committed.
        message_count: the live generation's messages.
    """

    def __init__(self, key: SessionKey, epoch: int, generation: int, last_seq: int,
                 message_count: int) -> None:
        self.key = key
        self.epoch = epoch
        self.generation = generation
        self.last_seq = last_seq
        self.message_count = message_count


class BufferedTransaction:
    """Collects a step's writes (the ``Transaction`` Protocol's ``add_*`` and ``set_*``); the
    backend flushes :attr:`writes` in one go at commit, then calls :meth:`committed`.

    Args:
        lease: the lease whose counters number the messages and events.
    """

    def __init__(self, lease: LeaseCounters) -> None:
        self.lease = lease
        self.writes = Writes()
        self._seq = lease.last_seq
        self._count = lease.message_count

    def add_message(self, message: Message) -> int:
        """Buffer a message; returns the index it gets."""
        self.writes.messages.append(message)
        self._count += 1
        return self._count - 1

    def add_step(self, step: StepId, turn_id: str, result: StepResult) -> None:
        """Buffer a checkpoint, encoded once."""
        self.writes.steps.append((str(step), turn_id, result.to_json()))

    def add_event(self, event: TurnEvent) -> TurnEvent:
        """Buffer an event, numbered in place; returns it."""
        self._seq += 1
        # The event was made for this transaction and is not shared yet: number it in place
        # (dataclasses.replace would rebuild it, a measurable cost on every step).
        object.__setattr__(event, "seq", self._seq)
        self.writes.events.append(event)
        return event

    def set_turn(self, result: TurnResult) -> None:
        """Buffer a chain entry's new status and outcome."""
        self.writes.turns[result.turn_id] = result

    def set_turn_data(self, turn_id: str, name: str, value: Any) -> None:
        """Buffer one name of a chain entry's data."""
        self.writes.data.append((turn_id, name, value))

    def set_status(self, status: SessionStatus) -> None:
        """Buffer the session's new status."""
        self.writes.status = status

    def new_generation(self) -> None:
        """Buffer the archive of the live generation."""
        self.writes.new_generation = True

    def first_index(self) -> int:
        """The index the first buffered message gets."""
        return self.lease.message_count

    def committed(self) -> None:
        """Advance the lease's counters once the backend committed."""
        self.lease.last_seq = self._seq
        self.lease.message_count = self._count
        if self.writes.new_generation:
            self.lease.generation += 1
            self.lease.message_count = 0


async def retry_until(attempt: Callable[[], Awaitable[T | None]], key: SessionKey,
                      timeout: float | None, *, first_pause: float = 0.002) -> T:
    """Await ``attempt()`` until it returns something other than ``None``, backing off from
    ``first_pause`` up to 100 ms between tries: a claim that waits for a lease held elsewhere.

    Returns:
        What the successful attempt returned.

    Raises:
        LeaseTimeoutError: ``timeout`` seconds passed (``None``: never), after one try at
            least.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = first_pause
    while True:
        got = await attempt()
        if got is not None:
            return got
        if deadline is not None and time.monotonic() >= deadline:
            raise LeaseTimeoutError(str(key), timeout)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.1)


async def claim_found(find: Callable[[int], Awaitable[list[SessionKey]]],
                      claim: Callable[[SessionKey], Awaitable[L]], agents: Collection[str],
                      limit: int) -> list[L]:
    """``claim_ready`` for a store whose leases live outside its database (one machine's):
    candidates from ``find(n)`` (up to ``n`` sessions with work whose lease looks free), then a
    claim that does not wait (``claim``) of each of these agents' sessions, up to ``limit``;
    a session someone claimed meanwhile (``LeaseTimeoutError``) is passed over.

    Returns:
        The leases claimed.
    """
    leases: list[L] = []
    if limit <= 0:
        return leases
    for key in await find(max(limit * 4, 100)):
        if key.agent not in agents:
            continue
        try:
            leases.append(await claim(key))
        except LeaseTimeoutError:
            continue
        if len(leases) >= limit:
            break
    return leases


def check_enqueue(key: SessionKey, rule: WhileParked,
                  unfinished: Iterable[tuple[str, str, str | None, WhileParked]]) -> None:
    """The rule for accepting a chain entry while a turn is parked (its request not withdrawn
    by a cancel): each entry declares its own (``NewEntry.parked_rule``, :data:`~durable_turns.
    records.WhileParked`). A ``refused`` one (a turn) is refused, unless an entry that
    ``clears`` is queued (its place ends the park); others are accepted.

    Args:
        key: the session.
        rule: the new entry's rule.
        unfinished: ``(turn_id, status, cancel, rule)`` of the session's unfinished entries
            (a stored entry's rule: :func:`~durable_turns.records.decode_while_parked`).

    Raises:
        SessionBusyError: naming the parked turn.
    """
    if rule != "refused":
        return
    parked = None
    for turn_id, status, cancel, entry_rule in unfinished:
        if status == TurnStatus.SUSPENDED and cancel is None:
            parked = turn_id
        elif entry_rule == "clears" and status == TurnStatus.QUEUED:
            return
    if parked is not None:
        raise SessionBusyError(str(key), parked)


def supersede_reason(kind: EntryKind, supersede: str | None) -> str | None:
    """The cancellation reason a new entry gives the unfinished turns before it, if any: the
    one it carries (``NewEntry.supersede``, a command's own; ``kind`` is kept for the stores
    that call this)."""
    return supersede


def timers_of(key: SessionKey, result: TurnResult) -> list[Timer]:
    """The timers a commit of ``result`` arms (F24): for a turn suspended on requests, a
    ``wake`` at each one's ``expires`` (a sleep's end, a deadline) and a ``remind`` at each
    one's ``remind_at``. A store writes them in the commit's transaction, keeping a timer of
    the same id that it has already (a park made again keeps its first times)."""
    if result.status != TurnStatus.SUSPENDED or result.request is None:
        return []
    out: list[Timer] = []
    for r in result.request.all:
        if r.expires is not None:
            out.append(Timer(key, f"wake:{result.turn_id}:{r.id}", utc_time(r.expires),
                             "wake", result.turn_id, r.id))
        if r.remind_at is not None and not r.sleep:
            out.append(Timer(key, f"remind:{result.turn_id}:{r.id}", utc_time(r.remind_at),
                             "remind", result.turn_id, r.id))
    return out


def utc_time(text: str) -> datetime:
    """An ISO time a request keeps, as an aware datetime in UTC."""
    return utc(datetime.fromisoformat(text))


def millis(when: datetime) -> int:
    """A time as the integer milliseconds since the epoch that the SQL stores keep."""
    return round(utc(when).timestamp() * 1000)


def from_millis(ms: int) -> datetime:
    """:func:`millis` read back."""
    return datetime.fromtimestamp(ms / 1000, UTC)


def updated_request(result: TurnResult) -> dict[str, Any] | None:
    """The pending request a turn row keeps after ``result``: only a suspended turn has one."""
    if result.status == TurnStatus.SUSPENDED and result.request is not None:
        return result.request.to_dict()
    return None
