"""One session's driver: its chain, its cancels, its commands, under a lease (F2, F6 to F8).

A runtime has at most one :class:`SessionDriver` per session: the one of the lease it holds.
Each :meth:`SessionDriver.step` runs the next step of the chain's unfinished entries, in
order — a turn's step through the engine, or a command that must keep its place in the chain:
a ``reset`` archives the generation, a ``resume`` stores a person's answer and sets the parked
turn going again, a ``retry`` re-opens a failed turn — and says what is left
(:class:`ChainState`). Schedulers decide when steps run (``durable_turns.scheduling``).

A joining command (a steer, F25: ``commands._joining``) is applied at the running turn's
next model-call boundary: the engine calls :meth:`SessionDriver.join` before each model call,
which reads the chain only when it may have changed since (the store's feed said so, this
runtime accepted a joining entry, or the driver is new: a replay), and joins the queued
joining entries after the turn, each in one transaction.

Cancels reach a running turn two ways: in-process, :meth:`SessionDriver.interrupt` sets the
turn's flag and stops its model stream at once; from another process, the store's feed
reports a change and the driver reads the durable cancel request. Checkpoint boundaries read
only the flag, never the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from ..commands import Join, JoiningCommand, Place
from ..commands._joining import joiners
from ..events import TurnEvent
from ..messages import Message, owed_calls
from ..records import ChainEntry, TurnResult, TurnStatus
from ..stores import Lease
from ..subagents import cancel_children
from ._loop import TurnEngine
from ._step_context import StepContext

log = logging.getLogger("durable_turns")


Joins = Callable[[str], bool]
"""Whether chain entries of a kind join the running turn (``Registry.joins``)."""


def _never(_kind: str) -> bool:
    return False


def runnable(pending: Iterable[ChainEntry], joins: Joins = _never) -> list[ChainEntry]:
    """The chain entries a driver runs next, in chain order, of the session's unfinished ones.

    A parked turn with a cancel runs (to its end) in its place in the chain; while a turn is
    parked on a standing request, only commands run — but not joining ones (``joins``),
    which wait to join that turn once it runs again.
    """
    pending = list(pending)
    out = [t for t in pending if t.needs_driving]
    if any(t.parked for t in pending):
        out = [t for t in out if t.kind != "turn" and not joins(t.kind)]
    return out


@dataclass(frozen=True, slots=True)
class ChainState:
    """What is left of a session's chain after a step: what a scheduler asks for next."""

    more: bool
    """An entry needs driving now (a queued or running turn, a command, a withdrawn park)."""
    parked: bool
    """A turn waits on a person's answer (or a child's end)."""
    next: str = ""
    """The next step: ``model``, ``tool`` (a reply's owed calls), or the command's kind."""
    tools: tuple[str, ...] = ()
    """For a ``tool`` step: the names of the calls it runs."""


def chain_state(pending: Iterable[ChainEntry], transcript: list[Message] | None,
                joins: Joins = _never) -> ChainState:
    """What is left of a chain, from its unfinished entries and (when known) its live log.

    Args:
        pending: the session's unfinished chain entries.
        transcript: the live log the last step left, to name the next step's tools.
        joins: which entry kinds join the running turn (``Registry.joins``).

    Returns:
        The chain's state; ``next`` is ``model`` when the log is not known.
    """
    pending = list(pending)
    entries = runnable(pending, joins)
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


class SessionDriver:
    """Steps one session's chain under one lease of it; see the module docstring.

    Made by :meth:`Runtime.step <durable_turns.Runtime.step>` for a lease it claimed, or
    for one its scheduler holds across many steps (the in-process scheduler's): then it
    keeps what a step read (the chain, the turn under way, its trace) for the next.

    Args:
        ctx: the runtime's collaborators.
        lease: the session's lease, held while the driver lives (its owner releases it).
    """

    def __init__(self, ctx: StepContext, lease: Lease) -> None:
        self.key = lease.key
        self.lease = lease
        self._ctx = ctx
        self._cancels: dict[str, str] = {}
        self._engine: TurnEngine | None = None
        self._pending: list[ChainEntry] | None = None
        """The session's unfinished entries as last read (``None``: read them next)."""
        self._entry: ChainEntry | None = None
        """The turn under way: its next step runs without reading the chain again."""
        self._parked: bool | None = None
        """Whether a turn of :attr:`_pending` is parked (``None``: not looked yet)."""
        self._checking = False
        self._check_again = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._may_join = True
        """The chain may hold a joining entry the running turn has not joined (a new driver
        does not know: a replay after a crash looks)."""
        self._accepting = 0
        """Joining entries this runtime is writing now (their write may wait behind a local
        tool's step, which holds a one-writer store's lock)."""
        self._accepted = asyncio.Event()
        self._accepted.set()
        self._unwatch = ctx.store.watch(self.key, self._on_change)

    @contextlib.contextmanager
    def accepting(self) -> Iterator[None]:
        """A joining entry of this session is being accepted here: the running turn's next
        model-call boundary waits for its write to end, then looks for it."""
        self._accepting += 1
        self._accepted.clear()
        try:
            yield
        finally:
            self._accepting -= 1
            self._may_join = True
            if not self._accepting:
                self._accepted.set()

    async def join(self, turn: ChainEntry) -> None:
        """The running ``turn``'s model-call boundary: join it the queued joining entries
        after it (each its own transaction), if the chain may hold any."""
        await self._accepted.wait()
        if not self._may_join:
            return
        self._may_join = False
        ctx, engine = self._ctx, self._engine
        assert engine is not None
        pending = await ctx.store.entries(self.key, unfinished=True)
        for e in joiners(pending, turn, ctx.commands.joins):
            command = cast(JoiningCommand, ctx.commands.command_of(e))
            result = await command.join(Join(e, turn, engine.commits))
            log.debug("%s %s joined turn %s of %s", e.kind, e.turn_id, turn.turn_id, self.key)
            ctx.finished(self.key, result)

    def interrupt(self, turn_ids: Iterable[str], reason: str) -> None:
        """These turns were asked to cancel: flag them and stop the one that streams."""
        engine = self._engine
        for t in turn_ids:
            self._cancels.setdefault(t, reason)
            if engine is not None:
                engine.interrupt(t)

    def interrupt_running(self, reason: str) -> None:
        """The turn under way was superseded (replace, reset)."""
        engine = self._engine
        if engine is not None and engine.turn_id is not None:
            self.interrupt([engine.turn_id], reason)

    def close(self) -> None:
        """Stop listening for the session's changes; a turn under way pauses (its trace's
        stretch ends). The lease is its owner's to release."""
        self._unwatch()
        for t in list(self._tasks):
            t.cancel()
        if self._engine is not None:
            self._engine.pause()

    async def step(self, attempt: int | None = None) -> ChainState:
        """Run the chain's next step, and say what is left of the chain.

        A step is a model call, a tool call (a parallel batch is one) or a command; a
        turn's opening goes with its first step.

        Args:
            attempt: the one attempt of a model call or remote tool to run (a scheduler
                that retries steps itself); ``None``: every attempt runs within the step.

        Raises:
            RetryStep: ``attempt`` failed and its policy retries it; nothing was written.
        """
        ctx, key = self._ctx, self.key
        engine = self._engine
        if engine is None:
            transcript = await ctx.transcripts.load(ctx.store, self.lease)
            engine = self._engine = TurnEngine(ctx, self.lease, transcript, self._cancels.get)
            engine.before_model = self.join
        engine.attempt = attempt
        entry, pending = self._entry, self._pending
        if entry is None:
            if pending is None:
                pending = await ctx.store.entries(key, unfinished=True)
            self._pending = self._parked = None
            entries = runnable(pending, ctx.commands.joins)
            if not entries:
                return chain_state(pending, engine.transcript, ctx.commands.joins)
            for t in pending:
                if t.cancel is not None:
                    self._cancels.setdefault(t.turn_id, t.cancel)
            entry = entries[0]
            if entry.kind == "turn" and entry.status == TurnStatus.SUSPENDED \
                    and entry.cancel is not None:
                # A cancel withdrew the park (parent-close policy): the children it waits
                # on are cancelled first, then the turn ends.
                await cancel_children(ctx.sessions, entry, entry.cancel)
        if entry.kind == "turn":
            self._entry = None
            result = await engine.step(entry)
            if result is None:
                assert pending is not None
                self._entry, self._pending = entry, pending
                return self._going_on(pending, engine.transcript)
        else:
            assert pending is not None
            result = await self._apply(engine, Place(
                entry, pending, engine.commits, self._find, ctx.sessions,
                lambda r: ctx.finished(key, r)))
        self._cancels.pop(entry.turn_id, None)
        log.debug("%s %s of %s: %s", entry.kind, entry.turn_id, key, result.status)
        ctx.finished(key, result)
        # The chain as the next step finds it (a step of this lease reads it once an entry
        # ended, never at each step).
        pending = self._pending = await ctx.store.entries(key, unfinished=True)
        return chain_state(pending, engine.transcript, ctx.commands.joins)

    def _going_on(self, pending: list[ChainEntry], transcript: list[Message]) -> ChainState:
        """The chain's state while its turn goes on: the next step is the turn's."""
        parked = self._parked
        if parked is None:
            parked = self._parked = any(t.parked for t in pending)
        _, owed = owed_calls(transcript)
        if owed:
            return ChainState(True, parked, "tool", tuple(c.name for c in owed))
        return ChainState(True, parked, "model")

    async def _find(self, turn_id: str) -> ChainEntry | None:
        found = await self._ctx.store.entries(self.key, turn_id=turn_id)
        return found[0] if found else None

    async def _apply(self, engine: TurnEngine, at: Place) -> TurnResult:
        ctx = self._ctx
        result = await ctx.commands.command_of(at.entry).apply(at)
        # A command may have started a generation (a reset): the cache keeps the log's.
        ctx.transcripts.keep(self.key, self.lease.generation, engine.transcript)
        return result

    # -- cancels from other processes ------------------------------------------------------

    def _on_change(self, events: list[TurnEvent] | None) -> None:
        if events is not None:
            return  # our own commits
        self._may_join = True
        if self._checking:
            self._check_again = True
            return
        engine = self._engine
        if engine is None or engine.turn_id is None:
            return
        self._checking = True
        task = asyncio.create_task(self._check_cancel(self.lease, engine.turn_id))
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


__all__ = ["ChainState", "SessionDriver", "chain_state", "runnable"]
