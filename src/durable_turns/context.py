"""What a tool's run receives beside its input: :class:`ToolContext`, and the narrow seams
behind it.

A tool step may do four things beyond its own work, each through :class:`StepServices`,
which the engine gives every remote call: ask a person (park the turn), see that its turn
was asked to cancel, checkpoint a record of durable work it starts, and carry that work's
events into its turn's stream. A subagent (``durable_turns.subagents``) is built on these
alone, plus :class:`Sessions`: the other sessions of the runtime the step runs in, through the
runtime's public API. Nothing of the engine or the runtime reaches a tool any other way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from .clock import utc
from .errors import ToolDeclarationError
from .events import TurnEvent
from .inbound import InboundEvent, User
from .records import ChainEntry, ChildMemo, ChildStepId, SessionKey, TurnResult

Watcher = Callable[[list[TurnEvent] | None], None]
"""Told of committed events of a session (a list), or that it may have changed (``None``)."""


class StoreHandle(Protocol):
    """The step transaction as a tool sees it."""

    def unwrap(self) -> Any:
        """The backend's raw handle, inside the step's transaction (``None`` in memory)."""
        ...


class Sessions(Protocol):
    """The other sessions of the runtime a step runs in, through its public API.

    ``Runtime.sessions`` is one; a tool reaches it as ``ctx.services.sessions``.
    """

    def agent_names(self) -> Collection[str]:
        """The agents whose sessions the runtime drives."""
        ...

    async def start(self, key: SessionKey, text: str, *, turn_id: str,
                    event: InboundEvent | None = None) -> None:
        """Accept a turn of session ``key`` (a redelivery if ``turn_id`` is known there)."""
        ...

    async def wait(self, key: SessionKey, turn_id: str, *,
                   timeout: float | None = None) -> TurnResult:
        """The turn's result once it ends or parks (``Runtime.wait``)."""
        ...

    async def interrupt(self, key: SessionKey, turn_id: str, *, reason: str) -> list[str]:
        """Ask the turn to cancel, durably (``Runtime.interrupt``)."""
        ...

    async def reset(self, key: SessionKey, entry_id: str) -> None:
        """Accept a reset of session ``key`` under this entry id (a redelivery if known)."""
        ...

    async def entry(self, key: SessionKey, turn_id: str) -> ChainEntry | None:
        """The chain entry ``turn_id`` of session ``key``, or ``None``."""
        ...

    async def events(self, key: SessionKey, *, after_seq: int = 0,
                     turn_id: str | None = None) -> list[TurnEvent]:
        """The session's logged events after ``after_seq`` (of one turn, if given)."""
        ...

    def watch(self, key: SessionKey, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher`` when the session may have changed; returns the unwatch."""
        ...

    def live(self, key: SessionKey, taker: Callable[[TurnEvent], None]) -> Callable[[], None]:
        """Hand ``taker`` the session's live events (text as it streams), from whichever
        process drives its turns; returns the function that stops it."""
        ...


class StepServices(Protocol):
    """What a remote tool's step offers it beyond its input (the engine makes one per call)."""

    @property
    def sessions(self) -> Sessions:
        """The runtime's other sessions."""
        ...

    async def ask(self, input_id: str, prompt: str, schema: Mapping[str, Any] | None,
                  answerers: Mapping[str, Any] | None, *,
                  timeout: float | timedelta | None = None, default: Any = None,
                  remind_every: float | timedelta | None = None) -> Any:
        """The answer to a request of this turn, if a person (or its deadline) gave it; else
        park the turn on it (raises the park signal). See :meth:`ToolContext.request_input`."""
        ...

    async def sleep(self, input_id: str, until: datetime) -> None:
        """Return if this sleep ended (or ``until`` has passed); else park the turn until
        ``until`` (raises the park signal). See :meth:`ToolContext.sleep`."""
        ...

    def cancel_reason(self) -> str | None:
        """Why this turn is being cancelled (or its batch is stopping), if it is."""
        ...

    def now(self) -> datetime:
        """The runtime's clock's time (what a sleep counts from)."""
        ...

    async def remember(self, step: ChildStepId, memo: ChildMemo) -> ChildMemo:
        """Checkpoint ``memo`` as ``step`` of this turn, unless a memo is recorded there
        already; returns the recorded one. Durable before it returns."""
        ...

    async def forward(self, events: list[TurnEvent]) -> None:
        """Log other work's events (each tagged with its ``child``) in this turn's stream,
        in one transaction."""
        ...

    def forward_live(self, event: TurnEvent) -> None:
        """Hand other work's live event (tagged with its ``child``) to this turn's live
        subscribers; never stored."""
        ...


@dataclass(slots=True)
class ToolContext:
    """What a tool's ``run`` receives beside its input."""

    agent: str
    session: str
    turn_id: str
    call_id: str
    step_id: str
    idempotency_key: str
    """Stable for this (session, turn, step) across replays: key remote side effects on it."""
    store: StoreHandle
    event: InboundEvent | None = None
    user: User | None = None
    services: StepServices | None = field(default=None, repr=False)
    """What the step offers a remote tool (``None`` for a local one): asking a person, its
    turn's cancel, durable child work (:class:`StepServices`)."""
    attempt: int = 1
    """Which attempt of this call this is (1-based): above 1 when ``Tool(retries=…)`` asked
    again; every attempt sees the same :attr:`idempotency_key`."""

    _sleeps: int = field(default=0, repr=False)

    def request_input(
        self,
        id: str,
        prompt: str,
        schema: Mapping[str, Any] | None = None,
        answerers: Mapping[str, Any] | None = None,
        *,
        timeout: float | timedelta | None = None,
        default: Any = None,
        remind_every: float | timedelta | None = None,
    ) -> Awaitable[Any]:
        """Ask a person; the first call parks the turn, the replay after ``resume()`` returns
        the answer (F6). The tool runs again from the top on resume: put side effects after
        this call.

        Args:
            id: stable within the turn; it keys the answer.
            prompt: what to ask.
            schema: a JSON schema the answer must fit.
            answerers: ``{"user": id}`` or ``{"policy": p, "scope": s}``; default: the
                turn's attested speaker.
            timeout: seconds (or a timedelta) after which, unanswered, the turn goes on with
                ``default``, answered ``by="timeout"`` (event ``input.expired``); an answer
                that comes later is refused (409), F24.
            default: the answer a ``timeout`` gives.
            remind_every: seconds (or a timedelta) between ``input.reminder`` events while
                the request stands (channels ask again: Slack posts its buttons again).

        Raises:
            ToolDeclarationError: in a local tool, whose transaction cannot stay open.
            ConfigurationError: ``timeout`` or ``remind_every`` is not a positive time.
        """
        if self.services is None:
            raise ToolDeclarationError(
                f"request_input({id!r}) in a local tool: a plain def runs inside the step's "
                "store transaction, which cannot stay open while a person answers; declare "
                "the tool `async def`"
            )
        return self.services.ask(id, prompt, schema, answerers, timeout=timeout,
                                 default=default, remind_every=remind_every)

    def sleep(self, seconds: float | timedelta | None = None, *,
              until: datetime | None = None) -> Awaitable[None]:
        """Sleep durably (F24): park the turn until ``seconds`` from now (or ``until``, an
        aware datetime), nothing held in memory; status ``suspended``, event
        ``turn.sleeping``. Whatever drives the turns wakes it then, after any restart; the
        tool runs again from the top and this call returns at once: put side effects after
        it. Each call of a tool's run is its own sleep, counted in order.

        Raises:
            ToolDeclarationError: in a local tool.
            ValueError: neither or both of ``seconds`` and ``until``, a negative time, or a
                naive ``until``.
        """
        if self.services is None:
            raise ToolDeclarationError(
                "sleep() in a local tool: a plain def runs inside the step's store "
                "transaction, which cannot stay open while it sleeps; declare the tool "
                "`async def`")
        if (seconds is None) == (until is None):
            raise ValueError("sleep(seconds) or sleep(until=datetime): one of them")
        self._sleeps += 1
        input_id = f"sleep:{self.call_id}:{self._sleeps}"
        if until is None:
            span = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
            if span is None or span < 0:
                raise ValueError(f"sleep({seconds!r}): a time to sleep is not negative")
            return self.services.sleep(input_id, self.services.now()
                                       + timedelta(seconds=float(span)))
        return self.services.sleep(input_id, utc(until))

    def cancelled(self) -> str | None:
        """Why this turn is being cancelled, if it is (a long remote tool may look and stop
        early; what it returns then is recorded, and the turn ends cancelled)."""
        return None if self.services is None else self.services.cancel_reason()


@dataclass(frozen=True, slots=True)
class ActionContext:
    """What a :func:`~durable_turns.define_action` run receives: only who asked."""

    user: User | None = None


__all__ = ["ActionContext", "Sessions", "StepServices", "StoreHandle", "ToolContext", "Watcher"]
