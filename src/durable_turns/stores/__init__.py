"""The ``SessionStore`` seam (F1) and its backends.

A store keeps, per session ``(agent, session_id)``: the session row (status, generation), the
turn chain (one row per accepted turn, in the order ``start()`` accepted them), the message
log, the steps table and the event log.

Writing session state needs a :class:`Lease`: at most one holder per session across every
process and machine sharing the store. All writes of one step go through one
:class:`Transaction`, which commits them together or not at all. Two writes need no lease,
because they are single atomic statements any process may make: accepting a turn
(:meth:`SessionStore.enqueue_turn`) and asking for a cancellation.

Backends: :class:`~durable_turns.stores.memory.MemoryStore`,
:class:`~durable_turns.stores.sqlite.SqliteStore` and (extra ``[postgres]``)
``PostgresStore``. ``durable_turns.testing`` holds the conformance suite they all pass.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from ..events import EventRecord, TurnEvent
from ..messages import Message

T = TypeVar("T")

SessionStatus = Literal["new", "idle", "running", "suspended"]
TurnStatus = Literal["queued", "running", "suspended", "completed", "failed", "cancelled"]
TurnKind = Literal["turn", "reset"]

UNFINISHED: frozenset[str] = frozenset({"queued", "running"})
"""Turn statuses the turn chain still has to drive."""
FINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True, slots=True, order=True)
class SessionKey:
    """The address of a session."""

    agent: str
    session: str

    def __str__(self) -> str:
        return f"{self.agent}/{self.session}"


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One turn of the chain, as the store keeps it."""

    turn_id: str
    ordinal: int
    """Position in the chain: turns run in increasing ordinal."""
    status: TurnStatus
    opening: Message
    """The message that opens the turn (appended to the log once, when the turn starts)."""
    event: dict[str, Any] | None = None
    """The inbound event, minus ``raw``."""
    policy: dict[str, Any] | None = None
    """The surface policy the turn runs under."""
    request: dict[str, Any] | None = None
    """The pending input request while suspended."""
    text: str | None = None
    error: str | None = None
    reason: str | None = None
    cancel: str | None = None
    """A durable cancellation request's reason, if one was made."""
    kind: TurnKind = "turn"
    """``reset`` for a session reset waiting its place in the chain (F8)."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    status: SessionStatus
    generation: int


@dataclass(slots=True)
class TurnUpdate:
    """Fields of a turn row a transaction changes (``None`` = leave as is)."""

    status: TurnStatus
    text: str | None = None
    error: str | None = None
    reason: str | None = None
    request: dict[str, Any] | None = None


@dataclass(slots=True)
class Writes:
    """Everything one transaction will write, buffered until commit."""

    messages: list[Message] = field(default_factory=list)
    steps: list[tuple[str, str, str]] = field(default_factory=list)
    """``(step_id, turn_id, data)``."""
    events: list[TurnEvent] = field(default_factory=list)
    turns: dict[str, TurnUpdate] = field(default_factory=dict)
    status: SessionStatus | None = None
    new_generation: bool = False
    """Archive the live log: bump the generation, status ``new``, cancel a stale park."""


class Transaction(Protocol):
    """One step's writes. Commits on leaving its ``async with`` block, rolls back on error.

    Writes are buffered and flushed at commit, so a transaction holds the database's write
    lock only while a local tool runs and while it commits. The block must not await anything
    but :meth:`run_local`, so no other task can interleave on a shared connection.
    """

    writes: Writes
    """What the transaction will write (read by the engine after commit)."""

    def unwrap(self) -> Any:
        """The backend's raw handle, inside this transaction (``None`` for MemoryStore)."""
        ...

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(raw_handle)`` inside the transaction, in a savepoint.

        If ``fn`` raises, its writes are rolled back (to the savepoint) and the exception
        propagates; the transaction itself stays usable. MemoryStore has no rollback.
        """
        ...

    def add_message(self, message: Message) -> int:
        """Append to the message log; returns the message's index."""
        ...

    def add_step(self, step_id: str, turn_id: str, data: str) -> None: ...

    def add_event(self, event: TurnEvent) -> TurnEvent:
        """Log an event; returns it with its sequence number."""
        ...

    def set_turn(self, turn_id: str, update: TurnUpdate) -> None: ...

    def set_status(self, status: SessionStatus) -> None: ...

    def new_generation(self) -> None:
        """Archive the live log under the current generation and start an empty one (F8).

        The session's status becomes ``new`` and a suspended turn is cancelled (``reset``).
        """
        ...


class Lease(Protocol):
    """The right to write one session's state. Held by one holder at a time, everywhere.

    Released by :meth:`release`, and by the backend when the holder's process dies (an OS file
    lock for SQLite, the connection's advisory lock for PostgreSQL), so a crashed worker never
    blocks a replay.
    """

    key: SessionKey
    generation: int
    last_seq: int
    """The highest event sequence number committed so far."""
    message_count: int
    """How many messages the live log has."""

    def transaction(self) -> AbstractAsyncContextManager[Transaction]: ...

    async def cancel_requested(self, turn_id: str) -> str | None:
        """The reason of a durable cancellation request for the turn, if one was made.

        Read at every checkpoint boundary: keep it one indexed lookup.
        """
        ...

    async def release(self) -> None: ...


class SessionStore(Protocol):
    """Durable session state. Every backend passes ``durable_turns.testing``'s suite."""

    async def open(self) -> None:
        """Open (and create or migrate) the store. Idempotent."""
        ...

    async def close(self) -> None: ...

    def unwrap(self) -> Any:
        """The backend's raw handle outside any step (for set-up and inspection)."""
        ...

    async def acquire(self, key: SessionKey, *, timeout: float | None = None) -> Lease:
        """Take the session's lease, waiting up to ``timeout`` seconds (``None``: forever).

        Raises:
            LeaseTimeoutError: another holder kept it past the timeout.
        """
        ...

    async def enqueue_turn(self, key: SessionKey, turn_id: str, opening: Message,
                           event: dict[str, Any] | None = None,
                           policy: dict[str, Any] | None = None, *, kind: TurnKind = "turn",
                           supersede: str | None = None) -> tuple[TurnRecord, bool]:
        """Accept a turn at the end of the chain, durably; creates the session if needed.

        In the same transaction, with ``supersede`` set, every queued or running turn gets a
        cancellation request with that reason (``replace=True``). A ``reset`` entry always
        supersedes (reason ``reset``) and is accepted even while the session is parked.

        Returns the turn and whether it was new. A turn id the session already has is
        returned as it is (a redelivery).

        Raises:
            SessionBusyError: a turn of the session is suspended and no reset is queued.
        """
        ...

    async def request_cancel(self, key: SessionKey, turn_id: str | None, reason: str) -> list[str]:
        """Durably ask unfinished turns (one, or all with ``None``) to cancel; returns their ids."""
        ...

    async def get_turn(self, key: SessionKey, turn_id: str) -> TurnRecord | None: ...

    async def turns(self, key: SessionKey, *, unfinished: bool = False) -> list[TurnRecord]:
        """The session's turns in chain order (only queued/running/suspended ones if asked)."""
        ...

    async def session_info(self, key: SessionKey) -> SessionInfo | None: ...

    async def read_messages(self, key: SessionKey, *, after: int = 0,
                            generation: int | None = None) -> list[Message]:
        """The message log from index ``after`` on (the live generation by default)."""
        ...

    async def read_step(self, key: SessionKey, step_id: str) -> str | None: ...

    async def read_steps(self, key: SessionKey, generation: int) -> dict[str, str]:
        """Every step of one generation (live or archived), by step id."""
        ...

    async def read_events(self, key: SessionKey, *, after_seq: int = 0,
                          turn_id: str | None = None) -> list[EventRecord]: ...

    async def unfinished_sessions(self) -> list[SessionKey]:
        """Sessions with a queued or running turn (what ``Runtime.recover()`` replays)."""
        ...

    async def parked_sessions(self) -> list[SessionKey]:
        """Sessions with a turn parked on a person (what an operator's inbox lists)."""
        ...

    async def sessions_with_turn(self, turn_id: str) -> list[SessionKey]:
        """The sessions that accepted a turn with this id (turn ids are per session)."""
        ...

