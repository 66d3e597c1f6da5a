"""What a remote call's step offers its tool (``ctx.services``, F6, F13, F24): ask a person
(a request, with a deadline and reminders), sleep, see its turn's cancel, record and follow
durable child work. Asking and sleeping park the turn (:class:`~durable_turns.errors.Parked`);
the replay after the answer (a person's, or the clock's) finds the answer step and goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

import jsonschema

from .._hitl import default_answerers
from ..clock import Clock
from ..context import Sessions, Watcher
from ..errors import ConfigurationError, Parked, runtime_failure
from ..events import TurnEvent
from ..inbound import InboundEvent
from ..records import (
    Answer,
    ChainEntry,
    ChildMemo,
    ChildStepId,
    InputRequest,
    InputStepId,
    SessionKey,
    StepId,
    StepResult,
    TurnResult,
)
from ..stores import Transaction
from ..tools import compile_schema
from ._commits import StepCommits

__all__ = ["CallServices", "Calls"]

T = TypeVar("T")


class Calls(Protocol):
    """What :class:`CallServices` uses of the tool steps of its drive (``ToolCalls``)."""

    commits: StepCommits
    sessions: Sessions
    clock: Clock
    failing: str | None
    publish_live: Callable[[TurnEvent], None]

    def reason(self, turn_id: str) -> str | None: ...

    async def read_step(self, step: StepId) -> StepResult | None: ...


def _seconds(value: float | timedelta | None, name: str, input_id: str) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise ConfigurationError(f"request_input({input_id!r}): {name} must be a positive "
                                 f"number of seconds or a timedelta, not {value!r}")
    return float(seconds)


class CallServices:
    """What a remote call's step offers its tool (``ctx.services``): see
    :class:`~durable_turns.context.StepServices`."""

    def __init__(self, calls: Calls, turn_id: str, call_id: str,
                 event: InboundEvent | None) -> None:
        self._calls = calls
        self._turn_id = turn_id
        self._call_id = call_id
        self._event = event
        self._sessions = _GuardedSessions(calls.sessions, self)
        self.failure: BaseException | None = None
        """The first runtime failure (``errors.RUNTIME_FAILURES``) a call on its context met:
        the tool's attempt is abandoned, whatever the tool made of it."""

    @property
    def sessions(self) -> Sessions:
        return self._sessions

    async def guard(self, running: Awaitable[T]) -> T:
        """Await a call the tool made on its context, keeping a runtime failure it meets."""
        try:
            return await running
        except Exception as e:
            found = runtime_failure(e)
            if found is not None and self.failure is None:
                self.failure = found
            raise

    def now(self) -> datetime:
        return self._calls.clock.now()

    def cancel_reason(self) -> str | None:
        return self._calls.reason(self._turn_id) or self._calls.failing

    async def ask(self, input_id: str, prompt: str, schema: Mapping[str, Any] | None,
                  answerers: Mapping[str, Any] | None, *,
                  timeout: float | timedelta | None = None, default: Any = None,
                  remind_every: float | timedelta | None = None) -> Any:
        stored = await self._answer(input_id)
        if stored is not None:
            return stored.value
        if schema is not None:
            try:
                compile_schema(schema)
            except jsonschema.SchemaError as e:
                raise ConfigurationError(
                    f"request_input({input_id!r}): invalid schema: {e.message}") from e
        now = self._calls.clock.now()
        wait = _seconds(timeout, "timeout", input_id)
        every = _seconds(remind_every, "remind_every", input_id)
        expires = None if wait is None else (now + timedelta(seconds=wait)).isoformat()
        remind_at = None if every is None else (now + timedelta(seconds=every)).isoformat()
        raise Parked(InputRequest(input_id, prompt, dict(schema) if schema else None,
                                  default_answerers(answerers, self._event, input_id),
                                  self._turn_id, self._call_id, expires=expires,
                                  default=default if wait is not None else None,
                                  remind_every=every, remind_at=remind_at))

    async def sleep(self, input_id: str, until: datetime) -> None:
        if await self._answer(input_id) is not None:
            return  # woken: the tool runs on from here
        if until <= self._calls.clock.now():
            return
        raise Parked(InputRequest(input_id, f"sleeping until {until.isoformat()}", None, None,
                                  self._turn_id, self._call_id, expires=until.isoformat(),
                                  sleep=True))

    async def _answer(self, input_id: str) -> Answer | None:
        step = InputStepId(self._turn_id, input_id)
        stored = await self.guard(self._calls.read_step(step))
        if not isinstance(stored, Answer):
            return None
        trace = self._calls.commits.trace
        if trace is not None:
            trace.input(str(step), stored.by)
        return stored

    async def remember(self, step: ChildStepId, memo: ChildMemo) -> ChildMemo:
        stored = await self.guard(self._calls.read_step(step))
        if isinstance(stored, ChildMemo):
            return stored
        turn_id = self._turn_id

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.add_step(step, turn_id, memo)
            return []

        await self.guard(self._calls.commits.beside(fill, shielded=True))
        return memo

    async def forward(self, events: list[TurnEvent]) -> None:
        ids = self._calls.commits.ids(self._turn_id)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            # Each event names its child already; it joins this turn's stream.
            return [tx.add_event(dataclasses.replace(e, seq=0, **ids)) for e in events]

        await self.guard(self._calls.commits.beside(fill, shielded=True))

    def forward_live(self, event: TurnEvent) -> None:
        commits = self._calls.commits
        # After this turn's last durable event, as every live event is.
        self._calls.publish_live(dataclasses.replace(
            event, seq=commits.lease.last_seq, **commits.ids(self._turn_id)))


class _GuardedSessions:
    """The runtime's sessions as a remote tool reaches them (``ctx.services.sessions``): each call
    goes through :meth:`CallServices.guard`, so a store failure it meets abandons the step."""

    def __init__(self, sessions: Sessions, services: CallServices) -> None:
        self._h = sessions
        self._s = services

    def agent_names(self) -> Collection[str]:
        return self._h.agent_names()

    async def start(self, key: SessionKey, text: str, *, turn_id: str,
                    event: InboundEvent | None = None) -> None:
        await self._s.guard(self._h.start(key, text, turn_id=turn_id, event=event))

    async def wait(self, key: SessionKey, turn_id: str, *,
                   timeout: float | None = None) -> TurnResult:
        return await self._s.guard(self._h.wait(key, turn_id, timeout=timeout))

    async def interrupt(self, key: SessionKey, turn_id: str, *, reason: str) -> list[str]:
        return await self._s.guard(self._h.interrupt(key, turn_id, reason=reason))

    async def reset(self, key: SessionKey, entry_id: str) -> None:
        await self._s.guard(self._h.reset(key, entry_id))

    async def entry(self, key: SessionKey, turn_id: str) -> ChainEntry | None:
        return await self._s.guard(self._h.entry(key, turn_id))

    async def events(self, key: SessionKey, *, after_seq: int = 0,
                     turn_id: str | None = None) -> list[TurnEvent]:
        return await self._s.guard(self._h.events(key, after_seq=after_seq, turn_id=turn_id))

    def watch(self, key: SessionKey, watcher: Watcher) -> Callable[[], None]:
        return self._h.watch(key, watcher)

    def live(self, key: SessionKey, taker: Callable[[TurnEvent], None]) -> Callable[[], None]:
        return self._h.live(key, taker)
