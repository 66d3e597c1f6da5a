"""``Runtime``: agents, a store and a model; it accepts, drives and reports turns (F2, F5).

Its public API is small, and everything above it (``AgentSession``, the channels, the HTTP
host) is built on it:

- :meth:`Runtime.accept` makes a chain entry durable (a turn, a reset, a resume) and tells
  the runtime's scheduler (``durable_turns.scheduling``), which has :meth:`Runtime.step`
  called for each step of the session's chain — here, in other processes, or by Temporal;
- :meth:`Runtime.wait` returns an entry's result once it ends or parks, whichever process
  drives it (woken by the store's event feed);
- :meth:`Runtime.subscribe` yields a session's events after a cursor, then live ones, with
  live text (``message.delta``) from whichever process drives the turn (the store carries
  it: ``TurnStore.publish_live``);
- :meth:`Runtime.interrupt` asks turns to cancel, durably, and stops a running one at once.

A crash loses nothing: an accepted entry is in the store before ``accept`` returns, and
``Runtime.recover()`` (or a redelivery of the turn id) wakes the scheduler again; the next
step replays from the transcript. Nothing per session stays in memory once its steps end
but a bounded cache of recent transcripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from ._queries import Queries
from .agent import Agent
from .clock import Clock, SystemClock
from .commands import COMMANDS, Registry, check_redelivery, supersede_at_once
from .context import Sessions
from .engine._driver import ChainState, SessionDriver, chain_state
from .engine._sessions import RuntimeSessions
from .engine._step_context import StepContext, TranscriptCache
from .errors import (
    ConfigurationError,
    DurableTurnsError,
    RetryStep,
    RuntimeNotOpenError,
    StoreError,
    UnknownAgentError,
    UnknownTurnError,
    runtime_failure,
)
from .events import EventSink, TurnEvent
from .model import Model
from .records import ChainEntry, NewEntry, SessionKey, TurnResult
from .schedule_fires import ScheduleFires
from .schedules import Schedule
from .scheduling import ClockLoop, InProcessScheduler, Scheduler, StoreWakeups
from .sessions import AgentSession
from .stores import Lease, SessionStore, Subscription

log = logging.getLogger("durable_turns")

TRANSCRIPT_CACHE = 64
"""How many recent sessions' transcripts a runtime keeps, so a step never re-reads history."""
PARKS_HEARD_AFTER = 0.1
"""Seconds after a change heard from another process that the clock loop looks for wake-ups
(the changes of that while are one look)."""


class Runtime:
    """Drives agents' turns on a store.

    Args:
        agents: the agents sessions may address, by name.
        store: where sessions live.
        model: the model for agents that carry none (a :class:`~durable_turns.Model`;
            resolve a provider string such as ``"anthropic:claude-…"`` with
            ``durable_turns.models.resolve.resolve_model`` first).
        sink: receives every event of every turn this runtime drives.
        lease_timeout: how long a driver waits for another process to release a session
            (``None``: as long as it takes).
        secret: signs answer grants (F6); random per runtime unless given, so a grant is
            only good on the runtime (or the runtimes sharing the secret) that issued it.
        scheduler: when and where the sessions' steps run
            (:class:`~durable_turns.scheduling.Scheduler`): in this process as work arrives
            (the default, :class:`~durable_turns.scheduling.InProcessScheduler`), nowhere
            here (:class:`~durable_turns.scheduling.NoDriveScheduler`: a front whose
            workers drive), claimed from a shared store
            (:class:`~durable_turns.scheduling.ClaimingScheduler`), or by Temporal
            (``durable_turns.temporal.TemporalScheduler``). One scheduler per runtime.
        owns_store: ``False`` for a store another runtime of this process opened and
            closes (a replay's runtime shares its source's): ``close()`` leaves it open.
        commands: its sessions' commands (the hosts' routes, verbs and actions are built
            from it): ``commands.COMMANDS``, or that registry ``with_`` more.
        clock: the time its sleeps, deadlines and other due things are read from and waited
            on (F24): :class:`~durable_turns.clock.SystemClock` unless given (a test passes
            a :class:`~durable_turns.clock.ManualClock`).

    Raises:
        ConfigurationError: two agents share a name, a model is a string, or the removed
            ``drive=`` was passed (``drive=False`` is ``scheduler=NoDriveScheduler()``).
    """

    def __init__(
        self,
        agents: Iterable[Agent],
        store: SessionStore,
        model: Model | None = None,
        sink: EventSink | None = None,
        *,
        lease_timeout: float | None = None,
        secret: bytes | None = None,
        scheduler: Scheduler | None = None,
        owns_store: bool = True,
        commands: Registry = COMMANDS,
        clock: Clock | None = None,
        drive: None = None,
    ) -> None:
        if drive is not None:  # removed: a clear error rather than a TypeError
            raise ConfigurationError(
                "Runtime(drive=…) is gone: a runtime that drives nothing is "
                "Runtime(scheduler=durable_turns.scheduling.NoDriveScheduler()); the default "
                "drives in this process")
        self.agents: dict[str, Agent] = {}
        for a in agents:
            if a.name in self.agents:
                raise ConfigurationError(f"two agents named {a.name!r}")
            if isinstance(a.model, str):
                raise ConfigurationError(
                    f"agent {a.name!r} names its model as a string ({a.model!r}); resolve it "
                    "with durable_turns.models.resolve.resolve_model() (load_agent does)"
                )
            self.agents[a.name] = a
        if isinstance(model, str):
            raise ConfigurationError(
                f"Runtime(model={model!r}): pass a Model; resolve a provider string with "
                "durable_turns.models.resolve.resolve_model() first"
            )
        self.store = store
        self.model = model
        self.sink = sink
        self.lease_timeout = lease_timeout
        self.secret = secret or os.urandom(32)
        self.owns_store = owns_store
        self.commands = commands
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._drivers: dict[SessionKey, SessionDriver] = {}
        """The driver of each session whose lease this runtime holds (a step runs, or its
        scheduler holds the lease across steps)."""
        self._transcripts = TranscriptCache(TRANSCRIPT_CACHE)
        self._waiting: dict[tuple[SessionKey, str], list[asyncio.Future[TurnResult | None]]] = {}
        self._failed: dict[SessionKey, BaseException] = {}
        self.queries = Queries(store, self.require_open)
        """What hosts read across sessions (summaries, an inbox, owed deliveries)."""
        self.sessions: Sessions = RuntimeSessions(self)
        """The runtime's sessions as a tool step sees them (a subagent's child turns)."""
        self.clock: Clock = clock if clock is not None else SystemClock()
        """What time it is, for everything that acts at a time (F24)."""
        self._ctx = StepContext(
            store=store, agents=self.agents, model_for=self.model_for, sessions=self.sessions,
            transcripts=self._transcripts, publish=self._publish,
            publish_live=self._publish_live, wants_live=self._wants_live,
            finished=self._finished, commands=commands, clock=self.clock)
        self.scheduler: Scheduler = scheduler if scheduler is not None else InProcessScheduler()
        """When and where the sessions' steps run."""
        self.scheduler.attach(self)
        self.clock_loop = ClockLoop(self.clock)
        """Waits on :attr:`clock` for its sources' next due time and has them fire
        (:class:`~durable_turns.scheduling.DueSource`, plugged in by ``clock_loop.add``);
        started by :meth:`open` when this runtime steps sessions here. Its sources: the
        store's wake-ups (sleeps, deadlines, reminders) and :attr:`fires`."""
        self.fires = ScheduleFires(self, self.clock, changed=self.clock_loop.poke)
        """Its store's schedules (F24)."""
        self.clock_loop.add(StoreWakeups(self))
        self.clock_loop.add(self.fires)
        self._unwatch_parks: Callable[[], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the store, once however many ask at the same moment: ``async with``, a
        server's lifespan and the CLI call it, and nothing else opens lazily."""
        if self._opened:
            return
        async with self._open_lock:
            if not self._opened:
                await self.store.open()
                self._opened = True
                if self.scheduler.steps_here:
                    self.clock_loop.start()
                    # A park with a time (a sleep, a deadline) may be due before the loop's
                    # next look: it looks again when one commits here or a change is heard.
                    self._unwatch_parks = self.store.watch(None, self._parks_changed)

    @property
    def is_open(self) -> bool:
        """Whether :meth:`open` ran (and :meth:`close` has not since)."""
        return self._opened

    def require_open(self) -> None:
        """Raise :class:`~durable_turns.errors.RuntimeNotOpenError` unless it is open."""
        if not self._opened:
            raise RuntimeNotOpenError()

    async def close(self) -> None:
        """Stop driving (unfinished turns stay durable for ``recover()``) and close the store
        (unless another owns it: ``owns_store=False``)."""
        if self._unwatch_parks is not None:
            self._unwatch_parks()
            self._unwatch_parks = None
        self.clock_loop.halt()  # (at once: the sessions' steps stop where they are)
        await self.scheduler.close()
        await self.clock_loop.stop()
        for driver in list(self._drivers.values()):
            self._let_go(driver)
        if self._opened:
            if self.owns_store:
                await self.store.close()
            self._opened = False

    async def __aenter__(self) -> Runtime:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def session(self, agent: str, session_id: str) -> AgentSession:
        """The session ``session_id`` of agent ``agent`` (created on its first turn).

        Raises:
            UnknownAgentError: the runtime has no such agent.
            ValueError: an empty session id.
        """
        return AgentSession(self, self.key(agent, session_id))

    def key(self, agent: str, session_id: str) -> SessionKey:
        """The address of a session, checked.

        Raises:
            UnknownAgentError: the runtime has no such agent.
            ValueError: an empty session id.
        """
        if agent not in self.agents:
            raise UnknownAgentError(agent, sorted(self.agents))
        if not session_id or not isinstance(session_id, str):
            raise ValueError("a session id must be a non-empty string")
        return SessionKey(agent, session_id)

    def model_for(self, agent: Agent) -> Model:
        """The model an agent's turns ask.

        Raises:
            ConfigurationError: neither the agent nor the runtime has one.
        """
        model = agent.model or self.model
        if model is None:
            raise ConfigurationError(
                f"agent {agent.name!r} has no model and the runtime has none: pass "
                "Runtime(model=…) or Agent(model=…)"
            )
        return model

    @property
    def steps_here(self) -> bool:
        """Whether this runtime's scheduler steps sessions in this process
        (:attr:`Scheduler.steps_here <durable_turns.scheduling.Scheduler.steps_here>`)."""
        return self.scheduler.steps_here

    async def recover(self) -> list[SessionKey]:
        """Tell the scheduler of every unfinished turn in the store (run it when a worker
        starts): each is replayed from its transcript.

        Returns the sessions the scheduler was told of. Sessions of agents this runtime does
        not have are left for a runtime that has them.
        """
        self.require_open()
        keys = []
        for key in await self.store.find_sessions("unfinished"):
            if key.agent not in self.agents:
                log.warning("recover: no agent %r in this runtime; skipping %s", key.agent, key)
                continue
            await self.scheduler.wake(key)
            keys.append(key)
        return keys

    async def idle(self) -> None:
        """Wait until this runtime steps no session (for tests and orderly shutdown)."""
        await self.scheduler.wait_idle()

    async def schedule(self, name: str, *, agent: str, seed: str, **spec: Any) -> Schedule:
        """Store a schedule (F24; ``spec`` as ``Schedule.define`` takes it): each fire starts a
        turn whose id is the schedule's and the time's; ``ScheduleError`` if bad."""
        return await self.fires.define(name, agent=agent, seed=seed, **spec)

    async def unschedule(self, name: str) -> None:
        """Delete a schedule (its turns stay); ``UnknownScheduleError`` if there is none."""
        await self.fires.remove(name)

    async def schedules(self, agent: str | None = None) -> list[Schedule]:
        """The store's schedules (of ``agent``), by name, each with its next fire."""
        return await self.fires.all(agent)

    # -- the public API the sessions, channels and hosts use -------------------------------

    async def accept(self, key: SessionKey, entry: NewEntry) -> tuple[ChainEntry, bool]:
        """Accept a chain entry (a turn or a command) durably and drive it; returns it and
        whether it is new.

        A redelivered id is returned as stored, and driven again if it is unfinished. With
        ``entry.supersede`` (replace, reset), the unfinished turns before it are asked to
        cancel at once (``commands.accepting``), and a running one stops at its boundary.

        Raises:
            SessionBusyError: a turn is parked (for ``kind="turn"``).
            TurnConflictError: the id was accepted with other text.
        """
        self.require_open()
        if self.scheduler.steps_here:
            self.model_for(self.agents[key.agent])  # fail now, not in the background
        reason = entry.supersede
        if reason is not None and await supersede_at_once(self.store, key, entry) \
                and (driver := self._drivers.get(key)) is not None:
            driver.interrupt_running(reason)  # it stops at its next boundary
        joins = self.commands.joins(entry.kind)
        if joins:  # durable at once, also while a local tool's step holds the write lock
            entry = dataclasses.replace(entry, at_once=True)
        with self.joining(key) if joins else contextlib.nullcontext():
            rec, new = await self.store.enqueue(key, entry)
        if not new:
            check_redelivery(key, rec, entry)
        if rec.needs_driving or not rec.status.final:
            await self.scheduler.wake(key, interrupt=new and reason is not None)
        return rec, new

    def joining(self, key: SessionKey) -> contextlib.AbstractContextManager[None]:
        """A joining entry of the session (a steer, F25) is being accepted in this block: a
        turn of it driven here waits at its next model-call boundary for the block to end,
        then joins what it accepted (its write may wait behind a local tool's step)."""
        driver = self._drivers.get(key)
        return driver.accepting() if driver is not None else contextlib.nullcontext()

    async def wait(self, key: SessionKey, turn_id: str, *,
                   timeout: float | None = None) -> TurnResult:
        """The entry's result once it completes, fails, is cancelled or parks.

        Woken by the store's feed, so a turn driven by another process is seen as soon as its
        end commits. A turn found unfinished with nobody driving it here is driven (its lease
        makes this wait for a live holder elsewhere).

        Raises:
            UnknownTurnError: the session has no such entry.
            TimeoutError: ``timeout`` seconds passed first.
            StoreError: the store cannot be read, or this runtime's driver of the session
                gave up because it could not be written (the turn stays unfinished; a
                redelivery or ``recover()`` drives it again).
            DurableTurnsError: this runtime's driver of the session failed otherwise (the
                turn stays unfinished in the store for ``recover()``).
        """
        self.require_open()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        wake: asyncio.Future[None] = loop.create_future()

        def rouse(_: object = None) -> None:
            if not wake.done():
                wake.set_result(None)

        def on_change(events: list[TurnEvent] | None) -> None:
            if events is None or any(e.turn_id == turn_id and e.ends_turn for e in events):
                rouse()

        unwatch = self.store.watch(key, on_change)
        done: asyncio.Future[TurnResult | None] = loop.create_future()
        done.add_done_callback(rouse)
        waiters = self._waiting.setdefault((key, turn_id), [])
        waiters.append(done)
        try:
            kicked = False
            while True:
                # A fresh wake-up before each look, so a change made while looking is kept.
                wake = loop.create_future()
                known = done.result() if done.done() else None
                if known is not None:
                    return known  # this runtime drove it: what it committed
                found = await self.store.entries(key, turn_id=turn_id)
                if not found:
                    raise UnknownTurnError(str(key), turn_id)
                rec = found[0]
                if rec.settled:
                    return rec.result
                if done.done():  # this runtime's driver ended without ending the turn
                    failure = self._failed.get(key)
                    if failure is not None and key not in self._drivers:
                        # A store that failed is a StoreError here too (a host answers 503:
                        # retry, and the turn is driven again); anything else a failure.
                        kind = StoreError if runtime_failure(failure) else DurableTurnsError
                        raise kind(
                            f"driving session {key} failed, turn {turn_id!r} is unfinished "
                            f"(Runtime.recover() retries it): {type(failure).__name__}: "
                            f"{failure}"
                        ) from failure
                    waiters.remove(done)
                    done = loop.create_future()
                    done.add_done_callback(rouse)
                    waiters.append(done)
                if self.scheduler.steps_here and not kicked and key not in self._drivers:
                    kicked = True  # (a scheduler elsewhere was told when it was accepted)
                    await self.scheduler.wake(key)
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is None:
                    await wake
                    continue
                if remaining <= 0:
                    raise TimeoutError(f"turn {turn_id!r} of {key} did not end in {timeout}s")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await wake
        finally:
            unwatch()
            with contextlib.suppress(ValueError):
                waiters.remove(done)
            if not waiters:
                self._waiting.pop((key, turn_id), None)

    def subscribe(self, key: SessionKey, after_seq: int | None = None, *,
                  deltas: bool = True) -> Subscription:
        """The session's events after ``after_seq`` (stored ones first), then live ones.

        ``None`` starts at the newest stored event. With ``deltas``, live text is interleaved
        (``message.delta`` and the other live events, never stored, never replayed), from
        whichever process drives the turn. Close it (or use ``async with``) when done.
        """
        self.require_open()
        return self.store.subscribe(key, after_seq, live=deltas)

    async def interrupt(self, key: SessionKey, turn_id: str | None = None, *,
                        reason: str = "cancelled by request") -> list[str]:
        """Ask a turn (or every unfinished turn) of the session to cancel; returns at once.

        The request is durable and takes effect at the turn's next checkpoint boundary,
        wherever it runs; a model stream driven here stops at once.

        Returns:
            The ids of the turns that got the request (none for a finished one); a parked
            turn's request is withdrawn and the turn ends ``cancelled``.
        """
        self.require_open()
        ids = await self.store.request_cancel(key, turn_id, reason)
        if ids:
            driver = self._drivers.get(key)
            if driver is not None:
                driver.interrupt(ids, reason)
            # A parked turn among them: its end is a step of its own.
            await self.scheduler.wake(key, interrupt=True)
        return ids

    async def step(self, key: SessionKey, *, lease: Lease | None = None,
                   lease_timeout: float | None = None,
                   attempt: int | None = None) -> ChainState:
        """Run one step of the session's chain in this process, and say what is left.

        What every scheduler calls (``durable_turns.scheduling``; a Temporal activity): the
        chain's next step — a model call or a tool call (a parallel batch is one; a turn's
        opening goes with its first), or a command — runs under the session's lease and
        commits fenced by the lease's epoch. A step found committed is not run again (a
        replay after a crash). A cancel of the turn stops a model stream (or a retry's
        backoff) of the step at once.

        Args:
            key: the session.
            lease: the session's lease, held by the scheduler across many steps (claimed with
                ``store.claim`` or ``store.claim_ready``; it releases it): the runtime keeps
                what a step read (the chain, the turn under way) for the next step under the
                same lease, until the chain has nothing left or a step raises. ``None``: the
                step claims the lease (waiting for another holder, whose lease expires if it
                died) and releases it after.
            lease_timeout: without ``lease``, seconds to wait for it (``None``: the
                runtime's).
            attempt: the scheduler's attempt of this step (1-based), when it retries steps
                itself (Temporal): only that attempt of a model call or remote tool runs; a
                failure that ``model_retries`` or the tool's ``retries`` would retry raises
                :class:`~durable_turns.errors.RetryStep`, nothing written. ``None``: every
                attempt runs within the step.

        Returns:
            What is left of the chain (:meth:`chain`).

        Raises:
            RetryStep: ``attempt`` failed; run the step again after its ``delay``.
            LeaseTimeoutError: another holder kept the session's lease.
            LeaseLostError: the lease was lost (another process took the session over).
            StoreError: the store refused the step (nothing of it was written).
            ConfigurationError: the session's agent has no model.
            ValueError: ``attempt`` is not an int >= 1.
            DurableTurnsError: stepping failed otherwise (the turn stays unfinished).
        """
        if attempt is not None and (not isinstance(attempt, int) or attempt < 1):
            raise ValueError(f"attempt must be an int >= 1, not {attempt!r}")
        self.require_open()
        if lease is not None:
            driver = self._drivers.get(key)
            if driver is None or driver.lease is not lease:
                driver = self._hold(lease)
            try:
                state = await driver.step(attempt)
            except BaseException as e:
                self._let_go(driver, e)
                raise
            if not state.more:
                self._let_go(driver)
            return state
        wait = self.lease_timeout if lease_timeout is None else lease_timeout
        lease = await self.store.claim(key, timeout=wait)
        try:
            driver = self._hold(lease)
            try:
                state = await driver.step(attempt)
            except BaseException as e:
                self._let_go(driver, e)
                raise
            self._let_go(driver)
            return state
        finally:
            await lease.release()

    async def chain(self, key: SessionKey) -> ChainState:
        """What is left of the session's chain, without driving it: whether more needs
        driving, whether a turn is parked, and the next step (what a scheduler asks before
        it schedules one)."""
        self.require_open()
        return chain_state(await self.store.entries(key, unfinished=True),
                           self._transcripts.peek(key), self.commands.joins)

    # -- drivers ---------------------------------------------------------------------------

    async def drive_session(self, key: SessionKey) -> None:
        """Have the session's unfinished entries stepped (what ``accept`` does for a new one;
        a fork's turn under way, for one): the scheduler is told."""
        self.require_open()
        await self.scheduler.wake(key)

    def stopped(self, key: SessionKey, failure: BaseException | None = None) -> None:
        """A scheduler that steps sessions in this process stopped stepping ``key`` (it has
        nothing left, or gave up: ``failure``, kept for :meth:`wait` to raise until the
        session is stepped again). Its waiters look at the store again."""
        if failure is not None and not isinstance(failure, RetryStep):
            self._failed[key] = failure
        for (k, _turn), futures in list(self._waiting.items()):
            if k == key:
                for f in futures:
                    if not f.done():
                        f.set_result(None)

    def _hold(self, lease: Lease) -> SessionDriver:
        key = lease.key
        old = self._drivers.get(key)
        if old is not None:
            self._let_go(old)
        self._failed.pop(key, None)
        driver = self._drivers[key] = SessionDriver(self._ctx, lease)
        return driver

    def _let_go(self, driver: SessionDriver, failure: BaseException | None = None) -> None:
        driver.close()
        if self._drivers.get(driver.key) is driver:
            del self._drivers[driver.key]
        if failure is not None and not isinstance(failure, RetryStep):
            self._transcripts.forget(driver.key)  # the next step reads what the store holds

    def _finished(self, key: SessionKey, result: TurnResult) -> None:
        for f in self._waiting.get((key, result.turn_id), ()):
            if not f.done():
                f.set_result(result)

    def _publish(self, events: list[TurnEvent]) -> None:
        if self.sink is None:
            return
        for e in events:
            try:
                self.sink.emit(e)
            except Exception:
                log.exception("event sink failed on %s", e.type)

    def _parks_changed(self, events: list[TurnEvent] | None) -> None:
        if events is None:  # another process's commit (a worker's park?): one look for many
            self.clock_loop.poke(after=PARKS_HEARD_AFTER)
        elif any(e.type in ("input.requested", "turn.sleeping") for e in events):
            self.clock_loop.poke()

    def _wants_live(self, key: SessionKey) -> bool:
        return self.sink is not None or self.store.wants_live(key)

    def _publish_live(self, event: TurnEvent) -> None:
        self.store.publish_live(event)
        self._publish([event])


__all__ = ["PARKS_HEARD_AFTER", "TRANSCRIPT_CACHE", "Runtime"]
