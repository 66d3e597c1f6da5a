"""``AgentSession``: one conversation of one agent — start turns, watch them, answer their
questions, cancel, retry or reset them (F5 to F8) — and what those calls return.

A façade: every call is one or two of the runtime's public methods (``accept``, ``wait``,
``subscribe``, ``interrupt``), a read of the session, or a command of ``commands/``,
whose checks it runs before accepting it. It depends on the runtime through
:class:`RuntimeAPI` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ._forks import plan_fork
from ._grants import decided, grant_answer
from ._hitl import Grant, check_answerer, validate_answer
from ._queries import summary_of
from .agent import Agent
from .commands import (
    RESET,
    Cancel,
    ChainCommand,
    Registry,
    Reset,
    Resume,
    Retry,
    joined_turn,
    latest_turn,
    live_turns,
    steer_entry,
)
from .compaction import latest_compaction, request_view
from .engine._output import OUTPUT_RETRIES, as_model, output_data
from .errors import (
    ConfigurationError,
    ResumeConflictError,
    TurnConflictError,
    TurnSuspendedError,
)
from .events import TurnEvent, TurnFailed
from .history import Checkpoint
from .inbound import InboundEvent, Trigger
from .limits import LIMITS, Limits
from .messages import Message
from .model import Model, ModelRequest
from .records import (
    ChainEntry,
    InputRequest,
    NewEntry,
    SessionKey,
    SessionSummary,
    StepRecord,
    TurnResult,
    TurnStatus,
)
from .stores import SessionStore, Subscription


class RuntimeAPI(Protocol):
    """What an :class:`AgentSession` uses of its runtime (``Runtime`` is one)."""

    agents: dict[str, Agent]
    store: SessionStore
    model: Model | None
    secret: bytes
    commands: Registry

    @property
    def steps_here(self) -> bool: ...

    def require_open(self) -> None: ...

    async def accept(self, key: SessionKey, entry: NewEntry) -> tuple[ChainEntry, bool]: ...

    def joining(self, key: SessionKey) -> contextlib.AbstractContextManager[None]: ...

    async def wait(self, key: SessionKey, turn_id: str, *,
                   timeout: float | None = None) -> TurnResult: ...

    def subscribe(self, key: SessionKey, after_seq: int | None = None, *,
                  deltas: bool = True) -> Subscription: ...

    async def interrupt(self, key: SessionKey, turn_id: str | None = None, *,
                        reason: str = ...) -> list[str]: ...

    async def drive_session(self, key: SessionKey) -> None: ...

    def session(self, agent: str, session_id: str) -> AgentSession: ...


log = logging.getLogger("durable_turns")
Observer = Callable[[TurnEvent], None]
Mode = Literal["queue", "replace", "steer"]
"""How ``start()`` places a turn: behind the unfinished ones, instead of them (they are
cancelled), or into the running one (its next model call reads it, F25)."""
MODES: tuple[Mode, ...] = ("queue", "replace", "steer")


@dataclass(frozen=True, slots=True)
class StartedTurn:
    """What ``start()`` returns: the turn is durable and queued."""

    turn_id: str
    new: bool = True
    """False when the turn id was already accepted (a redelivery)."""
    steering: str | None = None
    """``start(mode="steer")`` accepted the text as a steer: the unfinished turn it joins
    (``result(turn_id)`` waits for the turn it went into)."""


@dataclass(frozen=True, slots=True)
class ResetResult:
    """What ``reset()`` returns: the archived address and the new generation."""

    previous_session: str
    """``<session>#g<archived generation>``."""
    generation: int


@dataclass(frozen=True, slots=True)
class Archive:
    """One generation of a session's log."""

    generation: int
    messages: list[Message]
    steps: dict[str, StepRecord]


class AgentSession:
    """One conversation of one agent: start turns, watch them, read their results."""

    def __init__(self, runtime: RuntimeAPI, key: SessionKey) -> None:
        self.runtime = runtime
        self.key = key

    @property
    def agent(self) -> Agent:
        return self.runtime.agents[self.key.agent]

    @property
    def _store(self) -> SessionStore:
        """The runtime's store, once the runtime is open (``Runtime.require_open``)."""
        self.runtime.require_open()
        return self.runtime.store

    async def start(
        self,
        user_text: str | None = None,
        *,
        turn_id: str | None = None,
        event: InboundEvent | None = None,
        trigger: Trigger | None = None,
        replace: bool = False,
        deliver: str | None = None,
        data: Mapping[str, Any] | None = None,
        mode: Mode = "queue",
        limits: Limits | None = None,
        output: Any = None,
        output_retries: int = OUTPUT_RETRIES,
    ) -> StartedTurn:
        """Accept a turn and return once it is durable, without waiting for it to run.

        Delivering a turn id the session already has is a redelivery: nothing is appended
        twice, and an unfinished turn is driven again from where it stopped.

        Args:
            mode: ``queue`` (behind the session's unfinished turns), ``replace`` (they are
                cancelled first; ``replace=True`` says the same) or ``steer``: while a turn
                is unfinished the text is stored at once and joins it as a user message at
                its next model-call boundary (event ``message.steered``; ``result()`` of the
                returned id is that turn's), else it starts a turn.
            limits: this turn's caps on its spend, instead of its agent's
                (``durable_turns.limits``, F25).
            output: a pydantic model class or a JSON schema (a dict) the final answer must
                match (F25): its validated value is ``TurnResult.output``; an invalid answer
                goes back to the model with the validation error up to ``output_retries``
                times, then the turn fails with ``OutputInvalid``.
            deliver: the channel (by name) that owes this turn a delivery: the turn stays in
                ``runtime.queries.owed_deliveries(channel)`` until the channel calls
                :meth:`settle_delivery` (its durable outbox, what it recovers after a crash).
            data: names of the turn's data to set with it, in the same write (a redelivery
                leaves the stored ones as they are: read them with :meth:`entry`).

        Raises:
            SessionBusyError: the session is parked on another turn.
            ValueError: no text to open the turn with, an unknown ``mode``, ``steer`` with
                ``replace=True``, or an ``output`` that is no valid schema.
        """
        if limits is not None:
            data = {**(data or {}), LIMITS: limits.to_dict()}
        if output is not None:
            data = {**(data or {}), **output_data(output, output_retries)}
        if mode not in MODES or (replace and mode == "steer"):
            raise ValueError(f"mode must be 'queue', 'replace' or 'steer', not {mode!r}"
                             + (" with replace=True" if replace else ""))
        replace = replace or mode == "replace"
        text = user_text if user_text is not None else (event.text if event else None)
        if not isinstance(text, str) or not text.strip():
            raise ValueError("a turn needs non-empty text (user_text=…, or event.text)")
        turn_id = turn_id or uuid.uuid4().hex
        if trigger is not None:
            opening = Message("trigger", text, turn_id=turn_id, by=trigger.by)
        else:
            by = event.user.id if event and event.user else None
            opening = Message("user", text, turn_id=turn_id, by=by)
        policy = None
        if event is not None and event.source in self.agent.surfaces:
            policy = self.agent.surfaces[event.source].to_dict()
        entry = NewEntry(
            turn_id, opening, event=event.to_dict() if event else None, policy=policy,
            supersede=f"superseded by turn {turn_id}" if replace else None, deliver=deliver,
            data=dict(data) if data else None,
        )
        into = None
        with self.runtime.joining(self.key) if mode == "steer" else contextlib.nullcontext():
            if mode == "steer":  # (a turn driven here waits for it at its next model call)
                entry, into = await steer_entry(self._store, self.key, entry)
            _rec, new = await self.runtime.accept(self.key, entry)
        return StartedTurn(turn_id, new, into)

    async def retry(self, turn_id: str) -> StartedTurn:
        """Re-open a failed turn where it failed; finished steps stay (F2).

        A turn that failed because its model could not be reached, after its retries, runs on
        from its failed model call. (A turn that failed in a tool answered that call with the
        failure; the model is asked again with that answer.) Wait for it with ``result()``.

        Raises:
            UnknownTurnError: the session has no such turn.
            TurnConflictError: the turn did not fail, or a later turn ran after it.
        """
        rt = self.runtime
        target = await self.entry(turn_id)
        Retry(turn_id).check(self.key, target, latest_turn(await self.transcript()))
        # One retry per failure: asked twice before it runs, it is one retry.
        failures = [e.seq for e in await self.events() if e.turn_id == turn_id
                    and isinstance(e, TurnFailed)]
        retry = Retry(turn_id, max(failures, default=0))
        await rt.accept(self.key, retry.entry())
        if rt.steps_here:
            done = await rt.wait(self.key, retry.entry_id)
            if done.status == TurnStatus.FAILED:
                raise TurnConflictError(done.error or "the turn cannot be retried",
                                        session=str(self.key), turn_id=turn_id)
        return StartedTurn(turn_id, new=False)

    async def send(self, command: ChainCommand) -> StartedTurn:
        """Queue a command on the session's chain: durable when this returns, applied by the
        session's driver at its place (wait for its end with ``result(command.entry_id)``).

        Raises:
            ConfigurationError: the runtime's registry has no command of its kind
                (``Runtime(commands=COMMANDS.with_(…))`` registers one).
        """
        if not self.runtime.commands.queues(command.kind):
            raise ConfigurationError(f"the runtime knows no command of kind {command.kind!r}; "
                                     "register it: Runtime(commands=COMMANDS.with_(…))")
        _rec, new = await self.runtime.accept(self.key, command.entry())
        return StartedTurn(command.entry_id, new)

    async def cancel(self, turn_id: str | None = None, *,
                     reason: str = "cancelled by request") -> list[str]:
        """Ask for a turn (or every unfinished turn) to be cancelled; returns at once.

        The request is durable: it takes effect at the turn's next checkpoint boundary, in
        this process or another, and survives a crash. What committed stays committed.
        Cancelling a turn that already ended is a no-op (an empty list). A parked turn's
        request is withdrawn at once (nobody can answer it any more) and the turn ends
        ``cancelled``, its owed calls answered ``{"cancelled": true}``; a subagent's turn it
        waits on is cancelled with it.

        Returns:
            The ids of the turns that got the request.

        Raises:
            UnknownTurnError: the session has no turn ``turn_id``.
        """
        cancel = Cancel(turn_id, reason)
        cancel.check(self.key, None if turn_id is None else await self.entry(turn_id))
        return await self.runtime.interrupt(self.key, turn_id, reason=reason)

    async def reset(self) -> ResetResult:
        """Retire the session's history, keeping its address (F8).

        Cancels its unfinished turns (reason ``reset``); then, in order on the turn chain,
        archives the messages and steps under the current generation, cancels a stale park
        and sets the status to ``new``. Turns started meanwhile queue behind the reset.
        A session that never existed is reset all the same (generation 0 → 1).
        """
        reset = Reset()
        await self.runtime.accept(self.key, reset.entry())
        await self.runtime.wait(self.key, reset.entry_id)
        done = await self.entry(reset.entry_id)
        assert done is not None
        archived = int(((done.data or {}).get(RESET) or {}).get("archived", 0))
        return ResetResult(f"{self.key.session}#g{archived}", archived + 1)

    async def archive(self, generation: int) -> Archive:
        """The messages and steps of a generation (an archived one, or the live one)."""
        store = self._store
        return Archive(generation, await store.read_messages(self.key, generation=generation),
                       await store.read_steps(self.key, generation=generation))

    async def result(self, turn_id: str, *, timeout: float | None = None) -> TurnResult:
        """Wait until the turn completes, fails, is cancelled or parks.

        A steer's id (``start(mode="steer")``) waits for the turn it went into.

        Raises:
            UnknownTurnError: the session has no such turn.
            TimeoutError: it did not end within ``timeout`` seconds.
        """
        res = await self.runtime.wait(self.key, turn_id, timeout=timeout)
        if res.status == TurnStatus.COMPLETED and res.text is None:  # a command's end
            rec = await self.entry(turn_id)
            into = joined_turn(rec) if rec is not None else None
            if into is not None:
                return await self.runtime.wait(self.key, into, timeout=timeout)
        return res

    async def turn(self, user_text: str | None = None, **kw: Any) -> TurnResult:
        """Start a turn and wait for its end. Non-interactive.

        With ``output=`` a pydantic model class, ``TurnResult.output`` is an instance of it.

        Raises:
            TurnSuspendedError: the turn parked waiting for input.
        """
        started = await self.start(user_text, **kw)
        res = await self.result(started.turn_id)
        if res.status == TurnStatus.SUSPENDED:
            raise TurnSuspendedError(res.turn_id, res.request, str(self.key))
        return as_model(res, kw.get("output"))

    def observe(self, cb: Observer, *, turn_id: str | None = None,
                replay: bool = False) -> Callable[[], None]:
        """Call ``cb`` with each event of the session (or of one turn), whichever process
        drives it; live text (``message.delta``) comes from turns this runtime drives.

        May be called before ``start()`` with the turn id that will be passed to it, so no
        event is missed. With ``replay=True`` the logged events come first, then live ones,
        with no gap and no duplicate. Returns a function that unsubscribes.
        """
        sub = self.runtime.subscribe(self.key, 0 if replay else None)

        def deliver(e: TurnEvent) -> None:
            if turn_id is None or e.turn_id == turn_id:
                cb(e)

        sub.deliver_to(deliver)

        async def start() -> None:
            await sub.ready()  # fixes the cursor; with replay, hands over the stored events

        task = asyncio.get_running_loop().create_task(start())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return sub.close

    async def pending(self) -> InputRequest | None:
        """The input request the session is parked on, or ``None``.

        When several calls of a parallel batch parked at once, the first is returned and
        :attr:`InputRequest.more` lists the others (each is answered on its own); a
        subagent's request carries ``child``.
        """
        return (await self.summary()).pending

    async def resume(self, turn_id: str, input_id: str, value: Any, *, by: str | None = None,
                     granted: Grant | None = None, authorize: bool = False,
                     principal: Any = None) -> None:
        """Answer the parked turn's input request and set the turn going again (F6).

        The answer is stored as step ``input:<turn_id>:<input_id>`` (a command on the chain,
        so it keeps its place) before this returns; the parked tool then runs again from the
        top and its ``request_input`` returns ``value``. The same answer given again by the
        same resumer is accepted once (a double click is one answer).

        Args:
            by: the resumer's *verified* identity (e.g. a signature-checked Slack user id).
            granted: for a ``{policy, scope}`` request, the grant from :func:`grant_answer`.
            authorize: instead of ``granted``: for a ``{policy, scope}`` request, ask the
                agent's ``authorize_answer`` here (as :func:`grant_answer` does), with
                ``principal`` (what a host's ``authenticate`` returned for the resumer).

        Raises:
            ResumeConflictError: wrong turn, wrong input id, not parked, a reset pending, or
                another answer was given already.
            ResumeAuthorizationError: the resumer may not answer this request.
            AuthorizeAnswerError: the app's ``authorize_answer`` failed; nothing was applied.
            InvalidInputError: ``value`` does not fit the request's schema.
        """
        rt = self.runtime
        # When it was answered: a turn's timeline shows the wait.
        resume = Resume(turn_id, input_id, value, by, time.time())
        earlier = await self.entry(resume.entry_id)
        if earlier is not None:
            return await self._repeated(earlier, resume)
        request = resume.request(self.key, await self._pending())
        if request.sleep:
            raise ResumeConflictError(
                f"turn {turn_id!r} sleeps until {request.expires}; only the clock wakes it",
                session=str(self.key), turn_id=turn_id, input_id=input_id)
        if granted is None and authorize and "policy" in (request.answerers or {}):
            granted = await decided(self, request, by, principal)
        if request.child is not None:
            # A subagent asked: the answer goes to the exact child, which enforces its own
            # answerer rules and schema (F13); then this turn goes on and re-attaches.
            c = request.child
            await rt.session(c["agent"], c["session"]).resume(
                c["turn_id"], c["input_id"], value, by=by, granted=granted)
        else:
            check_answerer(request, str(self.key), by, granted, rt.secret)
            validate_answer(request, value)
        rec, new = await rt.accept(self.key, resume.entry())
        if not new:
            return await self._repeated(rec, resume)
        self._applied(await rt.wait(self.key, resume.entry_id), resume)

    async def _repeated(self, rec: ChainEntry, resume: Resume) -> None:
        given = Resume.from_entry(rec)
        if not given.same_answer(resume):
            # Say what differs: a double click is one answer only from the same person.
            differs = ("with the same answer" if given.value == resume.value
                       else "with another answer than this one")
            raise ResumeConflictError(
                f"input {resume.input_id!r} of turn {resume.turn_id!r} was answered "
                f"already by {given.by!r} ({json.dumps(given.value)}), {differs}",
                session=str(self.key), turn_id=resume.turn_id, input_id=resume.input_id,
            )
        self._applied(await self.runtime.wait(self.key, rec.turn_id), resume)

    def _applied(self, result: TurnResult, resume: Resume) -> None:
        """Raise if the driver refused the answer (the park changed before its turn came)."""
        if result.status == TurnStatus.FAILED:
            raise ResumeConflictError(
                result.error or "the answer was refused", session=str(self.key),
                turn_id=resume.turn_id, input_id=resume.input_id,
            )

    async def _pending(self) -> list[ChainEntry]:
        """The session's unfinished chain entries."""
        return await self._store.entries(self.key, unfinished=True)

    async def summary(self) -> SessionSummary:
        """Where the session stands: status, generation, the request it is parked on
        (``exists=False`` while the store does not have it)."""
        return await summary_of(self._store, self.key)

    async def chain(self) -> list[ChainEntry]:
        """Every entry of the session's chain in order: its turns and the commands that ran
        in their place (resets, answers, retries), with how each ended."""
        return await self._store.entries(self.key)

    async def turns(self) -> list[ChainEntry]:
        """The turns of the live generation, in order: the chain's turns since the last reset
        that ran (the archived ones stay readable through :meth:`archive`)."""
        return live_turns(await self.chain())

    async def entry(self, turn_id: str) -> ChainEntry | None:
        """The chain entry ``turn_id`` (a turn or a command), or ``None``."""
        found = await self._store.entries(self.key, turn_id=turn_id)
        return found[0] if found else None

    async def set_turn_data(self, turn_id: str, name: str, value: Any, *,
                            only_new: bool = False) -> Any:
        """Keep ``value`` under ``name`` on a turn's entry (a channel's delivery state),
        leaving every other name as it is; with ``only_new``, only if ``name`` is not set yet
        (a compare-and-set). Durable at once; needs no lease, so it may be called while the
        turn runs anywhere.

        Returns:
            The value stored under ``name`` after the call (the earlier one when
            ``only_new`` found it set), or ``None`` when the session has no such entry.
        """
        return await self._store.set_turn_data(self.key, turn_id, name, value,
                                               only_new=only_new)

    async def settle_delivery(self, turn_id: str) -> bool:
        """The delivery a channel owed the turn is final (its end was delivered; a park is
        not final): it leaves ``runtime.queries.owed_deliveries``. Durable at once; needs no
        lease.

        Returns:
            Whether this call settled it (``False``: settled before, never owed, or no such
            turn).
        """
        return await self._store.settle_delivery(self.key, turn_id)

    async def history(self, *, generation: int | None = None) -> list[Checkpoint]:
        """Every checkpoint of the session in the order it committed — each turn's start,
        model replies, tool results, parks, answers, ends — across its generations (of one,
        if given): what :meth:`fork` can start from. A :class:`~durable_turns.history.
        Checkpoint` has its ``kind``, ``steps`` (id, kind, what each keeps), ``events``,
        ``generation``, place (``seq``, ``sub``) and ``at``."""
        return await self._store.checkpoints(self.key, generation=generation)

    async def fork(self, to: str, at: Checkpoint | None = None, *, then: str | None = None,
                   turn_id: str | None = None, event: InboundEvent | None = None,
                   owner: str | None = None) -> AgentSession:
        """A new session ``to`` (of this agent) whose transcript, steps and events are this
        session's up to checkpoint ``at`` (default: its last committed one, even while a turn
        runs), written in one transaction; nothing runs again and this session is untouched.

        Each turn is in the fork as it stood at ``at``: ended turns with their outcome, a
        parked one with its request (answerable in the fork, on its own), one under way
        queued and driven on from the checkpoint (by this runtime's scheduler: here, or by
        its workers). Subagent children the copied steps started are forked too, under ids
        derived from the fork. The fork is a new timeline: idempotency keys derive from the
        session, so a remote tool run after the fork point is a new effect.

        Args:
            to: the new session's id.
            at: a checkpoint of :meth:`history`.
            then: a turn to start in the fork at once (LangGraph's "edit state and
                continue"); only at a checkpoint where no turn is under way.
            turn_id: ``then``'s turn id (default: new); wait for it with ``result``.
            event: ``then``'s inbound event (who speaks).
            owner: who owns the fork (``SessionSummary.owner``; a host's caller), written in
                the fork's transaction.

        Returns:
            The fork.

        Raises:
            SessionExistsError: ``to`` exists already (or another owns it).
            LookupError: no such checkpoint (or none at all).
            ValueError: ``then`` at a checkpoint where a turn is under way, or an empty id.
        """
        rt = self.runtime
        rt.require_open()
        dst = SessionKey(self.key.agent, to) if to else None
        if dst is None:
            raise ValueError("a fork needs a session id")
        plans = await plan_fork(rt.store, self.key, dst, at)
        under_way = [t.turn_id for t in plans[-1].chain if t.status == TurnStatus.QUEUED]
        if then is not None and under_way:
            raise ValueError(f"turn {under_way[0]!r} is under way at that checkpoint: fork "
                             "at a turn's end to start another turn with then=…")
        if owner is not None:
            plans[-1] = dataclasses.replace(plans[-1], owner=owner)
        await rt.store.fork(plans)
        forked = rt.session(dst.agent, dst.session)
        if under_way:
            await rt.drive_session(dst)  # it goes on from the checkpoint, as a redelivery would
        if then is not None:
            await forked.start(then, turn_id=turn_id, event=event)
        return forked

    async def transcript(self) -> list[Message]:
        """The session's message log (the live generation)."""
        return await self._store.read_messages(self.key)

    async def context(self) -> ModelRequest:
        """What the session's next model call would be sent as of its last compaction
        step (F23): the agent's system prompt and tools, the summary, the messages after
        it (older tool results cleared). Without ``Agent(context=…)``: the transcript."""
        store, agent = self._store, self.agent
        transcript = await store.read_messages(self.key)
        memo = None
        if agent.context is not None:
            _, memo = latest_compaction(await store.read_steps(self.key), transcript)
        return ModelRequest(system=agent.instructions,
                            messages=request_view(transcript, memo),
                            tools=[t.spec for t in agent.tools_by_name.values()])

    async def status(self) -> str:
        """``new``, ``idle``, ``running`` or ``suspended``."""
        return (await self.summary()).status

    async def events(self, after_seq: int = 0, *,
                     turn_id: str | None = None) -> list[TurnEvent]:
        """The session's logged events after ``after_seq`` (every type but deltas), in
        order; with ``turn_id``, only that turn's (the store reads only those)."""
        return await self._store.read_events(self.key, after_seq=after_seq,
                                             turn_id=turn_id)


__all__ = [
    "MODES",
    "AgentSession",
    "Archive",
    "Mode",
    "Observer",
    "ResetResult",
    "RuntimeAPI",
    "StartedTurn",
    "grant_answer",
]
