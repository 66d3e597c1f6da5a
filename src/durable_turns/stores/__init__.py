"""The store seam (F1): what the engine needs to run a turn, what hosts read, and what a store
declares it can do. This module holds Protocols and plain records only; it imports no
implementation.

A store keeps, per session ``(agent, session_id)``: the session row (status, generation,
lease epoch), the chain (one entry per accepted turn or command, in the order they were
accepted), the message log, the step checkpoints and the event log.

The seam is two Protocols, and :class:`SessionStore` is both:

- :class:`TurnStore`, the **write path**: what the engine needs to run a turn. Accept a chain
  entry (:meth:`~TurnStore.enqueue`), claim a session (:meth:`~TurnStore.claim`,
  :meth:`~TurnStore.claim_ready`) and commit each step through the lease's
  :class:`Transaction` (which also ends or parks a turn and carries out a reset), ask for a
  cancel (:meth:`~TurnStore.request_cancel`), read back what a replay needs (the chain, the
  messages, the steps, the events) and follow a session (:meth:`~TurnStore.subscribe`,
  :meth:`~TurnStore.watch`).
- :class:`SessionQueries`, what **hosts** read: a session's row, sessions by what their turns
  wait for, an agent's sessions with what each is parked on (all of them, or those one
  principal may see), the deliveries a channel owes; and the lease-free writes hosts keep
  their own state with (a name of a turn's data, a settled delivery, a session's owner).

**Leases and fencing.** Writing session state needs a :class:`Lease`. A lease carries an
**epoch** (a fencing token): every claim of a session gets a higher one, and every commit
checks, inside its own transaction, that its lease's epoch is still the session's. A holder
that was taken over (its lease expired while it was paused, or it was released) gets
:class:`~durable_turns.errors.LeaseLostError` and nothing of its step is written. The writes
that need no lease are single atomic writes any process may make: accepting an entry, asking
for a cancel, setting a name of a turn's data, settling a delivery.

**The feed.** :meth:`TurnStore.subscribe` yields a session's stored events after a cursor,
then live ones, woken by the store itself, whichever process committed them; live events
that are never stored (text as a model streams it) reach it through
:meth:`TurnStore.publish_live`, from whichever process drives the turn.

**Capabilities.** A store declares what it can do in :attr:`TurnStore.capabilities`
(:class:`StoreCapabilities`), once, instead of being probed: whether it is durable, who may
share it, whether a local tool's writes commit with its step, whether leases expire. The
conformance suite (``durable_turns.testing``) runs the checks of what a store declares.

Backends: :class:`~durable_turns.stores.memory.MemoryStore`,
:class:`~durable_turns.stores.sqlite.SqliteStore`,
:class:`~durable_turns.stores.postgres.PostgresStore` (extra ``postgres``);
``durable_turns.stores.registry.store_for(spec)`` picks one from a URL or a path. What a new
backend builds on is public: ``durable_turns.stores.kit`` (the event feed, the buffered
transaction, the chain's rules, claim helpers) and ``durable_turns.stores.sql`` (a SQL store
written once over a ``Dialect``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from ..events import TurnEvent
from ..history import Checkpoint, ForkPlan
from ..messages import Message
from ..records import (
    ChainEntry,
    NewEntry,
    SessionInfo,
    SessionKey,
    SessionStatus,
    SessionSummary,
    StepId,
    StepRecord,
    StepResult,
    TurnResult,
    Visibility,
)
from ..schedules import ScheduleBook

T = TypeVar("T")

__all__ = [
    "ChainEntry",
    "Lease",
    "NewEntry",
    "SessionFilter",
    "SessionInfo",
    "SessionKey",
    "SessionQueries",
    "SessionStatus",
    "SessionStore",
    "SessionSummary",
    "StepRecord",
    "StoreCapabilities",
    "Subscription",
    "Timer",
    "TimerKind",
    "Transaction",
    "TurnStore",
    "Visibility",
    "Watcher",
]

SessionFilter = Literal["unfinished", "parked"]
"""What :meth:`SessionQueries.find_sessions` selects by (see there)."""

Watcher = Callable[[list[TurnEvent] | None], None]
"""Told of this process's committed events (a list), or that something may have changed
elsewhere (``None``)."""


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """What a store can do, declared once by the store (and checked by the conformance suite's
    optional tiers: a store passes the checks of everything it declares)."""

    durable: bool
    """Commits outlive the store object and its process: a store opened afterwards on the
    same storage reads them."""
    shared_by: Literal["process", "processes", "machines"]
    """Who may use one storage at once: this process only, the processes of one machine (one
    file), or processes on many machines (a database server)."""
    exactly_once_local: bool
    """A local tool (a plain ``def``) writes through :meth:`Transaction.unwrap`, the raw
    handle, inside its step's transaction: its writes commit with the step and roll back when
    the tool raises or the step does not commit."""
    local_off_loop: bool = False
    """A local tool runs off the event loop (on a thread), so the process goes on while one
    runs and its step holds the write lock: a cancel sent meanwhile returns at once and is
    seen at the step's end (F7). Where local tools run on the loop (one isolate, as a
    Durable Object), nothing can be asked while one runs."""
    lease_ttl: float | None = None
    """Seconds after which a lease whose holder stopped renewing it (paused, cut off) may be
    taken over; ``None``: a lease ends only when released or when its holder's process ends."""
    paramstyle: str | None = None
    """The placeholders of the raw handle's SQL, as DB-API names them (``qmark``: ``?``,
    ``format``: ``%s``), so a local tool may write SQL that runs on whichever store it is
    given; ``None``: no SQL handle. The handle is a DB-API connection (``execute(sql,
    params)``) or, on a Durable Object, ``exec(sql, *bindings)``."""


class Subscription(Protocol):
    """A session's events after a cursor, then live ones: ``async for event in sub``.

    Use as ``async with store.subscribe(key, after_seq) as sub`` (or call :meth:`close`).
    Iteration ends when the subscription (or its store) is closed. Events come in ``seq``
    order, each once; live text (``message.delta``, :meth:`TurnStore.publish_live`) is slotted
    in after the durable event whose ``seq`` it carries.
    """

    key: SessionKey
    cursor: int | None
    """The seq of the last durable event handed over (or to start after)."""
    live: bool
    """Whether it takes live events (see :meth:`TurnStore.publish_live`)."""

    async def ready(self) -> None:
        """Wait until the cursor is fixed (``after_seq=None``: at the newest event then) and
        the backlog is queued. Events committed after ``ready()`` returns are delivered.

        Raises:
            StoreError: the store could not be read (the subscription is closed then).
        """
        ...

    def deliver_to(self, callback: Callable[[TurnEvent], None]) -> None:
        """Hand events to ``callback`` as they come (live ones synchronously, as the store
        publishes them) instead of queueing them for iteration. A callback that raises is
        logged; the subscription goes on."""
        ...

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the subscription closes."""
        ...

    def on_outage(self, fn: Callable[[BaseException | None], None]) -> None:
        """Call ``fn(error)`` when the store cannot be read for it (it stays open and resumes
        from its cursor, with no gap, once the store answers again) and ``fn(None)`` then."""
        ...

    def close(self) -> None:
        """End the subscription (its iteration ends)."""
        ...

    async def aclose(self) -> None:
        """:meth:`close`, awaitable."""
        ...

    def __aiter__(self) -> AsyncIterator[TurnEvent]: ...

    async def __anext__(self) -> TurnEvent: ...

    async def __aenter__(self) -> Subscription: ...

    async def __aexit__(self, *exc: object) -> None: ...


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
        """The backend's raw handle inside this transaction (``sqlite3.Connection``, a psycopg
        connection, a Durable Object's ``ctx.storage.sql``), what a local tool writes through.

        Raises:
            StoreError: the store hands it out only inside :meth:`run_local`.
        """
        ...

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(raw_handle)`` inside the transaction (on the store's own thread where it
        has one). If ``fn`` raises, its writes are rolled back and the exception propagates;
        the transaction itself stays usable. A store whose capabilities say
        ``exactly_once_local`` commits ``fn``'s writes with the step, else they are ``fn``'s
        own business.

        Raises:
            FatalToolError: ``fn`` ended the store's transaction through the raw handle.
        """
        ...

    def add_message(self, message: Message) -> int:
        """Append to the message log; returns the message's index."""
        ...

    def add_step(self, step: StepId, turn_id: str, result: StepResult) -> None:
        """Checkpoint a step of turn ``turn_id`` under the live generation, with what it
        keeps (stored as its ``to_json()`` writes it)."""
        ...

    def add_event(self, event: TurnEvent) -> TurnEvent:
        """Log an event; returns it with its sequence number (published after commit)."""
        ...

    def set_turn(self, result: TurnResult) -> None:
        """Set a chain entry's status and outcome, all of it (``text``, ``error``, ``reason``,
        ``request`` as in ``result``): how a step ends or parks a turn. A status other than
        ``suspended`` clears the pending request. Never touches the entry's ``data``."""
        ...

    def set_turn_data(self, turn_id: str, name: str, value: Any) -> None:
        """Set ``data[name] = value`` on a chain entry with this commit, leaving its other
        names as they are (what another owner set meanwhile, even without a lease, stays)."""
        ...

    def set_status(self, status: SessionStatus) -> None:
        """Set the session's status with this commit."""
        ...

    def new_generation(self) -> None:
        """Archive the live log under the current generation and start an empty one (F8).

        The session's status becomes ``new``. A park left standing is the caller's to end
        in the same commit (``set_turn``: a reset cancels it).
        """
        ...


class Lease(Protocol):
    """The right to write one session's state; held by one holder at a time, everywhere.

    Released by :meth:`release`, and by the backend when the holder's process dies (an OS file
    lock for SQLite) or stops renewing it (``capabilities.lease_ttl``), so a crashed worker
    never blocks a replay.
    """

    key: SessionKey
    epoch: int
    """The fencing token: higher than every earlier claim's of this session."""
    generation: int
    last_seq: int
    """The highest event sequence number committed so far."""
    message_count: int
    """How many messages the live log has."""

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """One step's transaction (see :class:`Transaction`)."""
        ...

    async def cancel_requested(self, turn_id: str) -> str | None:
        """The reason of a durable cancellation request for the turn, if one was made."""
        ...

    async def release(self) -> None:
        """Give the lease up (idempotent); the next claim gets a higher epoch."""
        ...


class TurnStore(Protocol):
    """The write path: what the engine needs to run a turn, and nothing a host alone needs.

    Contract: every write is atomic (all of it or nothing); a read never waits for a writer
    and sees the last committed state; a step commits through a :class:`Lease`'s
    transaction, fenced by its epoch; nothing here blocks the event loop. Every backend
    passes the required tier of ``durable_turns.testing``'s suite, and the optional tiers of
    what its :attr:`capabilities` declare.
    """

    @property
    def capabilities(self) -> StoreCapabilities:
        """What this store can do (see :class:`StoreCapabilities`); the same before and after
        :meth:`open`."""
        ...

    async def open(self) -> None:
        """Open (and create or migrate) the store. Idempotent; safe when many processes
        open one new store at the same moment.

        Raises:
            StoreError: the storage cannot be used (unreachable, not ours, of a newer schema).
        """
        ...

    async def close(self) -> None:
        """Close the store: subscriptions end, unreleased leases are left to expire or end
        with the process."""
        ...

    def unwrap(self) -> Any:
        """The backend's raw handle outside any step (for set-up and inspection), or ``None``
        when it has none."""
        ...

    async def claim(self, key: SessionKey, *, timeout: float | None = None) -> Lease:
        """Take the session's lease with a new epoch, waiting up to ``timeout`` seconds
        (``None``: forever). Creates the session if needed.

        Raises:
            LeaseTimeoutError: another holder kept it past the timeout.
        """
        ...

    async def claim_ready(self, agents: Collection[str], limit: int = 100) -> Sequence[Lease]:
        """Claim, without waiting, up to ``limit`` sessions of these agents that have work for
        a driver (a queued or running turn, or a parked one with a cancel) and whose lease
        nobody holds (free, or expired where leases expire, whoever held it): what a worker
        looking for work drives. Each lease has a new epoch. Never waits for another claimer
        and never hands one session to two of them."""
        ...

    async def enqueue(self, key: SessionKey, entry: NewEntry) -> tuple[ChainEntry, bool]:
        """Accept a chain entry (a turn or a command) at the end of the chain, durably;
        creates the session if needed.

        In the same transaction, with ``entry.supersede`` set, every queued or running turn
        gets a cancellation request with that reason (``replace=True``, or a command's own);
        a parked turn never does. While a turn is parked, the entry's rule applies
        (``NewEntry.parked_rule``, ``records.WhileParked``, kept with the entry): a
        ``refused`` one (a turn) is refused unless an entry that ``clears`` (a reset) is
        queued; others are accepted.
        ``entry.deliver`` names the channel that owes the turn a delivery
        (:meth:`SessionQueries.owed_deliveries`). An ``entry.at_once`` command (a steer) never
        waits behind a running step: where a step holds the write lock it is kept durably
        beside the chain and appended once the lock is free, and ``entries`` shows it queued.

        Returns:
            The entry and whether it was new. An id the session already has is returned as
            it is (a redelivery).

        Raises:
            SessionBusyError: the entry is ``refused`` while parked, a turn of the session
                is parked (its request not withdrawn) and no entry that ``clears`` is queued.
        """
        ...

    async def request_cancel(self, key: SessionKey, turn_id: str | None, reason: str) -> list[str]:
        """Durably ask unfinished turns (one, or all with ``None``) to cancel, parked ones
        included (their request is withdrawn: a parked turn with a cancel is no longer
        answerable, and is work for a driver, which ends it); returns their ids (each turn is
        asked once)."""
        ...

    async def entries(self, key: SessionKey, *, turn_id: str | None = None,
                      unfinished: bool = False) -> list[ChainEntry]:
        """The session's chain in order: every entry, only one (``turn_id``), or only the
        queued, running and suspended ones (``unfinished``)."""
        ...

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

    def subscribe(self, key: SessionKey, after_seq: int | None = None, *,
                  live: bool = True) -> Subscription:
        """The session's events after ``after_seq`` (stored ones first), then live ones, with
        no gap and no duplicate; ``None`` starts at the newest event. With ``live``, the live
        events :meth:`publish_live` hands over (from any process) are slotted in after the
        durable event whose ``seq`` they carry. Never raises for an unknown session: it
        yields what that session gets."""
        ...

    def publish_live(self, event: TurnEvent) -> None:
        """Hand a live event (never stored: ``message.delta``, ``message.thinking``,
        ``message.retry``, ``action.retry``) to the session's subscribers that take live
        events: this process's at once, and, where other processes share the storage
        (``capabilities.shared_by``), theirs, coalesced and bounded (the kit's
        ``LiveRelay``). Best effort: one lost or late never corrupts a stream (a subscriber
        drops it once the next durable event was handed over; ``message.completed`` carries
        the whole text). Never blocks, never raises."""
        ...

    def wants_live(self, key: SessionKey) -> bool:
        """Whether a live event of the session may reach anyone now: a subscriber in this
        process, or other processes that may subscribe. Cheap (asked for every piece of
        text a model streams): a turn makes no live text when this says no."""
        ...

    def watch(self, key: SessionKey | None, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher(events)`` when this process commits events of the session, and
        ``watcher(None)`` when anything of it may have changed (a new entry, a cancel, another
        process's commit). ``key=None`` watches every session, with ``None`` only (a worker
        waking for new work). Spurious calls are allowed. Returns the function that stops
        watching."""
        ...

    # -- wake-ups (F24) --------------------------------------------------------------------

    async def arm_timer(self, timer: Timer) -> None:
        """Keep ``timer`` (a new one, or one of that id moved to its new ``due``, unclaimed):
        a lease-free single write. A commit that parks a turn on a request with a deadline,
        a reminder or a sleep arms its timers itself, in the park's transaction."""
        ...

    async def next_timer(self, agents: Collection[str], *,
                         key: SessionKey | None = None) -> datetime | None:
        """The earliest time one of these agents' timers (of session ``key`` only, if
        given) is due, or its claim ends if it is claimed (``None``: no timer)."""
        ...

    async def claim_timers(self, agents: Collection[str], now: datetime, *, limit: int = 100,
                           hold: float = 30.0) -> list[Timer]:
        """Claim up to ``limit`` of these agents' timers due at ``now``, earliest first, for
        ``hold`` seconds: no other claim gets them until then (PostgreSQL: ``FOR UPDATE
        SKIP LOCKED``, so workers claiming at once never wait on each other nor get the same
        timer; SQLite and memory: in the store's write transaction). A claim that is not
        dropped (:meth:`drop_timer`) before its hold ends is claimed again: a timer fires at
        least once, and its fire must be idempotent (a chain entry of its own id)."""
        ...

    async def drop_timer(self, timer: Timer) -> None:
        """Forget a fired timer, unless it was armed again since (its ``due`` changed)."""
        ...


@dataclass(frozen=True, slots=True)
class Timer:
    """A wake-up a store keeps (F24): at ``due``, the request ``input_id`` of turn
    ``turn_id`` gets its clock's answer (``kind="wake"``: a sleep's end, a deadline's
    default) or a reminder (``kind="remind"``)."""

    key: SessionKey
    id: str
    """Unique within the session: ``<kind>:<turn_id>:<input_id>``."""
    due: datetime
    """Aware, UTC; kept to the millisecond."""
    kind: TimerKind
    turn_id: str
    input_id: str


TimerKind = Literal["wake", "remind"]
"""What a :class:`Timer` does when due."""


class SessionQueries(Protocol):
    """What hosts read (the HTTP host, the CLI, channels), and the lease-free writes they
    keep their own state with. Each query is one statement on a SQL store, whatever the number
    of sessions it answers for."""

    @property
    def schedules(self) -> ScheduleBook:
        """Its schedules (F24): what ``Runtime.schedule`` stores and its clock fires."""
        ...

    async def session_info(self, key: SessionKey) -> SessionInfo | None:
        """The session's status and generation, or ``None`` for a session never seen."""
        ...

    async def find_sessions(self, which: SessionFilter | None = None, *,
                            turn_id: str | None = None) -> list[SessionKey]:
        """Sessions, in key order, with work for a driver (``unfinished``: a queued or running
        turn, or a parked one with a cancel to carry out: what recovery drives), with a parked
        turn whose request stands (``parked``), or with a turn (not a command) of this id.

        Raises:
            ValueError: an unknown filter.
        """
        ...

    async def list_sessions(self, agent: str) -> list[SessionKey]:
        """Every session of ``agent``, newest first: the most recently created session (by
        its first ``enqueue`` or ``claim``) comes first; a reset keeps a session's place."""
        ...

    async def session_summaries(self, agent: str, *, parked_only: bool = False,
                                visible: Visibility | None = None) -> list[SessionSummary]:
        """Every session of ``agent`` as :meth:`list_sessions` orders them, each with its
        status, generation, owner and the request it is parked on (a suspended turn with no
        cancel, as ``ChainEntry.parked``); with ``parked_only``, only the parked ones (an
        operator's inbox); with ``visible``, only those it shows (owned by ``visible.owner``,
        or parked on a request whose answerers are ``{"user": visible.answerer}`` or
        ``{"policy": p, …}`` with ``p`` in ``visible.policies``, in the request itself or in
        its ``more``), selected in the query itself."""
        ...

    async def own_session(self, key: SessionKey, owner: str) -> str | None:
        """Make ``owner`` the owner of the session if the store does not have it yet (its
        row is created, empty), atomically: of two principals that ask at once, one owns it.

        Returns:
            The session's owner after the call: ``owner``, the one that had it, or ``None``
            for a session that exists without one. An owner is never changed.
        """
        ...

    async def owed_deliveries(self, channel: str) -> list[tuple[SessionKey, ChainEntry]]:
        """The chain entries accepted with ``deliver=channel`` whose delivery is not settled,
        whatever their status (a channel follows running ones and delivers ended ones), in
        the order they were accepted (each session's in chain order): a channel's durable
        outbox."""
        ...

    async def checkpoints(self, key: SessionKey, *,
                          generation: int | None = None) -> list[Checkpoint]:
        """Every commit of the session (of one generation, if given) in the order it was
        made, across generations: each with its steps, its events, its generation, its place
        in the log and the transcript's length after it. ``[]`` for an unknown session."""
        ...

    async def fork(self, plans: Sequence[ForkPlan]) -> None:
        """Write new sessions, each a copy of its source's log up to a checkpoint of
        generation ``plan.generation`` (as generation 0, the references to renamed children
        rewritten), with the chain and status the plan gives: all of them in one transaction,
        or none. The sources are not touched. Needs no lease (a source may be running: what
        it commits after the checkpoint is not copied).

        Raises:
            SessionExistsError: a plan's new session has a chain or a log already (nothing
                of any plan was written).
        """
        ...

    async def settle_delivery(self, key: SessionKey, turn_id: str) -> bool:
        """Mark the delivery an entry is owed as settled: it is never returned by
        :meth:`owed_deliveries` again, and its record's ``deliver`` reads ``None``. Needs no
        lease.

        Returns:
            Whether this call settled it (``False``: settled before, never owed, or no such
            entry).
        """
        ...

    async def set_turn_data(self, key: SessionKey, turn_id: str, name: str, value: Any, *,
                            only_new: bool = False) -> Any:
        """Set ``data[name] = value`` on a chain entry, durably, leaving its other names as
        they are; with ``only_new``, only if ``name`` is not set yet (a compare-and-set).

        Needs no lease (one atomic write, like :meth:`TurnStore.request_cancel`): a channel
        keeps its delivery state with the turn this way while the turn runs. Never touches
        the entry's status or outcome, and the engine's writes never drop a name set here.

        Returns:
            The value stored under ``name`` after the call (the earlier one when ``only_new``
            found it set), or ``None`` when the session has no such entry.
        """
        ...


class SessionStore(TurnStore, SessionQueries, Protocol):
    """Durable session state: the write path and the queries. Every backend is one."""
