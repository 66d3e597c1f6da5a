"""What every backend's lease and transaction share: buffered writes and counters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from ..errors import LeaseTimeoutError, SessionBusyError
from ..events import TurnEvent
from ..messages import Message
from . import SessionKey, SessionStatus, TurnUpdate, Writes


class LeaseBase:
    """Counters a lease keeps so a transaction can number messages and events itself."""

    def __init__(self, key: SessionKey, generation: int, last_seq: int, message_count: int):
        self.key = key
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

    def add_step(self, step_id: str, turn_id: str, data: str) -> None:
        self.writes.steps.append((step_id, turn_id, data))

    def add_event(self, event: TurnEvent) -> TurnEvent:
        self._seq += 1
        # The event was made for this transaction and is not shared yet: number it in place
        # (dataclasses.replace would rebuild it, a measurable cost on every step).
        object.__setattr__(event, "seq", self._seq)
        self.writes.events.append(event)
        return event

    def set_turn(self, turn_id: str, update: TurnUpdate) -> None:
        self.writes.turns[turn_id] = update

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


async def poll_until(
    try_once: Callable[[], bool], key: SessionKey, timeout: float | None
) -> None:
    """Call ``try_once()`` until it returns true, backing off up to 100 ms between tries."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.002
    while not try_once():
        if deadline is not None and time.monotonic() >= deadline:
            raise LeaseTimeoutError(
                f"session {key} is being driven by another holder; gave up after {timeout}s"
            )
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.1)


def check_not_parked(key: SessionKey, turns: Iterable[tuple[str, str, str]]) -> None:
    """Refuse a new turn while one is parked, unless a reset is queued to clear the park.

    Args:
        turns: ``(turn_id, status, kind)`` of the session's unfinished turns.
    """
    parked = None
    for turn_id, status, kind in turns:
        if status == "suspended":
            parked = turn_id
        elif kind == "reset" and status == "queued":
            return
    if parked is not None:
        raise SessionBusyError(
            f"session {key} is parked on turn {parked!r} waiting for input; "
            "resume it (or reset the session) before starting another turn"
        )
