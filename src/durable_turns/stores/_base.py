"""What every backend shares: the lease's counters, the buffered transaction, and the rules
of the chain, written once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
    encode_step,
)


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
    """Archive the live log: bump the generation, status ``new``, cancel a stale park."""


class LeaseBase:
    """Counters a lease keeps so a transaction can number messages and events itself."""

    def __init__(self, key: SessionKey, epoch: int, generation: int, last_seq: int,
                 message_count: int) -> None:
        self.key = key
        self.epoch = epoch
        self.generation = generation
        self.last_seq = last_seq
        self.message_count = message_count


class BufferedTransaction:
    """Collects a step's writes; the backend flushes them in one go at commit."""

    def __init__(self, lease: LeaseBase) -> None:
        self.lease = lease
        self.writes = Writes()
        self._seq = lease.last_seq
        self._count = lease.message_count

    def add_message(self, message: Message) -> int:
        self.writes.messages.append(message)
        self._count += 1
        return self._count - 1

    def add_step(self, step: StepId, turn_id: str, result: StepResult) -> None:
        self.writes.steps.append((str(step), turn_id, encode_step(result)))

    def add_event(self, event: TurnEvent) -> TurnEvent:
        self._seq += 1
        # The event was made for this transaction and is not shared yet: number it in place
        # (dataclasses.replace would rebuild it, a measurable cost on every step).
        object.__setattr__(event, "seq", self._seq)
        self.writes.events.append(event)
        return event

    def set_turn(self, result: TurnResult) -> None:
        self.writes.turns[result.turn_id] = result

    def set_turn_data(self, turn_id: str, name: str, value: Any) -> None:
        self.writes.data.append((turn_id, name, value))

    def set_status(self, status: SessionStatus) -> None:
        self.writes.status = status

    def new_generation(self) -> None:
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


L = TypeVar("L")


async def claim_found(find: Callable[[int], Awaitable[list[SessionKey]]],
                      claim: Callable[[SessionKey], Awaitable[L]], agents: Collection[str],
                      limit: int) -> list[L]:
    """``claim_ready`` for a store of one machine: its ``find_claimable`` (``find``), then a
    claim that does not wait (``claim``) of each of these agents' sessions, up to ``limit``;
    a session someone claimed meanwhile is passed over."""
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


async def poll_until(
    try_once: Callable[[], bool], key: SessionKey, timeout: float | None
) -> None:
    """Call ``try_once()`` until it returns true, backing off up to 100 ms between tries."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.002
    while not try_once():
        if deadline is not None and time.monotonic() >= deadline:
            raise LeaseTimeoutError(str(key), timeout)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.1)


def check_enqueue(key: SessionKey, kind: EntryKind,
                  unfinished: Iterable[tuple[str, str, str, str | None]]) -> None:
    """The rule for accepting a chain entry: a ``turn`` is refused while a turn is parked
    (and its request not withdrawn by a cancel), unless a reset is queued to clear the park;
    commands are always accepted.

    Args:
        unfinished: ``(turn_id, status, kind, cancel)`` of the session's unfinished entries.

    Raises:
        SessionBusyError: naming the parked turn.
    """
    if kind != "turn":
        return
    parked = None
    for turn_id, status, entry_kind, cancel in unfinished:
        if status == TurnStatus.SUSPENDED and cancel is None:
            parked = turn_id
        elif entry_kind == "reset" and status == TurnStatus.QUEUED:
            return
    if parked is not None:
        raise SessionBusyError(str(key), parked)


def supersede_reason(kind: EntryKind, supersede: str | None) -> str | None:
    """The cancellation reason a new entry gives the unfinished turns before it, if any."""
    return "reset" if kind == "reset" else supersede


def updated_request(result: TurnResult) -> dict[str, Any] | None:
    """The pending request a turn row keeps after ``result``: only a suspended turn has one."""
    if result.status == TurnStatus.SUSPENDED and result.request is not None:
        return result.request.to_dict()
    return None
