"""``Runtime``: agents, a store and a model; it accepts, drives and reports turns (F2, F5).

Its public API is small, and everything above it (``AgentSession``, the channels, the HTTP
host) is built on it:

- :meth:`Runtime.accept` makes a chain entry durable (a turn, a reset, a resume) and wakes the
  session's :class:`~durable_turns.driver.SessionDriver`;
- :meth:`Runtime.wait` returns an entry's result once it ends or parks, whichever process
  drives it (woken by the store's event feed);
- :meth:`Runtime.subscribe` yields a session's events after a cursor, then live ones, with
  live text (``message.delta``) from whichever process drives the turn (the store carries
  it: ``TurnStore.publish_live``);
- :meth:`Runtime.interrupt` asks turns to cancel, durably, and stops a running one at once.

A crash loses nothing: an accepted entry is in the store before ``accept`` returns, and
``Runtime.recover()`` (or a redelivery of the turn id) starts a driver again, which replays
from the transcript. Nothing per session stays in memory once its driver exits, except a
bounded cache of recent transcripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from typing import Protocol

from .agent import Agent
from .commands import COMMANDS, Registry, check_redelivery, supersede_at_once
from .context import Host
from .driver import ChainState, SessionDriver, TranscriptCache, chain_state
from .errors import (
    ConfigurationError,
    DurableTurnsError,
    RetryStep,
    StoreError,
    UnknownAgentError,
    UnknownTurnError,
    runtime_failure,
)
from .events import EventSink, TurnEvent
from .host import RuntimeHost
from .model import Model
from .queries import Queries
from .records import NewEntry, SessionKey, TurnRecord, TurnResult
from .sessions import AgentSession
from .stores import Lease, SessionStore, Subscription

log = logging.getLogger("durable_turns")

TRANSCRIPT_CACHE = 64
"""How many recent sessions' transcripts a runtime keeps, so a step never re-reads history."""
AWAY_POLL = 0.1
"""Seconds between a worker's looks for work while its store refuses them."""
AWAY_LOG_EVERY = 30.0
"""Seconds between a worker's warnings that its store refuses its looks."""


class Scheduler(Protocol):
    """Who drives a runtime's sessions when something other than the runtime schedules them.

    With a scheduler, a runtime never starts a driver of its own: it tells the scheduler
    that a session has work, and the scheduler's workers call :meth:`Runtime.step` until the
    chain is done or parked (``durable_turns.temporal``: a Temporal workflow per session).
    """

    async def wake(self, key: SessionKey, *, interrupt: bool = False) -> None:
        """The session has (or may have) work: an entry, a cancel, an answer, all durable.

        Called after the store holds the change, any number of times (it must be
        idempotent); it must return once the scheduler has the news, never drive here.
        ``interrupt``: a turn was asked to stop (a cancel, a replace, a reset), so a step
        that waits out a retry's backoff should run now (its turn ends at the boundary).

        Raises:
            StoreError: the scheduler cannot be reached (the change stays durable; a
                redelivery or ``Runtime.recover()`` wakes the session again).
        """
        ...


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
        drive: ``False`` makes a runtime that accepts entries durably and answers ``wait``
            and ``subscribe`` from the store, but drives nothing (another process does).
        scheduler: who drives the sessions (see :class:`Scheduler`); the runtime then only
            tells it of work, and drives a step when the scheduler calls :meth:`step`.
        owns_store: ``False`` for a store another runtime of this process opened and
            closes (a replay's runtime shares its source's): ``close()`` leaves it open.
        commands: its sessions' commands (the hosts' routes, verbs and actions are built
            from it): ``commands.COMMANDS``, or that registry ``with_`` more.
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
        drive: bool = True,
        scheduler: Scheduler | None = None,
        owns_store: bool = True,
        commands: Registry = COMMANDS,
    ) -> None:
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
        self.drive = drive
        self.scheduler = scheduler
        self.owns_store = owns_store
        self.commands = commands
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._drivers: dict[SessionKey, SessionDriver] = {}
        self._transcripts = TranscriptCache(TRANSCRIPT_CACHE)
        self._waiting: dict[tuple[SessionKey, str], list[asyncio.Future[TurnResult | None]]] = {}
        self._failed: dict[SessionKey, BaseException] = {}
        self.queries = Queries(store, self.open)
        """What hosts read across sessions (summaries, an inbox, owed deliveries)."""
        self.host: Host = RuntimeHost(self)
        """The runtime's sessions as a tool step sees them (a subagent's child turns)."""

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the store (once, however many callers ask at the same moment)."""
        if self._opened:
            return
        async with self._open_lock:
            if not self._opened:
                await self.store.open()
                self._opened = True

    async def close(self) -> None:
        """Stop driving (unfinished turns stay durable for ``recover()``) and close the store
        (unless another owns it: ``owns_store=False``)."""
        tasks = [d.task for d in self._drivers.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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

    async def recover(self) -> list[SessionKey]:
        """Replay every unfinished turn in the store (run it when a worker starts).

        Returns the sessions whose drivers were started. Sessions of agents this runtime does
        not have are left for a runtime that has them.
        """
        await self.open()
        keys = []
        for key in await self.store.find_sessions("unfinished"):
            if key.agent not in self.agents:
                log.warning("recover: no agent %r in this runtime; skipping %s", key.agent, key)
                continue
            await self._kick(key)
            keys.append(key)
        return keys

    async def work(self, *, poll_interval: float = 0.5, max_sessions: int = 100) -> None:
        """Be a worker: drive every session of this runtime's agents that has a queued or
        running turn, as such sessions appear, until cancelled.

        Many workers (processes, machines) may work one store. Sessions are claimed with
        ``store.claim_ready`` (PostgreSQL: ``FOR UPDATE SKIP LOCKED``), so workers never wait
        on each other and never get the same session; a session whose holder died is taken
        over once its lease expired (PostgreSQL: ``lease_ttl``; SQLite: at once, the OS lock
        died with the process). Wakes when the store's feed reports a change of a chain
        (PostgreSQL: a NOTIFY of a new turn, a resume or a cancel) or a session of its own
        is done, and looks every ``poll_interval`` seconds anyway, so a lost notification is
        only a delay. A look the store refuses (the database away) is logged and made again.

        Args:
            poll_interval: seconds between looks when nothing woke the worker.
            max_sessions: how many sessions this worker drives at once, at most; the rest
                are left to other workers (or to this one, once it has room).

        Raises:
            ConfigurationError: this runtime was made with ``drive=False``.
        """
        if not self.drive:
            raise ConfigurationError("Runtime(drive=False) drives nothing; work() needs drive")
        if self.scheduler is not None:
            raise ConfigurationError("a runtime with a scheduler is driven by its workers "
                                     "(Runtime.step), not by work()")
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        await self.open()
        wake = asyncio.Event()
        # Woken by the store's feed (PostgreSQL: NOTIFY of a new turn, resume or cancel);
        # the poll makes a lost notification only a delay.
        stop = self.store.watch(None, lambda _events: wake.set())
        agents = list(self.agents)
        loop = asyncio.get_running_loop()
        away_since: float | None = None
        said = 0.0
        try:
            while True:
                wake.clear()
                room = max_sessions - len(self._drivers)
                pause = poll_interval
                try:
                    claimed = await self.store.claim_ready(agents, room) if room > 0 else ()
                except StoreError as e:
                    # The database is away: look again soon (a refused look costs little),
                    # so the work it kept waiting starts as soon as it is back; said once
                    # in a while, not at every look.
                    now = loop.time()
                    if away_since is None or now - said > AWAY_LOG_EVERY:
                        log.warning("worker: cannot claim sessions (retrying): %s", e)
                        said = now
                    away_since = now if away_since is None else away_since
                    claimed = ()
                    pause = min(poll_interval, AWAY_POLL)
                else:
                    if away_since is not None:
                        log.warning("worker: the store answers again (it was away for %.1fs)",
                                    loop.time() - away_since)
                        away_since = None
                for lease in claimed:
                    driver = self._drivers.get(lease.key)
                    if driver is not None and driver.alive:
                        await lease.release()  # this runtime drives it already
                        driver.wake()
                        continue
                    self._drive(lease.key, lease=lease)
                    self._drivers[lease.key].task.add_done_callback(lambda _t: wake.set())
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that comes
                # as the wait ends, and work() would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await wake.wait()
        finally:
            stop()

    async def idle(self) -> None:
        """Wait until this runtime drives no session (for tests and orderly shutdown)."""
        while self._drivers:
            await asyncio.gather(*[d.task for d in self._drivers.values()],
                                 return_exceptions=True)

    # -- the public API the sessions, channels and hosts use -------------------------------

    async def accept(self, key: SessionKey, entry: NewEntry) -> tuple[TurnRecord, bool]:
        """Accept a chain entry (a turn or a command) durably and drive it; returns it and
        whether it is new.

        A redelivered id is returned as stored, and driven again if it is unfinished. With
        ``entry.supersede`` (replace, reset), the unfinished turns before it are asked to
        cancel at once (``commands.accepting``), and a running one stops at its boundary.

        Raises:
            SessionBusyError: a turn is parked (for ``kind="turn"``).
            TurnConflictError: the id was accepted with other text.
        """
        await self.open()
        if self.drive:
            self.model_for(self.agents[key.agent])  # fail now, not in the background
        reason = entry.supersede
        if reason is not None and await supersede_at_once(self.store, key, entry) \
                and (driver := self._drivers.get(key)) is not None:
            driver.interrupt_running(reason)  # it stops at its next boundary
        rec, new = await self.store.enqueue(key, entry)
        if not new:
            check_redelivery(key, rec, entry)
        if rec.needs_driving or not rec.status.final:
            await self._kick(key, interrupt=new and reason is not None)
        return rec, new

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
        await self.open()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        wake: asyncio.Future[None] = loop.create_future()

        def rouse(_: object = None) -> None:
            if not wake.done():
                wake.set_result(None)

        def on_change(events: list[TurnEvent] | None) -> None:
            if events is None:
                rouse()
                return
            for e in events:
                if e.turn_id == turn_id and e.ends_turn:
                    rouse()
                    return

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
                found = await self.store.turns(key, turn_id=turn_id)
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
                if self.drive and self.scheduler is None and not kicked \
                        and key not in self._drivers:
                    kicked = True  # (a scheduler was told when the entry was accepted)
                    self._drive(key)
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
        await self.open()
        ids = await self.store.request_cancel(key, turn_id, reason)
        if ids:
            driver = self._drivers.get(key)
            if driver is not None:
                driver.interrupt(ids, reason)
            await self._kick(key, interrupt=True)  # a parked turn among them: its end is ours
        return ids

    async def step(self, key: SessionKey, *, lease_timeout: float | None = None,
                   attempt: int | None = None) -> ChainState:
        """Drive one step of the session's chain in this process, and say what is left.

        What a scheduler's worker calls (a Temporal activity): it claims the session's lease
        (waiting for another holder, whose lease expires if it died), runs the chain's next
        step — a model call or tool call (a parallel batch is one; a turn's opening goes
        with its first), or a command — commits it fenced by the lease's epoch, and lets
        the lease go. A step found committed is not run again (a replay after a crash).

        Args:
            key: the session.
            lease_timeout: seconds to wait for the lease (``None``: the runtime's).
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
            StoreError: the store refused the step (nothing of it was written).
            DurableTurnsError: driving failed otherwise (the turn stays unfinished).
        """
        await self.open()
        agent = self.agents[key.agent]
        wait = self.lease_timeout if lease_timeout is None else lease_timeout
        running = self._drivers.get(key)
        if running is not None and running.alive:
            # A step of this session still runs here (one its scheduler gave up on): it
            # ends at its next boundary; past the wait, the claim below waits for its lease.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await asyncio.gather(running.task, return_exceptions=True)
        driver = SessionDriver(
            key, agent, self.model_for(agent), self.store, transcripts=self._transcripts,
            publish=self._publish, publish_live=self._publish_live, finished=self._finished,
            lease_timeout=wait, host=self.host, wants_live=self._wants_live, steps=1,
            attempt=attempt, commands=self.commands,
        )
        self._drivers[key] = driver
        driver.task.add_done_callback(lambda _t: self._driver_done(driver))
        await driver.task  # cancelling the step (its activity was) abandons it, unwritten
        if driver.failure is not None:
            raise driver.failure
        return await self.chain(key)

    async def chain(self, key: SessionKey) -> ChainState:
        """What is left of the session's chain, without driving it: whether more needs
        driving, whether a turn is parked, and the next step (what a scheduler asks before
        it schedules one)."""
        await self.open()
        return chain_state(await self.store.turns(key, unfinished=True),
                           self._transcripts.peek(key))

    # -- drivers ---------------------------------------------------------------------------

    async def drive_session(self, key: SessionKey) -> None:
        """Drive the session's unfinished entries now (what ``accept`` does for a new one; a
        fork's turn under way, for one): here, or through the scheduler. A runtime with
        ``drive=False`` leaves them to its workers, which the store's feed tells."""
        await self._kick(key)

    async def _kick(self, key: SessionKey, *, interrupt: bool = False) -> None:
        """The session has work (``interrupt``: a turn was asked to stop): drive it here, or
        tell the scheduler."""
        if self.scheduler is not None:
            await self.scheduler.wake(key, interrupt=interrupt)
            return
        self._drive(key)

    def _drive(self, key: SessionKey, *, try_once: bool = False,
               lease: Lease | None = None) -> None:
        if not self.drive:
            return
        driver = self._drivers.get(key)
        if driver is not None and driver.alive:
            driver.wake()
            return
        agent = self.agents[key.agent]
        self._failed.pop(key, None)
        driver = SessionDriver(
            key, agent, self.model_for(agent), self.store, transcripts=self._transcripts,
            publish=self._publish, publish_live=self._publish_live, finished=self._finished,
            lease_timeout=self.lease_timeout, host=self.host, try_once=try_once, lease=lease,
            wants_live=self._wants_live, commands=self.commands,
        )
        self._drivers[key] = driver
        driver.task.add_done_callback(lambda _t: self._driver_done(driver))

    def _driver_done(self, driver: SessionDriver) -> None:
        key = driver.key
        if self._drivers.get(key) is driver:
            del self._drivers[key]
            if driver.failure is not None and not isinstance(driver.failure, RetryStep):
                # Kept where wait() looks, until the session is driven again.
                self._failed[key] = driver.failure
        for (k, _turn), futures in list(self._waiting.items()):
            if k == key:
                for f in futures:
                    if not f.done():
                        f.set_result(None)

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

    def _wants_live(self, key: SessionKey) -> bool:
        return self.sink is not None or self.store.wants_live(key)

    def _publish_live(self, event: TurnEvent) -> None:
        self.store.publish_live(event)
        self._publish([event])
