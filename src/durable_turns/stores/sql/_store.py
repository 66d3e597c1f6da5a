"""A SQL store written once: the write path, the reads and the feed over a :class:`Dialect`.

:class:`SqlStore` decides *what* is read and written (every statement is a
:class:`~durable_turns.stores.sql._statements.Statements` rule) and *which* writes form one
transaction; the dialect decides *where* a job runs (the event loop, a thread, a pooled
connection), *how* a transaction begins, nests and ends (``Dialect.atomic`` and the step's
:class:`StepLink`: its SQL, or calls of its handle; the kit writes no transaction control),
how its leases work and how the store hears of other processes' commits.

The write path, once for every dialect:

- **accept** (:meth:`SqlStore.enqueue`): a transaction that applies the chain's rules; the
  common accept (a plain turn of a known session) one statement where they are serialised;
- **a step's commit** (:class:`SqlTransaction`): the fencing check, one log row and the
  chain's updates, in one transaction; where statements are serialised, the common step (a
  log row and nothing else) is one fenced statement;
- **local tools** (:meth:`SqlTransaction.run_local`): the step's link runs each in the step's
  transaction, which the first begins and the commit ends; a tool that raises has its writes
  undone, one that ends it through the raw handle fails the turn (:func:`tool_ended_transaction`);
- **cancel, turn data, settled deliveries, timers**: a transaction (or statement) each.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from ...errors import LeaseLostError, StoreError
from ...events import TurnEvent
from ...history import Checkpoint, ForkPlan
from ...messages import Message
from ...records import (
    ChainEntry,
    NewEntry,
    SessionInfo,
    SessionKey,
    SessionSummary,
    StepRecord,
    Visibility,
)
from .. import StoreCapabilities, Timer, Watcher
from .._feed import Feed, Subscription
from .._signals import Signals
from ..kit import BufferedTransaction, LeaseCounters
from ..live import LiveRelay, LiveWire
from ._accepts import Accepts
from ._cancels import Cancels
from ._dialect import Grant, StepLink, tool_ended_transaction
from ._history import fork as write_fork
from ._reads import SqlReads
from ._schedules import KeepsSchedules
from ._statements import Statements
from .schema import Syntax

__all__ = ["Dialect", "Grant", "Leases", "SqlLease", "SqlStore", "SqlTransaction", "StepLink",
           "tool_ended_transaction"]

T = TypeVar("T")


class Leases(Protocol):
    """A dialect's leases: how a claim holds a session and how it ends. Every claim must
    raise the session's epoch (``Statements.claim`` or ``bump``), in the same transaction as
    whatever marks the session held in the database, if anything does."""

    async def claim(self, store: SqlStore, key: SessionKey, timeout: float | None) -> Grant:
        """``TurnStore.claim``.

        Raises:
            LeaseTimeoutError: held elsewhere past ``timeout``.
        """
        ...

    async def claim_ready(self, store: SqlStore, agents: Collection[str],
                          limit: int) -> list[tuple[SessionKey, Grant]]:
        """``TurnStore.claim_ready``: the sessions claimed, each with its grant."""
        ...

    async def release(self, store: SqlStore, lease: SqlLease) -> None:
        """Give ``lease`` up (called once per lease)."""
        ...


class Dialect(Protocol):
    """What a SQL backend writes: its connections and where jobs run on them, its SQL's
    differences (:attr:`syntax`), its transactions, its leases, its wake-ups, and what it
    declares. Everything else of ``SessionStore`` is :class:`SqlStore`'s.

    A dialect never decides what is written: :class:`SqlStore` hands it jobs (functions of a
    :class:`~durable_turns.stores.sql.Connection`) that do. Jobs given to :meth:`read` and
    :meth:`write` are short and never call user code; a local tool runs through
    :meth:`step`'s link. A dialect that has nothing to tell other processes (one process
    uses its storage) has ``live = None`` and a :meth:`notify` and :meth:`listen` that do
    nothing.
    """

    @property
    def syntax(self) -> Syntax:
        """The dialect's SQL (placeholders, row locks or serialised statements, types, where
        the schema's version is kept)."""
        ...

    @property
    def capabilities(self) -> StoreCapabilities:
        """What the store can do (``TurnStore.capabilities``)."""
        ...

    @property
    def leases(self) -> Leases:
        """How a claim holds a session (:class:`~durable_turns.stores.sql.LocalLeases` over
        locks that end with their holder, or leases of the dialect's own)."""
        ...

    async def open(self, store: SqlStore) -> None:
        """Connect, and create or migrate the schema (:func:`~durable_turns.stores.sql.upgrade`
        inside :meth:`atomic`, under the dialect's migration lock where many processes may open
        one database); idempotent. Start the wake-ups if ``store.feed.active``.

        Raises:
            StoreError: the database cannot be used.
        """
        ...

    async def close(self) -> None:
        """Stop the wake-ups and the leases' upkeep, close the connections."""
        ...

    async def read(self, job: Callable[[Any], T]) -> T:
        """Run a read job on a connection; never waits for a writer.

        Raises:
            StoreError: the database failed.
        """
        ...

    async def write(self, job: Callable[[Any], T], *,
                    waiting: Callable[[Any], T] | None = None) -> T:
        """Run a write job on a write connection, serialised with this store's other writes
        where the connection is shared (a step's open transaction included). The kit hands
        a job wrapped in :meth:`atomic`, or one statement atomic on its own. ``waiting``:
        where ``job`` would wait for another writer, run this instead, where waiting is
        fine.

        Raises:
            StoreError: the database failed.
        """
        ...

    def atomic(self, c: Any, job: Callable[[Any], T]) -> T:
        """Run ``job(c)`` in one transaction of ``c``: a new one that commits when ``job``
        returns, or, inside one already open, a nested part of it (a savepoint). If ``job``
        raises, what it wrote is undone and the error propagates. The dialect's own calls or
        SQL (``BEGIN IMMEDIATE`` … ``COMMIT``, ``SAVEPOINT``; ``transactionSync``): the kit
        never writes transaction control itself."""
        ...

    def step(self) -> StepLink:
        """A link for one step's transaction (see :class:`StepLink`).

        Raises:
            StoreError: the store is not open.
        """
        ...

    def notify(self, c: Any, key: SessionKey, seq: int | None,
               live: Sequence[str] = ()) -> None:
        """Inside a write's transaction: tell other processes that ``key`` changed (``seq``:
        its newest event; ``None``: its chain), after ``live``: frames of the session's live
        events (``stores.live``) that must reach them first (given only where
        ``self.live.transactional``). A dialect whose wake-ups look for changes themselves
        (SQLite's ``data_version``), or that no other process shares, does nothing. Not
        called for the one-statement writes of a serialised dialect."""
        ...

    def listen(self, feed: Feed) -> None:
        """The feed got its first listener: tell it of other processes' commits
        (``feed.changed``, ``feed.changed_any``) while ``feed.active``; and hand the frames
        of live events other processes send to :attr:`live`'s receiver meanwhile."""
        ...

    @property
    def live(self) -> LiveWire | None:
        """What carries live events (``TurnStore.publish_live``) to the other processes that
        share the storage; ``None`` where only this process uses it."""
        ...

    @property
    def signals(self) -> Signals | None:
        """Where a cancel goes while a running step holds the write lock (``stores._signals``);
        ``None`` where a cancel's write never waits behind a step."""
        ...


class SqlStore(KeepsSchedules):
    """A session store on a SQL database: the ``SessionStore`` seam over a :class:`Dialect`.

    Args:
        dialect: the backend's.
    """

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.statements = Statements(dialect.syntax)
        """The dialect's statements."""
        self.reads = SqlReads(self.statements, self.read)
        """Its reads: the seam's read methods below answer with them."""
        self.feed = Feed(self._events_after, self._newest_seq, on_active=self._listen)
        """The store's event feed (its dialect's wake-ups tell it)."""
        wire = dialect.live
        self.relay = None if wire is None else LiveRelay(wire, self.feed.live)
        """What carries its live events to other processes (``None``: none shares the storage)."""
        self.cancels = Cancels(self)
        """Its cancels: written at once, never behind a running step (``sql._cancels``)."""
        self.accepts = Accepts(self)
        """Its at-once accepts (a steer's): never behind a running step (``sql._accepts``)."""

    def _listen(self) -> None:
        self.dialect.listen(self.feed)

    @property
    def capabilities(self) -> StoreCapabilities:
        """What the dialect declares."""
        return self.dialect.capabilities

    async def open(self) -> None:
        """``TurnStore.open``."""
        await self.dialect.open(self)
        await self.cancels.open()
        await self.accepts.open()

    async def close(self) -> None:
        """``TurnStore.close``."""
        await self.cancels.close()
        await self.accepts.close()
        self.feed.close()
        if self.relay is not None:
            await self.relay.close()
        await self.dialect.close()

    def unwrap(self) -> Any:
        """``TurnStore.unwrap``: ``None`` here; a store whose dialect has a raw handle for
        set-up and inspection returns it."""
        return None

    # -- running jobs (for the store, its dialect and its leases) -------------------------

    async def read(self, job: Callable[[Any], T]) -> T:
        """Run a read job (``Dialect.read``)."""
        return await self.dialect.read(job)

    async def transact(self, job: Callable[[Any], T]) -> T:
        """Run ``job`` in a write transaction of its own (``Dialect.atomic``)."""
        atomic = self.dialect.atomic
        return await self.dialect.write(lambda c: atomic(c, job))

    async def statement(self, job: Callable[[Any], T]) -> T:
        """Run ``job``, one writing statement, as its own transaction; where it would wait
        for another writer, inside a transaction where it may."""
        atomic = self.dialect.atomic
        return await self.dialect.write(job, waiting=lambda c: atomic(c, job))

    # -- the write path --------------------------------------------------------------------

    async def claim(self, key: SessionKey, *, timeout: float | None = None) -> SqlLease:
        """``TurnStore.claim``."""
        return SqlLease(self, key, await self.dialect.leases.claim(self, key, timeout))

    async def claim_ready(self, agents: Collection[str], limit: int = 100) -> list[SqlLease]:
        """``TurnStore.claim_ready``."""
        return [SqlLease(self, key, grant)
                for key, grant in await self.dialect.leases.claim_ready(self, agents, limit)]

    async def enqueue(self, key: SessionKey, entry: NewEntry) -> tuple[ChainEntry, bool]:
        """``TurnStore.enqueue``; an ``at_once`` command never waits behind a step."""
        st = self.statements
        if (at_once := await self.accepts.enqueue(key, entry)) is not None:
            return at_once
        if self.dialect.syntax.serialised and entry.kind == "turn" and entry.supersede is None:
            record = await self.statement(lambda c: st.enqueue_plain(c, key, entry))
            if record is not None:
                self.feed.changed(key)
                return record, True

        def accept(c: Any) -> tuple[ChainEntry, bool]:
            out = st.enqueue(c, key, entry)
            if out[1]:
                self.dialect.notify(c, key, None)
            return out

        out = await self.transact(accept)
        if out[1]:
            self.feed.changed(key)
        return out

    async def request_cancel(self, key: SessionKey, turn_id: str | None,
                             reason: str) -> list[str]:
        """``TurnStore.request_cancel``: at once, never behind a running step."""
        return await self.cancels.request(key, turn_id, reason)

    async def entries(self, key: SessionKey, *, turn_id: str | None = None,
                      unfinished: bool = False) -> list[ChainEntry]:
        """``TurnStore.entries``: a cancel or an accept not folded into the chain yet shows."""
        def read() -> Any:
            return self.reads.entries(key, turn_id=turn_id, unfinished=unfinished)
        found = await self.accepts.merged(key, await read(), read, turn_id=turn_id,
                                          unfinished=unfinished)
        return await self.cancels.merged(key, found)

    async def session_info(self, key: SessionKey) -> SessionInfo | None:
        """``SessionQueries.session_info``."""
        return await self.reads.session_info(key)

    async def read_messages(self, key: SessionKey, *, after: int = 0,
                            generation: int | None = None) -> list[Message]:
        """``TurnStore.read_messages``."""
        return await self.reads.read_messages(key, after=after, generation=generation)

    async def read_steps(self, key: SessionKey, *, generation: int | None = None,
                         step_id: str | None = None) -> dict[str, StepRecord]:
        """``TurnStore.read_steps``."""
        return await self.reads.read_steps(key, generation=generation, step_id=step_id)

    async def read_events(self, key: SessionKey, *, after_seq: int = 0,
                          turn_id: str | None = None) -> list[TurnEvent]:
        """``TurnStore.read_events``."""
        return await self.reads.read_events(key, after_seq=after_seq, turn_id=turn_id)

    async def find_sessions(self, which: str | None = None, *,
                            turn_id: str | None = None) -> list[SessionKey]:
        """``SessionQueries.find_sessions``."""
        return await self.reads.find_sessions(which, turn_id=turn_id)

    async def list_sessions(self, agent: str) -> list[SessionKey]:
        """``SessionQueries.list_sessions``."""
        return await self.reads.list_sessions(agent)

    async def session_summaries(self, agent: str, *, parked_only: bool = False,
                                visible: Visibility | None = None) -> list[SessionSummary]:
        """``SessionQueries.session_summaries``."""
        return await self.reads.session_summaries(agent, parked_only=parked_only,
                                                  visible=visible)

    async def owed_deliveries(self, channel: str) -> list[tuple[SessionKey, ChainEntry]]:
        """``SessionQueries.owed_deliveries``."""
        return await self.reads.owed_deliveries(channel)

    async def checkpoints(self, key: SessionKey, *,
                          generation: int | None = None) -> list[Checkpoint]:
        """``SessionQueries.checkpoints``."""
        return await self.reads.checkpoints(key, generation=generation)

    async def set_turn_data(self, key: SessionKey, turn_id: str, name: str, value: Any, *,
                            only_new: bool = False) -> Any:
        """``SessionQueries.set_turn_data``."""
        return await self.transact(
            lambda c: self.statements.set_turn_data(c, key, turn_id, name, value, only_new))

    async def own_session(self, key: SessionKey, owner: str) -> str | None:
        """``SessionQueries.own_session``."""
        return await self.transact(lambda c: self.statements.own_session(c, key, owner))

    async def settle_delivery(self, key: SessionKey, turn_id: str) -> bool:
        """``SessionQueries.settle_delivery``."""
        return await self.statement(lambda c: self.statements.settle_delivery(c, key, turn_id))

    async def fork(self, plans: Sequence[ForkPlan]) -> None:
        """``SessionQueries.fork``."""
        st = self.statements

        def write(c: Any) -> None:
            for plan in plans:
                write_fork(st, c, plan)
            for plan in plans:
                self.dialect.notify(c, plan.dst, None)

        await self.transact(write)
        for plan in plans:
            self.feed.changed(plan.dst)

    # -- wake-ups (F24): ``TurnStore.arm_timer`` and the three after it, in ``sql._timers``
    async def arm_timer(self, timer: Timer) -> None:
        await self.statement(lambda c: self.statements.timers.arm(c, timer))

    async def next_timer(self, agents: Collection[str], *, key: SessionKey | None = None
                         ) -> datetime | None:
        return await self.read(lambda c: self.statements.timers.next_due(c, agents, key))

    async def claim_timers(self, agents: Collection[str], now: datetime, *, limit: int = 100,
                           hold: float = 30.0) -> list[Timer]:
        return await self.transact(lambda c: self.statements.timers.claim(c, agents, now,
                                                                          limit, hold))

    async def drop_timer(self, timer: Timer) -> None:
        await self.statement(lambda c: self.statements.timers.drop(c, timer))

    # -- the feed --------------------------------------------------------------------------

    def subscribe(self, key: SessionKey, after_seq: int | None = None, *,
                  live: bool = True) -> Subscription:
        """``TurnStore.subscribe``."""
        return self.feed.subscribe(key, after_seq, live=live)

    def publish_live(self, event: TurnEvent) -> None:
        """``TurnStore.publish_live``: this process's subscribers now, the others' through
        the relay."""
        self.feed.live(SessionKey(event.agent, event.session), event)
        if self.relay is not None:
            self.relay.put(event)

    def wants_live(self, key: SessionKey) -> bool:
        """``TurnStore.wants_live``."""
        return self.feed.takes_live(key) or (self.relay is not None and self.relay.wanted())

    def watch(self, key: SessionKey | None, watcher: Watcher) -> Callable[[], None]:
        """``TurnStore.watch``."""
        return self.feed.watch(key, watcher)

    async def _events_after(self, key: SessionKey, after_seq: int) -> list[TurnEvent]:
        # Through the public read, so a store that wraps it (a test's) is read the same way.
        return await self.read_events(key, after_seq=after_seq)

    async def _newest_seq(self, key: SessionKey) -> int:
        return await self.read(lambda c: self.statements.newest_seq(c, key))


class SqlLease(LeaseCounters):
    """A lease on a :class:`SqlStore`'s session (the ``Lease`` Protocol).

    Args:
        store: the store.
        key: the session.
        grant: what the claim got.
    """

    def __init__(self, store: SqlStore, key: SessionKey, grant: Grant) -> None:
        super().__init__(key, grant.epoch, grant.generation, grant.last_seq,
                         grant.message_count)
        self.store = store
        self.sid = grant.sid
        """The session's id in the database."""
        self.hold = grant.hold
        """The dialect's token of the hold."""
        self.released = False

    def transaction(self) -> SqlTransaction:
        """One step's transaction."""
        return SqlTransaction(self)

    async def cancel_requested(self, turn_id: str) -> str | None:
        """``Lease.cancel_requested``."""
        sid, st = self.sid, self.store.statements
        stored = await self.store.read(lambda c: st.cancel_of(c, sid, turn_id))
        return await self.store.cancels.reason(self.key, turn_id, stored)

    async def release(self) -> None:
        """``Lease.release`` (idempotent)."""
        if not self.released:
            self.released = True
            await self.store.dialect.leases.release(self.store, self)


class SqlTransaction(BufferedTransaction):
    """One step's transaction on a :class:`SqlStore` (the ``Transaction`` Protocol): writes
    buffered until commit, local tools run in the step's transaction by the dialect's
    :class:`StepLink` (see the module's docstring)."""

    lease: SqlLease

    def __init__(self, lease: SqlLease) -> None:
        super().__init__(lease)
        self._store = lease.store
        self._dialect = lease.store.dialect
        self._link = self._dialect.step()
        self._fast = self._dialect.syntax.serialised
        self._live: list[str] = []  # the session's live frames, sent ahead of this commit

    def unwrap(self) -> Any:
        """``Transaction.unwrap``.

        Raises:
            StoreError: the dialect holds no connection for the step now (outside a local
                tool, where the dialect takes one per tool).
        """
        c = self._link.connection()
        if c is None:
            raise StoreError("the step's connection is only available inside a local tool")
        return c

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        """``Transaction.run_local``."""
        return await self._link.run_local(fn)

    async def __aenter__(self) -> SqlTransaction:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        link = self._link
        if exc_type is None:
            relay = self._store.relay
            if relay is not None and not relay.idle and self.writes.events:
                # The text streamed before this step's events goes out first (stores.live).
                self._live = await relay.take(self.lease.key)
                if self._live and not relay.wire.transactional:
                    live, self._live = self._live, []
                    await relay.wire.send(live)
            if self._fast and Statements.one_row(self.writes):
                # One fenced statement, its own transaction, unless a local tool began one.
                await link.commit(self._commit, alone=self._append)
            else:
                await link.commit(self._commit)
            self.committed()
            self._store.feed.published(self.lease.key, self.writes.events)
        else:
            await link.end()

    # -- jobs, run by the link on the step's connection -----------------------------------

    def _commit(self, c: Any) -> None:
        """The step's writes, fenced, inside the transaction the link holds."""
        lease, w = self.lease, self.writes
        if not self._write(c):
            raise LeaseLostError(str(lease.key), lease.epoch)
        if w.events:
            self._dialect.notify(c, lease.key, w.events[-1].seq, self._live)

    def _append(self, c: Any) -> None:
        """A :meth:`Statements.one_row` step outside any transaction: one statement."""
        if not self._write(c):
            raise LeaseLostError(str(self.lease.key), self.lease.epoch)

    def _write(self, c: Any) -> bool:
        """The buffered writes if the lease's epoch is still the session's (else False)."""
        lease, w, st = self.lease, self.writes, self._store.statements
        if st.one_row(w):
            return st.append(c, lease.sid, lease.epoch, lease.generation, self.first_index(), w)
        if not st.holds(c, lease.sid, lease.epoch):
            return False
        st.flush(c, lease.sid, lease.generation, self.first_index(), w, seq=lease.last_seq,
                 key=lease.key)
        return True
