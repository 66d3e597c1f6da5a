"""A SQL store written once: the write path, the reads and the feed over a :class:`Dialect`.

:class:`SqlStore` decides *what* is read and written (every statement is a
:class:`~durable_turns.stores.sql.statements.Statements` rule) and *when* a transaction
begins and ends; the dialect decides *where* a job runs (the event loop, a thread, a pooled
connection), how its leases work and how the store hears of other processes' commits.

The write path, once for every dialect:

- **accept** (:meth:`SqlStore.enqueue`): a transaction that applies the chain's rules; where
  statements are serialised (``Syntax.serialised``), the common accept (a plain turn of a
  known session) is one statement first;
- **a step's commit** (:class:`SqlTransaction`): the fencing check, one log row and the
  chain's updates, in one transaction; where statements are serialised, the common step (a
  log row and nothing else) is one fenced statement;
- **local tools** (:meth:`SqlTransaction.run_local`): the first tool of a step begins the
  transaction (a rollback then undoes exactly its writes: the store's own rows are written
  at commit), every later one runs in a savepoint; a tool that ends the transaction through
  the raw handle fails the turn;
- **cancel, turn data, settled deliveries**: one transaction (or statement) each, no lease.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ...errors import FatalToolError, LeaseLostError, StoreError
from ...events import TurnEvent
from ...history import ForkPlan
from ...records import (
    NewEntry,
    SessionKey,
    TurnRecord,
)
from .. import StoreCapabilities, Watcher
from ..feed import Feed, Subscription
from ..kit import BufferedTransaction, LeaseCounters
from ..live import LiveRelay, LiveWire
from ..signals import Signals
from .cancels import Cancels
from .reads import SqlReads
from .schema import Syntax
from .statements import Statements
from .timeline import fork as write_fork

__all__ = ["Dialect", "Grant", "Leases", "SqlLease", "SqlStore", "SqlTransaction", "StepLink"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Grant:
    """What a claim got: the session's id and a lease's counters, and the dialect's own
    token of the hold (an OS lock's file, a heartbeat), given back at release."""

    sid: int
    epoch: int
    generation: int
    last_seq: int
    message_count: int
    hold: Any = None


class StepLink(Protocol):
    """The connection of one step's transaction, from its first local tool (or its commit)
    to the end of its commit: what a dialect hands each :class:`SqlTransaction`.

    Jobs are plain functions of a connection; the link runs them where the dialect's
    connections live and translates the driver's failures into ``StoreError`` (what a job
    raises of its own, ``LeaseLostError`` for one, propagates as it is).
    """

    def connection(self) -> Any | None:
        """The step's connection while the link holds one (``Transaction.unwrap``)."""
        ...

    async def run_local(self, job: Callable[[Any], T]) -> T:
        """Run a local tool's job on the step's connection (taken now if needed), where user
        code may block; the driver's errors are the tool's own (not translated)."""
        ...

    async def commit(self, job: Callable[[Any], None], *, began: bool,
                     waiting: Callable[[Any], None] | None = None) -> None:
        """Run the commit's job, then give back what the link holds (whatever happened).
        ``began``: a local tool began the step's transaction (its connection holds the
        database's write lock). ``waiting``: where ``job`` would wait for another writer, run
        this instead, where waiting is fine."""
        ...

    async def rollback(self, job: Callable[[Any], None]) -> None:
        """Run the rollback's job on the step's connection, then give back what the link
        holds; the job's failure is not raised (the error that led here matters)."""
        ...

    async def end(self) -> None:
        """Give back what the link holds (a connection, the write lock): for a step that
        neither commits nor rolls back (it failed before anything began)."""
        ...


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
    """What a SQL backend brings: its connections and where jobs run on them, its SQL's
    differences (:attr:`syntax`), its leases, its wake-ups, and what it declares.

    A dialect never decides what is written: :class:`SqlStore` hands it jobs (functions of a
    connection) that do. Jobs given to :meth:`read` and :meth:`write` are short and never
    call user code; a local tool's job goes through :meth:`step`'s link.
    """

    @property
    def syntax(self) -> Syntax:
        """The dialect's SQL."""
        ...

    @property
    def capabilities(self) -> StoreCapabilities:
        """What the store can do (``TurnStore.capabilities``)."""
        ...

    @property
    def leases(self) -> Leases:
        """How a claim holds a session."""
        ...

    async def open(self, store: SqlStore) -> None:
        """Connect, and create or migrate the schema (``schema.migrate``, in one transaction
        under the dialect's migration lock); idempotent. Start the wake-ups if
        ``store.feed.active``.

        Raises:
            StoreError: the database cannot be used.
        """
        ...

    async def close(self) -> None:
        """Stop the wake-ups and the leases' upkeep, close the connections."""
        ...

    def unwrap(self) -> Any:
        """A raw connection for set-up and inspection outside any step."""
        ...

    async def read(self, job: Callable[[Any], T]) -> T:
        """Run a read; never waits for a writer.

        Raises:
            StoreError: the database failed.
        """
        ...

    async def write(self, job: Callable[[Any], T], *,
                    waiting: Callable[[Any], T] | None = None) -> T:
        """Run a write job (which begins and commits its own transaction, or is one statement
        in autocommit), serialised with this store's other writes where the dialect's
        connection is shared. ``waiting``: see :meth:`StepLink.commit`.

        Raises:
            StoreError: the database failed.
        """
        ...

    def step(self) -> StepLink:
        """A link for one step's transaction."""
        ...

    def in_transaction(self, c: Any) -> bool:
        """Whether ``c`` is inside a transaction (and usable)."""
        ...

    def lost(self, c: Any) -> bool:
        """Whether ``c`` broke (a killed backend): a transaction begun on it is gone."""
        ...

    def notify(self, c: Any, key: SessionKey, seq: int | None,
               live: Sequence[str] = ()) -> None:
        """Inside a write's transaction: tell other processes that ``key`` changed (``seq``:
        its newest event; ``None``: its chain), after ``live``: frames of the session's live
        events (``stores.live``) that must reach them first (given only where
        ``self.live.transactional``). A dialect whose wake-ups look for changes themselves
        (SQLite's ``data_version``) does nothing. Not called for the one-statement writes of
        a serialised dialect."""
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
        """Where a cancel goes while a running step holds the write lock (``stores.signals``);
        ``None`` where a cancel's write never waits behind a step."""
        ...


class SqlStore(SqlReads):
    """A session store on a SQL database: the ``SessionStore`` seam over a :class:`Dialect`.

    Args:
        dialect: the backend's.
    """

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.statements = Statements(dialect.syntax)
        """The dialect's statements."""
        self.feed = Feed(self._events_after, self._newest_seq, on_active=self._listen)
        """The store's event feed (its dialect's wake-ups tell it)."""
        wire = dialect.live
        self.relay = None if wire is None else LiveRelay(wire, self.feed.live)
        """What carries this store's live events to other processes (``None``: no other
        process shares the storage)."""
        self.cancels = Cancels(self)
        """Its cancels: written at once, never behind a running step (``sql.cancels``)."""

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

    async def close(self) -> None:
        """``TurnStore.close``."""
        await self.cancels.close()
        self.feed.close()
        if self.relay is not None:
            await self.relay.close()
        await self.dialect.close()

    def unwrap(self) -> Any:
        """``TurnStore.unwrap``: the dialect's raw connection."""
        return self.dialect.unwrap()

    # -- running jobs (for the store, its dialect and its leases) -------------------------

    async def read(self, job: Callable[[Any], T]) -> T:
        """Run a read job (``Dialect.read``)."""
        return await self.dialect.read(job)

    async def transact(self, job: Callable[[Any], T]) -> T:
        """Run ``job`` in a write transaction of its own."""
        return await self.dialect.write(lambda c: self.in_transaction(c, job))

    async def statement(self, job: Callable[[Any], T]) -> T:
        """Run ``job``, one writing statement, as its own transaction; where it would wait
        for another writer, inside a transaction where it may."""
        return await self.dialect.write(job, waiting=lambda c: self.in_transaction(c, job))

    def in_transaction(self, c: Any, job: Callable[[Any], T]) -> T:
        """``job(c)`` between the dialect's begin and ``COMMIT`` (rolled back if it raises)."""
        c.execute(self.dialect.syntax.begin)
        try:
            out = job(c)
            c.execute("COMMIT")
        except BaseException:
            if self.dialect.in_transaction(c):
                c.execute("ROLLBACK")
            raise
        return out

    # -- the write path --------------------------------------------------------------------

    async def claim(self, key: SessionKey, *, timeout: float | None = None) -> SqlLease:
        """``TurnStore.claim``."""
        return SqlLease(self, key, await self.dialect.leases.claim(self, key, timeout))

    async def claim_ready(self, agents: Collection[str], limit: int = 100) -> list[SqlLease]:
        """``TurnStore.claim_ready``."""
        return [SqlLease(self, key, grant)
                for key, grant in await self.dialect.leases.claim_ready(self, agents, limit)]

    async def enqueue(self, key: SessionKey, entry: NewEntry) -> tuple[TurnRecord, bool]:
        """``TurnStore.enqueue``."""
        st = self.statements
        if self.dialect.syntax.serialised and entry.kind == "turn" and entry.supersede is None:
            record = await self.statement(lambda c: st.enqueue_plain(c, key, entry))
            if record is not None:
                self.feed.changed(key)
                return record, True

        def accept(c: Any) -> tuple[TurnRecord, bool]:
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

    async def turns(self, key: SessionKey, *, turn_id: str | None = None,
                    unfinished: bool = False) -> list[TurnRecord]:
        """``TurnStore.turns``: a cancel not folded into the chain yet is the entry's."""
        return await self.cancels.merged(
            key, await super().turns(key, turn_id=turn_id, unfinished=unfinished))

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
    buffered until commit, local tools run on the step's connection (see the module's
    docstring)."""

    lease: SqlLease

    def __init__(self, lease: SqlLease) -> None:
        super().__init__(lease)
        self._store = lease.store
        self._dialect = lease.store.dialect
        self._link = self._dialect.step()
        self._begun = False
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
        return await self._link.run_local(lambda c: self._local(c, fn))

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
            if self._fast and not self._begun and Statements.one_row(self.writes):
                # One fenced statement, its own transaction; where it would wait for another
                # writer, the whole transaction instead.
                await link.commit(self._append, began=False, waiting=self._commit)
            else:
                await link.commit(self._commit, began=self._begun)
            self.committed()
            self._store.feed.published(self.lease.key, self.writes.events)
        elif self._begun:
            await link.rollback(self._rollback)
        else:
            await link.end()

    # -- jobs, run by the link on the step's connection -----------------------------------

    def _commit(self, c: Any) -> None:
        lease, w, d = self.lease, self.writes, self._dialect
        try:
            if not self._begun:
                c.execute(d.syntax.begin)
                self._begun = True
            elif d.lost(c):
                raise StoreError("the step's connection was lost mid-step; nothing of the "
                                 "step was committed")
            if not self._write(c):
                raise LeaseLostError(str(lease.key), lease.epoch)
            if w.events:
                d.notify(c, lease.key, w.events[-1].seq, self._live)
            c.execute("COMMIT")
        except BaseException:
            self._rollback(c)
            raise
        self._begun = False

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
        st.flush(c, lease.sid, lease.generation, self.first_index(), w, seq=lease.last_seq)
        return True

    def _rollback(self, c: Any) -> None:
        if self._dialect.in_transaction(c):
            c.execute("ROLLBACK")
        self._begun = False

    def _local(self, c: Any, fn: Callable[[Any], T]) -> T:
        d = self._dialect
        # Our own rows are buffered until commit, so when the tool is the first to write, a
        # rollback of the whole transaction undoes exactly the tool's writes: no savepoint.
        first = not self._begun
        if first:
            c.execute(d.syntax.begin)
            self._begun = True
        elif d.lost(c):
            self._begun = False
            raise StoreError("the step's connection was lost mid-step; nothing of the step "
                             "was committed")
        else:
            c.execute("SAVEPOINT local_tool")
        try:
            out = fn(c)
        except BaseException:
            if d.lost(c):
                pass  # the transaction is gone: the step's commit is refused (see _commit)
            elif not d.in_transaction(c):
                self._begun = False
            elif first:
                c.execute("ROLLBACK")
                self._begun = False
            else:
                c.execute("ROLLBACK TO local_tool")
                c.execute("RELEASE local_tool")
            raise
        if not d.in_transaction(c):
            # The tool committed or rolled back the step's own transaction through the raw
            # handle: its writes are no longer tied to the step, which we cannot repair.
            self._begun = False
            raise FatalToolError(
                "a local tool ended the store's transaction (COMMIT/ROLLBACK on the raw "
                "handle); write through ctx.store.unwrap() without managing transactions"
            )
        if not first:
            c.execute("RELEASE local_tool")
        return out
