"""``AgentSession``: one conversation of one agent — start turns, watch them, answer their
questions, cancel or reset them (F5 to F8) — and what those calls return."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .agent import Agent, AuthorizeAnswer
from .errors import (
    ConfigurationError,
    DurableTurnsError,
    ResumeAuthorizationError,
    ResumeConflictError,
    TurnSuspendedError,
    UnknownTurnError,
)
from .events import TurnEvent, decode_event
from .hitl import (
    Grant,
    InputRequest,
    check_answerer,
    input_step_id,
    sign,
    validate_answer,
)
from .inbound import InboundEvent, Trigger
from .messages import Message
from .stores import FINAL, SessionKey, TurnRecord, TurnUpdate

if TYPE_CHECKING:
    from .runtime import Observer, Runtime


@dataclass(frozen=True, slots=True)
class StartedTurn:
    """What ``start()`` returns: the turn is durable and queued."""

    turn_id: str
    new: bool = True
    """False when the turn id was already accepted (a redelivery)."""


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How a turn ended (or where it parked)."""

    turn_id: str
    status: Literal["completed", "suspended", "failed", "cancelled"]
    text: str | None = None
    request: Any = None
    error: str | None = None
    reason: str | None = None


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
    steps: dict[str, str]


def _result(rec: TurnRecord) -> TurnResult:
    request = InputRequest.from_dict(rec.request) if rec.request else None
    return TurnResult(rec.turn_id, rec.status, rec.text, request,  # type: ignore[arg-type]
                      rec.error, rec.reason)


class AgentSession:
    """One conversation of one agent: start turns, watch them, read their results."""

    def __init__(self, runtime: Runtime, key: SessionKey) -> None:
        self.runtime = runtime
        self.key = key

    @property
    def agent(self) -> Agent:
        return self.runtime.agents[self.key.agent]

    async def start(
        self,
        user_text: str | None = None,
        *,
        turn_id: str | None = None,
        event: InboundEvent | None = None,
        trigger: Trigger | None = None,
        replace: bool = False,
    ) -> StartedTurn:
        """Accept a turn and return once it is durable, without waiting for it to run.

        Delivering a turn id the session already has is a redelivery: nothing is appended
        twice, and an unfinished turn is driven again from where it stopped.

        Raises:
            SessionBusyError: the session is parked on another turn.
            ValueError: no text to open the turn with.
        """
        rt = self.runtime
        await rt.open()
        rt.model_for(self.agent)  # fail now, not in the background, when there is no model
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
        supersede = f"superseded by turn {turn_id}" if replace else None
        rec, new = await rt.store.enqueue_turn(
            self.key, turn_id, opening, event.to_dict() if event else None, policy,
            supersede=supersede,
        )
        if new and replace:
            rt._interrupt_running(self.key)
        if rec.status not in FINAL:
            rt._kick(self.key)
        return StartedTurn(turn_id, new)

    async def cancel(self, turn_id: str | None = None, *,
                     reason: str = "cancelled by request") -> list[str]:
        """Ask for a turn (or every unfinished turn) to be cancelled; returns at once.

        The request is durable: it takes effect at the turn's next checkpoint boundary, in
        this process or another, and survives a crash. What committed stays committed.
        Cancelling a turn that already ended is a no-op (an empty list); a parked turn is
        not cancelled (answer it, or reset the session).

        Returns:
            The ids of the turns that got the request.

        Raises:
            UnknownTurnError: the session has no turn ``turn_id``.
        """
        rt = self.runtime
        await rt.open()
        if turn_id is not None and await rt.store.get_turn(self.key, turn_id) is None:
            raise UnknownTurnError(str(self.key), turn_id)
        ids = await rt.store.request_cancel(self.key, turn_id, reason)
        rt._interrupt(self.key, ids)
        return ids

    async def reset(self) -> ResetResult:
        """Retire the session's history, keeping its address (F8).

        Cancels its unfinished turns (reason ``reset``); then, in order on the turn chain,
        archives the messages and steps under the current generation, cancels a stale park
        and sets the status to ``new``. Turns started meanwhile queue behind the reset.
        A session that never existed is reset all the same (generation 0 → 1).
        """
        rt = self.runtime
        await rt.open()
        entry = f"reset:{uuid.uuid4().hex}"
        opening = Message("trigger", "reset", turn_id=entry, by="reset")
        await rt.store.enqueue_turn(self.key, entry, opening, kind="reset")
        rt._interrupt_running(self.key)
        rt._kick(self.key)
        done = await self.result(entry)
        return ResetResult(**json.loads(done.text or "{}"))

    async def archive(self, generation: int) -> Archive:
        """The messages and steps of a generation (an archived one, or the live one)."""
        await self.runtime.open()
        store = self.runtime.store
        return Archive(generation, await store.read_messages(self.key, generation=generation),
                       await store.read_steps(self.key, generation))

    async def result(self, turn_id: str) -> TurnResult:
        """Wait until the turn completes, fails, is cancelled or parks.

        Raises:
            UnknownTurnError: the session has no such turn.
        """
        rt = self.runtime
        await rt.open()
        loop = asyncio.get_running_loop()
        while True:
            fut: asyncio.Future[TurnResult | None] = loop.create_future()
            waiters = rt._waiters.setdefault((self.key, turn_id), [])
            waiters.append(fut)
            try:
                rec = await rt.store.get_turn(self.key, turn_id)
                if rec is None:
                    raise UnknownTurnError(str(self.key), turn_id)
                if rec.status in FINAL or rec.status == "suspended":
                    return _result(rec)
                failure = rt._failures.get(self.key)
                if failure is not None and self.key not in rt._pumps:
                    raise DurableTurnsError(
                        f"driving session {self.key} failed, turn {turn_id!r} is unfinished "
                        f"(Runtime.recover() retries it): {type(failure).__name__}: {failure}"
                    ) from failure
                # Woken by our own pump; the timeout catches a turn driven elsewhere.
                await asyncio.wait([fut], timeout=rt.poll_interval)
                if fut.done() and (known := fut.result()) is not None:
                    return known
            finally:
                if fut in waiters:
                    waiters.remove(fut)
                if not waiters:
                    rt._waiters.pop((self.key, turn_id), None)

    async def turn(self, user_text: str | None = None, **kw: Any) -> TurnResult:
        """Start a turn and wait for its end. Non-interactive.

        Raises:
            TurnSuspendedError: the turn parked waiting for input.
        """
        started = await self.start(user_text, **kw)
        res = await self.result(started.turn_id)
        if res.status == "suspended":
            raise TurnSuspendedError(res.turn_id, res.request)
        return res

    def observe(self, cb: Observer, *, turn_id: str | None = None,
                replay: bool = False) -> Callable[[], None]:
        """Call ``cb`` with each event of the session (or of one turn) this runtime drives.

        May be called before ``start()`` with the turn id that will be passed to it, so no
        event is missed. With ``replay=True`` the logged events come first, then live ones,
        with no gap and no duplicate. Returns a function that unsubscribes.
        """
        rt = self.runtime
        observers = rt._observers.setdefault(self.key, [])
        if not replay:
            entry: tuple[str | None, Observer] = (turn_id, cb)
        else:
            buffered: list[TurnEvent] = []
            live = False

            def gate(e: TurnEvent) -> None:
                if live:
                    cb(e)
                else:
                    buffered.append(e)

            async def catch_up() -> None:
                nonlocal live
                last = 0
                try:
                    await rt.open()
                    for r in await rt.store.read_events(self.key, turn_id=turn_id):
                        last = r.seq
                        cb(decode_event(self.key.agent, self.key.session, r))
                finally:
                    for e in buffered:
                        # A delta carries the seq of the durable event before it.
                        if e.seq > last or (e.type == "message.delta" and e.seq >= last):
                            cb(e)
                    live = True

            entry = (turn_id, gate)
            task = asyncio.get_running_loop().create_task(catch_up())
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
        observers.append(entry)

        def unsubscribe() -> None:
            if entry in observers:
                observers.remove(entry)
            if not observers:
                rt._observers.pop(self.key, None)

        return unsubscribe

    async def pending(self) -> InputRequest | None:
        """The input request the session is parked on, or ``None``."""
        await self.runtime.open()
        for t in await self.runtime.store.turns(self.key, unfinished=True):
            if t.status == "suspended" and t.request:
                return InputRequest.from_dict(t.request)
        return None

    async def resume(self, turn_id: str, input_id: str, value: Any, *, by: str | None = None,
                     granted: Grant | None = None) -> None:
        """Answer the parked turn's input request and replay the turn (F6).

        The answer is stored as step ``input:<turn_id>:<input_id>``; the parked tool runs
        again from the top and its ``request_input`` returns ``value``.

        Args:
            by: the resumer's *verified* identity (e.g. a signature-checked Slack user id).
            granted: for a ``{policy, scope}`` request, the grant from :func:`grant_answer`.

        Raises:
            ResumeConflictError: wrong turn, wrong input id, not parked, or a reset pending.
            ResumeAuthorizationError: the resumer may not answer this request.
            InvalidInputError: ``value`` does not fit the request's schema.
        """
        rt = self.runtime
        await rt.open()
        lease = await rt.store.acquire(self.key, timeout=rt.lease_timeout)
        try:
            request = await self._parked_on(turn_id, input_id)
            check_answerer(request, str(self.key), by, granted, rt.secret)
            validate_answer(request, value)
            answer = json.dumps({"value": value, "by": by}, separators=(",", ":"))
            async with lease.transaction() as tx:
                tx.add_step(input_step_id(turn_id, input_id), turn_id, answer)
                tx.set_turn(turn_id, TurnUpdate("running"))
                tx.set_status("running")
        finally:
            await lease.release()
        rt._kick(self.key)

    async def _parked_on(self, turn_id: str, input_id: str) -> InputRequest:
        turns = await self.runtime.store.turns(self.key, unfinished=True)
        if any(t.kind == "reset" for t in turns):
            raise ResumeConflictError(
                f"a reset of session {self.key} is pending; its park is being archived"
            )
        parked = next((t for t in turns if t.status == "suspended"), None)
        if parked is None or parked.request is None:
            raise ResumeConflictError(f"session {self.key} is not waiting for input")
        if parked.turn_id != turn_id:
            raise ResumeConflictError(
                f"session {self.key} is parked on turn {parked.turn_id!r}, not {turn_id!r}"
            )
        request = InputRequest.from_dict(parked.request)
        if request.id != input_id:
            raise ResumeConflictError(
                f"turn {turn_id!r} waits for input {request.id!r}, not {input_id!r}"
            )
        return request

    async def transcript(self) -> list[Message]:
        """The session's message log (the live generation)."""
        await self.runtime.open()
        return await self.runtime.store.read_messages(self.key)

    async def status(self) -> str:
        """``new``, ``idle``, ``running`` or ``suspended``."""
        await self.runtime.open()
        info = await self.runtime.store.session_info(self.key)
        return info.status if info else "new"

    async def events(self, after_seq: int = 0) -> list[TurnEvent]:
        """The session's logged events after ``after_seq`` (every type but deltas)."""
        await self.runtime.open()
        records = await self.runtime.store.read_events(self.key, after_seq=after_seq)
        return [decode_event(self.key.agent, self.key.session, r) for r in records]


async def grant_answer(
    session: AgentSession,
    resume: Mapping[str, Any],
    authorize_answer: AuthorizeAnswer | None = None,
) -> Grant:
    """Ask the app whether this resumer may answer a ``{policy, scope}`` request (F6).

    Args:
        session: the parked session.
        resume: ``turn_id``, ``input_id``, ``by`` and ``principal`` of the resume.
        authorize_answer: the decision; defaults to the agent's ``authorize_answer``.

    Returns:
        A grant to pass to ``resume(granted=…)``; it is signed and good for exactly that
        request, policy, scope and resumer.

    Raises:
        ResumeConflictError: the session is not parked on that request.
        ResumeAuthorizationError: the request is not policy-restricted, or the app said no.
        Exception: whatever ``authorize_answer`` raised; nothing was applied, retry later.
    """
    await session.runtime.open()
    request = await session._parked_on(resume["turn_id"], resume["input_id"])
    who = request.answerers or {}
    if "policy" not in who:
        raise ResumeAuthorizationError(
            f"{request.id!r} is not answered under a policy; resume it with by=… instead"
        )
    decide = authorize_answer or session.agent.authorize_answer
    if decide is None:
        raise ConfigurationError(
            f"agent {session.agent.name!r} has no authorize_answer to decide policy "
            f"{who['policy']!r}"
        )
    by = resume.get("by")
    ok = await decide({"policy": who["policy"], "scope": who.get("scope"), "by": by,
                       "principal": resume.get("principal")})
    if ok is not True:
        raise ResumeAuthorizationError(
            f"{by!r} may not answer {request.id!r} under policy {who['policy']!r}"
        )
    grant = Grant(str(session.key), request.turn_id, request.id, who["policy"],
                  who.get("scope"), by)
    return sign(grant, session.runtime.secret)
