"""What a session's driver and its turn engine use of their runtime, in one object.

:class:`StepContext` is made once per :class:`~durable_turns.Runtime` and passed down to
every :class:`~durable_turns.engine._driver.SessionDriver` and
:class:`~durable_turns.engine._loop.TurnEngine` it makes, instead of each taking the store, the
model, the runtime's sessions and its callbacks one by one. :class:`TranscriptCache` (the live
logs of recently stepped sessions) is one of its parts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..agent import Agent
from ..clock import Clock, SystemClock
from ..commands import Registry
from ..context import Sessions
from ..events import TurnEvent
from ..messages import Message, MessageLog
from ..model import Model
from ..records import SessionKey, TurnResult
from ..stores import Lease, SessionStore

__all__ = ["StepContext", "TranscriptCache"]


class TranscriptCache:
    """The live logs of recently stepped sessions, so a turn never re-reads its history.

    Args:
        size: how many sessions' transcripts to keep.
    """

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._logs: OrderedDict[SessionKey, tuple[int, list[Message]]] = OrderedDict()

    async def load(self, store: SessionStore, lease: Lease) -> list[Message]:
        """The live log under ``lease``: from the cache when current, reading only the tail."""
        key = lease.key
        cached = self._logs.pop(key, None)
        if cached is None or cached[0] != lease.generation or len(cached[1]) > lease.message_count:
            cached = (lease.generation, MessageLog())
        log_ = cached[1]
        if len(log_) < lease.message_count:
            log_.extend(await store.read_messages(key, after=len(log_)))
        self.keep(key, lease.generation, log_)
        return log_

    def keep(self, key: SessionKey, generation: int, log_: list[Message]) -> None:
        """Keep ``log_`` as the session's live log of ``generation``."""
        self._logs[key] = (generation, log_)
        self._logs.move_to_end(key)
        while len(self._logs) > self.size:
            self._logs.popitem(last=False)

    def forget(self, key: SessionKey) -> None:
        """Drop the session's log (a step failed: the next one reads the store)."""
        self._logs.pop(key, None)

    def peek(self, key: SessionKey) -> list[Message] | None:
        """The session's live log as the last step here left it, if it is kept."""
        cached = self._logs.get(key)
        return None if cached is None else cached[1]


@dataclass(frozen=True, slots=True)
class StepContext:
    """The runtime's collaborators, as its drivers and engines see them."""

    store: SessionStore
    """Where the sessions live; every step commits to it under the session's lease."""
    agents: Mapping[str, Agent]
    """The runtime's agents, by name."""
    model_for: Callable[[Agent], Model]
    """The model an agent's turns ask (raises ``ConfigurationError`` when it has none)."""
    sessions: Sessions
    """The runtime's other sessions, for tools that start durable child work (subagents,
    F13) and the parent-close policy of commands."""
    transcripts: TranscriptCache
    """The runtime's cache of live logs."""
    publish: Callable[[list[TurnEvent]], None]
    """Receives each committed step's events (the runtime's sink)."""
    publish_live: Callable[[TurnEvent], None]
    """Receives live events, never stored: text as it streams, retries."""
    wants_live: Callable[[SessionKey], bool]
    """Whether anyone takes the session's live text now (else deltas are not even built)."""
    finished: Callable[[SessionKey, TurnResult], None]
    """Told each chain entry's end (or park), for the runtime's waiters."""
    commands: Registry
    """The runtime's command registry: how a chain entry's command is read back and
    applied."""
    clock: Clock = field(default_factory=SystemClock)
    """The runtime's clock: when a request's deadline or a sleep ends (F24)."""
