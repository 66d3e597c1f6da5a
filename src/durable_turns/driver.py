"""One session's driver: its lease, its chain, its cancels, its commands (F2, F6 to F8).

A runtime runs at most one :class:`SessionDriver` per session, and only while the session has
work. The driver claims the session's lease (a fencing epoch with it), then runs the chain's
unfinished entries in order — turns through the engine, and the commands that must keep their
place in the chain: a ``reset`` archives the generation, a ``resume`` stores a person's
answer and sets the parked turn going again, a ``retry`` re-opens a failed turn. It exits
when nothing is left (or the chain waits on a person), releasing the lease.

Cancels reach a running turn two ways: in-process, :meth:`SessionDriver.interrupt` sets the
turn's flag and stops its model stream at once; from another process, the store's feed
reports a change and the driver reads the durable cancel request. Checkpoint boundaries read
only the flag, never the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .agent import Agent
from .commands import COMMANDS, Place, Registry
from .context import Host
from .engine import TurnEngine
from .errors import LeaseLostError, LeaseTimeoutError, RetryStep, StepTaken, StoreError
from .events import TurnEvent
from .messages import Message, MessageLog, owed_calls
from .model import Model
from .records import SessionKey, StepId, StepResult, TurnRecord, TurnResult, TurnStatus
from .stores import Lease, SessionStore
from .subagents import cancel_children

log = logging.getLogger("durable_turns")

Finished = Callable[[SessionKey, TurnResult], None]
STORE_RETRIES = 5
"""How often a driver drives a session again after the store refused a step."""
STORE_BACKOFF = 0.05
"""Seconds before the first such retry; doubled each time, up to 5 s."""


def runnable(pending: Iterable[TurnRecord]) -> list[TurnRecord]:
    """The chain entries a driver runs next, in chain order, of the session's unfinished ones.

    A parked turn with a cancel runs (to its end) in its place in the chain; while a turn is
    parked on a standing request, only commands run.
    """
    pending = list(pending)
    out = [t for t in pending if t.needs_driving]
    if any(t.parked for t in pending):
        out = [t for t in out if t.kind != "turn"]
    return out


@dataclass(frozen=True, slots=True)
class ChainState:
    """What is left of a session's chain after a drive: what a scheduler asks for next."""

    more: bool
    """An entry needs driving now (a queued or running turn, a command, a withdrawn park)."""
    parked: bool
    """A turn waits on a person's answer (or a child's end)."""
    next: str = ""
    """The next step: ``model``, ``tool`` (a reply's owed calls), or the command's kind."""
    tools: tuple[str, ...] = ()
    """For a ``tool`` step: the names of the calls it runs."""


def chain_state(pending: Iterable[TurnRecord], transcript: list[Message] | None) -> ChainState:
    """What is left of a chain, from its unfinished entries and (when known) its live log.

    Args:
        pending: the session's unfinished chain entries.
        transcript: the live log the last drive left, to name the next step's tools.

    Returns:
        The chain's state; ``next`` is ``model`` when the log is not known.
    """
    pending = list(pending)
    entries = runnable(pending)
    parked = any(t.parked for t in pending)
    if not entries:
        return ChainState(False, parked)
    entry = entries[0]
    if entry.kind != "turn":
        return ChainState(True, parked, entry.kind)
    n, owed = owed_calls(transcript) if transcript else (-1, [])
    if owed and transcript and transcript[n].turn_id == entry.turn_id:
        return ChainState(True, parked, "tool", tuple(c.name for c in owed))
    return ChainState(True, parked, "model")


class TranscriptCache:
    """The live logs of recently driven sessions, so a turn never re-reads its history.

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
        self._logs[key] = (generation, log_)
        self._logs.move_to_end(key)
        while len(self._logs) > self.size:
            self._logs.popitem(last=False)

    def forget(self, key: SessionKey) -> None:
        self._logs.pop(key, None)

    def peek(self, key: SessionKey) -> list[Message] | None:
        """The session's live log as the last drive here left it, if it is kept."""
        cached = self._logs.get(key)
        return None if cached is None else cached[1]


class SessionDriver:
    """Drives one session's chain while it has work; see the module docstring.

    Args:
        key: the session.
        agent: its agent.
        model: the model its turns ask.
        store: where it lives.
        transcripts: the runtime's cache of live logs.
        publish: receives each committed step's events.
        publish_live: receives live events (text as it streams, model retries).
        wants_live: whether anyone takes the session's live text now (None: always).
        finished: told each chain entry's end (or park).
        lease_timeout: how long to wait for another holder of the session's lease.
        try_once: claim the lease without waiting; a session another holder has is left to
            it (the driver ends quietly), as a worker looking for work does.
        host: the runtime's other sessions, for tools that start durable child work
            (subagents, F13) and the parent-close policy of commands.
        lease: the session's lease, already claimed (``SessionStore.claim_ready``); the
            driver releases it when done. Later looks at the chain claim again (``try_once``).
        steps: drive this many steps of the chain at most, then release the lease and end
            (``None``: until nothing is left). A step is a model call, a tool call (a
            parallel batch is one) or a command; a turn's opening goes with its first step.
            A scheduler that owns the chain's order (Temporal) drives one at a time.
        commands: the runtime's command registry (how a chain entry's command is read back
            and applied).
        attempt: with ``steps=1``, the attempt of that step this drive runs (1-based), for a
            scheduler that retries steps itself: a failure a tool's ``retries`` or the
            agent's ``model_retries`` would retry ends the drive with
            :class:`~durable_turns.errors.RetryStep` as its :attr:`failure`, nothing
            written. ``None``: every attempt runs within the step.

    Raises:
        ValueError: ``attempt`` is not an int >= 1.
    """

    def __init__(self, key: SessionKey, agent: Agent, model: Model, store: SessionStore, *,
                 transcripts: TranscriptCache, publish: Callable[[list[TurnEvent]], None],
                 publish_live: Callable[[TurnEvent], None], finished: Finished,
                 lease_timeout: float | None, host: Host, try_once: bool = False,
                 lease: Lease | None = None,
                 wants_live: Callable[[SessionKey], bool] | None = None,
                 steps: int | None = None, attempt: int | None = None,
                 commands: Registry = COMMANDS) -> None:
        if attempt is not None and (not isinstance(attempt, int) or attempt < 1):
            raise ValueError(f"attempt must be an int >= 1, not {attempt!r}")
        self.key = key
        self.failure: BaseException | None = None
        """Why driving stopped, when it stopped on an error (the turns stay in the store)."""
        self._agent = agent
        self._model = model
        self._store = store
        self._transcripts = transcripts
        self._publish = publish
        self._publish_live = publish_live
        self._wants_live = wants_live
        self._finished = finished
        self._try_once = try_once or lease is not None
        self._lease_timeout = 0 if self._try_once else lease_timeout
        self._host = host
        self._wanted = True
        self._cancels: dict[str, str] = {}
        self._engine: TurnEngine | None = None
        self._lease: Lease | None = None
        self._claimed = lease
        self._checking = False
        self._check_again = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._steps = steps
        self._attempt = attempt
        self._commands = commands
        self.task = asyncio.create_task(self._run(), name=f"durable-turns {key}")

    @property
    def alive(self) -> bool:
        return not self.task.done()

    def wake(self) -> None:
        """There is (or may be) new work: look at the chain again before exiting."""
        self._wanted = True

    def interrupt(self, turn_ids: Iterable[str], reason: str) -> None:
        """These turns were asked to cancel: flag them and stop the one that streams."""
        engine = self._engine
        for t in turn_ids:
            self._cancels.setdefault(t, reason)
            if engine is not None:
                engine.interrupt(t)

    def interrupt_running(self, reason: str) -> None:
        """The turn this driver runs now was superseded (replace, reset)."""
        engine = self._engine
        if engine is not None and engine.turn_id is not None:
            self.interrupt([engine.turn_id], reason)

    def _live_wanted(self) -> Callable[[], bool] | None:
        wants, key = self._wants_live, self.key
        return None if wants is None else lambda: wants(key)

    async def _run(self) -> None:
        failures = 0
        try:
            while self._wanted:
                self._wanted = False
                try:
                    await self._drive_once()
                    failures = 0
                    if self._steps is not None:
                        break  # its scheduler asks again for the next one
                except StoreError as e:
                    # The step was abandoned, nothing of it written: drive the turn again
                    # after a pause, from what the store holds.
                    failures += 1
                    if failures > STORE_RETRIES:
                        raise
                    delay = min(STORE_BACKOFF * 2 ** (failures - 1), 5.0)
                    log.warning("durable_turns: %s: %s; driving it again in %.2fs",
                                self.key, e, delay)
                    self._transcripts.forget(self.key)
                    self._wanted = True
                    await self._back_off(delay)
        except RetryStep as e:
            log.info("durable_turns: %s: %s; its scheduler runs the step again in %.2fs",
                     self.key, e, e.delay)
            self.failure = e
        except LeaseLostError as e:
            log.warning("durable_turns: %s; stopped driving it", e)
            self._transcripts.forget(self.key)
        except LeaseTimeoutError as e:
            self._transcripts.forget(self.key)
            if not self._try_once:  # else another holder drives it: nothing failed
                log.error("durable_turns: %s; its turns stay for recover()", e)
                self.failure = e
        except Exception as e:
            log.exception("durable_turns: driving %s failed; its turns stay for recover()",
                          self.key)
            self._transcripts.forget(self.key)
            self.failure = e
        finally:
            for t in list(self._tasks):
                t.cancel()

    async def _back_off(self, delay: float) -> None:
        """Wait ``delay`` seconds before driving again after a store failure, or less: the
        store's feed reports a change of the session when it hears from the database again
        (a listener that reconnected), and the turn goes on at once."""
        changed = asyncio.Event()
        unwatch = self._store.watch(self.key, lambda _events: changed.set())
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await changed.wait()
        finally:
            unwatch()

    async def _drive_once(self) -> None:
        lease, self._claimed = self._claimed, None
        if lease is None:
            lease = await self._store.claim(self.key, timeout=self._lease_timeout)
        self._lease = lease
        unwatch = self._store.watch(self.key, self._on_change)
        try:
            await self._chain(lease)
        finally:
            unwatch()
            self._engine = self._lease = None
            await lease.release()

    async def _chain(self, lease: Lease) -> None:
        key, store = self.key, self._store

        async def read_step(step: StepId) -> StepResult | None:
            step_id = str(step)
            steps = await store.read_steps(key, step_id=step_id)
            return steps[step_id].result if step_id in steps else None

        async def find(turn_id: str) -> TurnRecord | None:
            found = await store.turns(key, turn_id=turn_id)
            return found[0] if found else None

        engine = TurnEngine(self._agent, self._model, lease,
                            await self._transcripts.load(store, lease), self._publish,
                            self._publish_live, read_step, self._cancels.get, self._host,
                            wants_live=self._live_wanted())
        engine.step_budget = self._steps
        engine.attempt = self._attempt
        self._engine = engine
        while True:
            pending = await store.turns(key, unfinished=True)
            entries = runnable(pending)
            if not entries:
                return
            for t in pending:
                if t.cancel is not None:
                    self._cancels.setdefault(t.turn_id, t.cancel)
            entry = entries[0]
            if entry.kind == "turn":
                try:
                    result = await self._run_turn(engine, entry)
                except StepTaken:
                    return  # the turn goes on in the next drive, from the transcript
            else:
                result = await self._apply(engine, lease, Place(
                    entry, pending, engine.checkpoints, find, self._host,
                    lambda r: self._finished(key, r)))
            self._cancels.pop(entry.turn_id, None)
            log.debug("%s %s of %s: %s", entry.kind, entry.turn_id, key, result.status)
            self._finished(key, result)
            if self._steps is not None:
                return  # one entry's end is a step of its own
    async def _run_turn(self, engine: TurnEngine, entry: TurnRecord) -> TurnResult:
        if entry.status == TurnStatus.SUSPENDED and entry.cancel is not None:
            # A cancel withdrew the park (parent-close policy): the children it waits on
            # are cancelled first, then the turn ends.
            await cancel_children(self._host, entry, entry.cancel)
        return await engine.run(entry)

    async def _apply(self, engine: TurnEngine, lease: Lease, at: Place) -> TurnResult:
        result = await self._commands.command_of(at.entry).apply(at)
        # A command may have started a generation (a reset): the cache keeps the log's.
        self._transcripts.keep(self.key, lease.generation, engine.transcript)
        return result

    # -- cancels from other processes ------------------------------------------------------

    def _on_change(self, events: list[TurnEvent] | None) -> None:
        if events is not None:
            return  # our own commits
        if self._checking:
            self._check_again = True
            return
        engine, lease = self._engine, self._lease
        if engine is None or lease is None or engine.turn_id is None:
            return
        self._checking = True
        task = asyncio.create_task(self._check_cancel(lease, engine.turn_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check_cancel(self, lease: Lease, turn_id: str) -> None:
        try:
            while True:
                self._check_again = False
                reason = await lease.cancel_requested(turn_id)
                if reason is not None:
                    self.interrupt([turn_id], reason)
                    return
                if not self._check_again:
                    return
        except Exception:
            log.debug("cancel check of %s failed; the next change retries", self.key,
                      exc_info=True)
        finally:
            self._checking = False

