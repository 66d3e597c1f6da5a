"""The ``SessionStore`` seam (F1) and its backends.

A store keeps, per session ``(agent, session_id)``: the session row (status, generation,
lease epoch), the chain (one entry per accepted turn or command, in the order they were
accepted), the message log, the steps table and the event log.

Writing session state needs a :class:`Lease`, claimed with :meth:`SessionStore.claim`. A lease
carries an **epoch** (a fencing token): every claim of a session gets a higher one, and every
commit checks, inside its own transaction, that its lease's epoch is still the session's. A
holder that was taken over (its lease expired while it was paused, or it was released) gets
:class:`~durable_turns.errors.LeaseLostError` and nothing of its step is written.

All writes of one step go through one :class:`Transaction`, which commits them together or
not at all. Two writes need no lease, because they are single atomic statements any process
may make: accepting a chain entry (:meth:`SessionStore.enqueue`) and asking for a
cancellation (:meth:`SessionStore.request_cancel`).

Every store has an **event feed**: :meth:`SessionStore.subscribe` yields a session's stored
events after a cursor, then live ones, woken by the store itself (in-process for
MemoryStore, a cheap change check for SQLite, NOTIFY for PostgreSQL), whichever process
committed them.

Backends: :class:`~durable_turns.stores.memory.MemoryStore`,
:class:`~durable_turns.stores.sqlite.SqliteStore`,
:class:`~durable_turns.stores.postgres.PostgresStore` (extra ``postgres``). The rules SQL
backends share live in ``stores/_sql.py``; ``durable_turns.testing`` holds the conformance
suite every store passes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol, TypeVar

from ..events import TurnEvent
from ..messages import Message
from ..records import (
    NewEntry,
    SessionInfo,
    SessionKey,
    SessionStatus,
    StepId,
    StepRecord,
    StepResult,
    TurnRecord,
    TurnResult,
)
from ._feed import Subscription, Watcher

T = TypeVar("T")

__all__ = [
    "Lease",
    "NewEntry",
    "SessionInfo",
    "SessionKey",
    "SessionStatus",
    "SessionStore",
    "StepRecord",
    "Subscription",
    "Transaction",
    "TurnRecord",
    "Watcher",
]

SessionFilter = Literal["unfinished", "parked"]


class Transaction(Protocol):
    """One step's writes. Commits on leaving its ``async with`` block, rolls back on error.

    Writes are buffered and flushed at commit, so a transaction holds the database's write
    lock only while a local tool runs and while it commits. The block must not await anything
    but :meth:`run_local`.

    Raises (on leaving the block):
        LeaseLostError: the lease was taken over; nothing was written.
        StoreError: the database refused the commit; nothing was written.
    """

    def unwrap(self) -> Any:
        """The backend's raw handle, inside this transaction (``None`` for MemoryStore)."""
        ...

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(raw_handle)`` inside the transaction, in a savepoint (on the store's own
        thread where it has one).

        If ``fn`` raises, its writes are rolled back (to the savepoint) and the exception
        propagates; the transaction itself stays usable. MemoryStore has no rollback.
        """
        ...

    def add_message(self, message: Message) -> int:
        """Append to the message log; returns the message's index."""
        ...

    def add_step(self, step: StepId, turn_id: str, result: StepResult) -> None:
        """Checkpoint a step of turn ``turn_id`` under the live generation, with what it
        keeps (stored as :func:`~durable_turns.records.encode_step` writes it)."""
        ...

    def add_event(self, event: TurnEvent) -> TurnEvent:
        """Log an event; returns it with its sequence number (published after commit)."""
        ...

    def set_turn(self, result: TurnResult) -> None:
        """Set a chain entry's status and outcome, all of it (``text``, ``error``, ``reason``,
        ``request`` as in ``result``). A status other than ``suspended`` clears the pending
        request. Never touches the entry's ``data``.
        """
        ...

    def set_turn_data(self, turn_id: str, name: str, value: Any) -> None:
        """Set ``data[name] = value`` on a chain entry with this commit, leaving its other
        names as they are (what another owner set meanwhile, even without a lease, stays)."""
        ...

    def set_status(self, status: SessionStatus) -> None: ...

    def new_generation(self) -> None:
        """Archive the live log under the current generation and start an empty one (F8).

        The session's status becomes ``new`` and a suspended turn is cancelled (``reset``).
        """
        ...


class Lease(Protocol):
    """The right to write one session's state; held by one holder at a time, everywhere.

    Released by :meth:`release`, and by the backend when the holder's process dies (an OS file
    lock for SQLite), so a crashed worker never blocks a replay.
    """

    key: SessionKey
    epoch: int
    """The fencing token: higher than every earlier claim's of this session."""
    generation: int
    last_seq: int
    """The highest event sequence number committed so far."""
    message_count: int
    """How many messages the live log has."""

    def transaction(self) -> AbstractAsyncContextManager[Transaction]: ...

    async def cancel_requested(self, turn_id: str) -> str | None:
        """The reason of a durable cancellation request for the turn, if one was made."""
        ...

    async def release(self) -> None: ...


class SessionStore(Protocol):
    """Durable session state. Every backend passes ``durable_turns.testing``'s suite.

    Reads never wait for a writer: a reader sees the last committed state.
    """

    async def open(self) -> None:
        """Open (and create or migrate) the store. Idempotent; safe when many processes
        open one new store at the same moment."""
        ...

    async def close(self) -> None: ...

    def unwrap(self) -> Any:
        """The backend's raw handle outside any step (for set-up and inspection)."""
        ...

    async def claim(self, key: SessionKey, *, timeout: float | None = None) -> Lease:
        """Take the session's lease with a new epoch, waiting up to ``timeout`` seconds
        (``None``: forever). Creates the session if needed.

        Raises:
            LeaseTimeoutError: another holder kept it past the timeout.
        """
        ...

    async def enqueue(self, key: SessionKey, entry: NewEntry) -> tuple[TurnRecord, bool]:
        """Accept a chain entry (a turn or a command) at the end of the chain, durably;
        creates the session if needed.

        In the same transaction, with ``entry.supersede`` set, every queued or running turn
        gets a cancellation request with that reason (``replace=True``); a parked turn never
        does. A ``reset`` always supersedes (reason ``reset``). Commands (``reset``,
        ``resume``, ``retry``) are accepted while the session is parked; a ``turn`` is not.

        Returns the entry and whether it was new. An id the session already has is returned
        as it is (a redelivery).

        Raises:
            SessionBusyError: a turn of the session is parked (its request not withdrawn)
                and no reset is queued.
        """
        ...

    async def request_cancel(self, key: SessionKey, turn_id: str | None, reason: str) -> list[str]:
        """Durably ask unfinished turns (one, or all with ``None``) to cancel, parked ones
        included (their request is withdrawn: a parked turn with a cancel is no longer
        answerable, and is work for a driver, which ends it); returns their ids."""
        ...

    async def set_turn_data(self, key: SessionKey, turn_id: str, name: str, value: Any, *,
                            only_new: bool = False) -> Any:
        """Set ``data[name] = value`` on a chain entry, durably, leaving its other names as
        they are; with ``only_new``, only if ``name`` is not set yet (a compare-and-set).

        Needs no lease (one atomic write, like :meth:`request_cancel`): a channel keeps its
        delivery state with the turn this way (a stream's message ts, a posted prompt's ts)
        while the turn runs. Never touches the entry's status or outcome, and the engine's
        writes never drop a name set here.

        Returns:
            The value stored under ``name`` after the call (the earlier one when ``only_new``
            found it set), or ``None`` when the session has no such entry.
        """
        ...

    async def turns(self, key: SessionKey, *, turn_id: str | None = None,
                    unfinished: bool = False) -> list[TurnRecord]:
        """The session's chain in order: every entry, only one (``turn_id``), or only the
        queued, running and suspended ones (``unfinished``)."""
        ...

    async def session_info(self, key: SessionKey) -> SessionInfo | None: ...

    async def read_messages(self, key: SessionKey, *, after: int = 0,
                            generation: int | None = None) -> list[Message]:
        """The message log from index ``after`` on (the live generation by default)."""
        ...

    async def read_steps(self, key: SessionKey, *, generation: int | None = None,
                         step_id: str | None = None) -> dict[str, StepRecord]:
        """The steps of one generation (live by default, or an archived one), by id; only
        ``step_id`` if given."""
        ...

    async def read_events(self, key: SessionKey, *, after_seq: int = 0,
                          turn_id: str | None = None) -> list[TurnEvent]:
        """The session's logged events after ``after_seq``, in order (of one turn if given)."""
        ...

    def subscribe(self, key: SessionKey, after_seq: int | None = None) -> Subscription:
        """The session's events after ``after_seq`` (stored ones first), then live ones, with
        no gap and no duplicate; ``None`` starts at the newest event. Never raises for an
        unknown session: it yields what that session gets."""
        ...

    def watch(self, key: SessionKey | None, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher(events)`` when this process commits events of the session, and
        ``watcher(None)`` when anything of it may have changed elsewhere (another process's
        commit, a cancel or enqueue). ``key=None`` watches every session, with ``None`` only
        (a worker waking for new work). Spurious calls are allowed. Returns the function
        that stops watching."""
        ...

    async def find_sessions(self, which: SessionFilter | None = None, *,
                            turn_id: str | None = None) -> list[SessionKey]:
        """Sessions with work for a driver (``unfinished``: a queued or running turn, or a
        parked one with a cancel to carry out: what recovery drives), with a parked turn
        whose request stands (``parked``: an operator's inbox), or with a turn of this id."""
        ...

    async def find_claimable(self, limit: int = 100) -> list[SessionKey]:
        """Up to ``limit`` sessions with a queued or running turn whose lease nobody holds
        now (free, or expired where leases expire): what a worker looking for work claims.

        A hint, not a reservation: another worker may claim one first (the claim then fails
        or waits), and a lease taken or freed meanwhile is seen at the next look.
        """

    async def claim_ready(self, agents: Collection[str], limit: int = 100) -> Sequence[Lease]:
        """Claim, without waiting, up to ``limit`` sessions of these agents that have a queued
        or running turn and whose lease nobody holds (free, or expired where leases expire,
        whoever held it): what a worker looking for work drives. Each lease has a new epoch.

        Never waits for another claimer and never hands one session to two of them
        (PostgreSQL: one ``UPDATE`` over ``SELECT ... FOR UPDATE SKIP LOCKED``; stores of one
        machine: :meth:`find_claimable`, then a claim that does not wait).
        """
        ...

    async def list_sessions(self, agent: str) -> list[SessionKey]:
        """Every session of ``agent`` the store has, newest first: the most recently created
        session (by its first ``enqueue`` or ``claim``) comes first. A reset keeps a
        session's place. For hosts that list an agent's conversations."""
        ...
