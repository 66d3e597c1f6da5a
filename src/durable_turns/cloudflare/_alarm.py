"""The scheduler of an agent's Durable Object: steps in the object as work arrives, with the
object's one alarm as the backstop that outlives it.

A wake sets the alarm :data:`BACKSTOP` seconds ahead and steps the session here at once (so a
turn streams as it runs); when the session has nothing left to do the alarm is deleted. An
object evicted mid-turn (a deploy, a crash, its memory reclaimed) loses its tasks, not its
storage: the alarm then fires on a new instance, whose ``alarm()`` calls :meth:`fire` — every
unfinished turn is told to this scheduler (``Runtime.recover``) and stepped to its end, and
the turn replays from its first unfinished step. workerd retries an ``alarm()`` that raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..agent import Agent
from ..errors import ConfigurationError
from ..records import SessionKey
from ..runtime import Runtime
from ..scheduling import ChainState, InProcessScheduler, Stepped
from ..stores import Lease, SessionStore

__all__ = ["BACKSTOP", "AlarmScheduler"]

BACKSTOP = 10.0
"""Seconds ahead of a wake the alarm is set: how long an evicted turn waits to go on."""


class AlarmScheduler:
    """A :class:`~durable_turns.scheduling.Scheduler` for one Durable Object.

    Args:
        storage: the object's ``ctx.storage`` (``setAlarm``, ``deleteAlarm``).
        backstop: seconds ahead of a wake the alarm is set.
        clock: the time in seconds since the epoch (tests inject theirs).
    """

    steps_here = True

    def __init__(self, storage: Any, *, backstop: float = BACKSTOP,
                 clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.backstop = backstop
        self.clock = clock
        self._here = InProcessScheduler()
        self._runtime: Runtime | None = None
        self._settling: set[asyncio.Task[None]] = set()

    def attach(self, runtime: Stepped) -> None:
        """``Scheduler.attach``.

        Raises:
            ConfigurationError: ``runtime`` is no :class:`~durable_turns.Runtime`.
        """
        if not isinstance(runtime, Runtime):
            raise ConfigurationError("an AlarmScheduler serves a durable_turns.Runtime")
        self._here.attach(_Told(runtime, self._stopped))
        self._runtime = runtime

    async def wake(self, key: SessionKey, *, interrupt: bool = False) -> None:
        """``Scheduler.wake``: the alarm first (durable before anything runs), then a step
        here."""
        await self.storage.setAlarm((self.clock() + self.backstop) * 1000)
        await self._here.wake(key, interrupt=interrupt)

    async def fire(self) -> None:
        """The object's ``alarm()``: step every unfinished turn to its end or its park.

        Raises:
            Exception: a session could not be stepped (workerd retries the alarm).
        """
        assert self._runtime is not None
        rt = self._runtime
        await rt.recover()
        await self.wait_idle()
        for key in await rt.store.find_sessions("unfinished"):
            if (await rt.chain(key)).more:
                raise RuntimeError(f"{key} still has work after the alarm: retried")

    async def wait_idle(self) -> None:
        """``Scheduler.wait_idle``."""
        await self._here.wait_idle()
        while self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)

    async def close(self) -> None:
        """``Scheduler.close``."""
        await self._here.close()

    def _stopped(self, key: SessionKey) -> None:
        task = asyncio.ensure_future(self._settle(key))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, key: SessionKey) -> None:
        """The session's drive here ended: with nothing left, the alarm goes (a park waits
        for its answer, which wakes again); with work left (the drive gave up), it stays."""
        assert self._runtime is not None
        if self._here.drives(key):
            return
        if not (await self._runtime.chain(key)).more:
            await self.storage.deleteAlarm()


class _Told:
    """The runtime as the in-object stepping sees it, telling the scheduler when a drive
    ends."""

    def __init__(self, runtime: Stepped, stopped: Callable[[SessionKey], None]) -> None:
        self._rt = runtime
        self._stopped = stopped

    @property
    def store(self) -> SessionStore:
        return self._rt.store

    @property
    def agents(self) -> Mapping[str, Agent]:
        return self._rt.agents

    @property
    def lease_timeout(self) -> float | None:
        return self._rt.lease_timeout

    def require_open(self) -> None:
        self._rt.require_open()

    async def step(self, key: SessionKey, *, lease: Lease | None = None,
                   lease_timeout: float | None = None,
                   attempt: int | None = None) -> ChainState:
        return await self._rt.step(key, lease=lease, lease_timeout=lease_timeout,
                                   attempt=attempt)

    def stopped(self, key: SessionKey, failure: BaseException | None = None) -> None:
        self._rt.stopped(key, failure)
        self._stopped(key)
