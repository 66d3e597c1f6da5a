"""Stepping sessions in this process (:class:`InProcessScheduler`, the default), or nowhere
here (:class:`NoDriveScheduler`: a front whose workers drive)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..errors import ConfigurationError, LeaseLostError, LeaseTimeoutError, StoreError
from ..records import SessionKey
from ..stores import Lease
from ._scheduler import Stepped

__all__ = ["InProcessScheduler", "NoDriveScheduler"]

log = logging.getLogger("durable_turns")

STORE_RETRIES = 5
"""How often a session is stepped again after the store refused a step."""
STORE_BACKOFF = 0.05
"""Seconds before the first such retry; doubled each time, up to 5 s."""


class InProcessScheduler:
    """Steps each session in this process as its work arrives (the default scheduler).

    A session with work gets a task of its own that claims the session's lease (waiting
    ``Runtime.lease_timeout`` for another holder) and calls ``Runtime.step(key, lease=…)``
    until the chain has nothing left, then releases it; a wake that came meanwhile has it
    look at the chain again. A step the store refused (nothing of it written) is stepped
    again after a backoff, up to :data:`STORE_RETRIES` times; a failure past that is told to
    the runtime (``Runtime.wait`` raises it) and the turn stays for ``Runtime.recover()``.
    """

    steps_here = True

    def __init__(self) -> None:
        self._runtime: Stepped | None = None
        self._tasks: dict[SessionKey, asyncio.Task[None]] = {}
        self._wakes: dict[SessionKey, int] = {}
        """Wakes per session while it has a task: a drive that saw fewer looks again."""

    def attach(self, runtime: Stepped) -> None:
        """``Scheduler.attach``."""
        if self._runtime is not None and self._runtime is not runtime:
            raise ConfigurationError(f"this {type(self).__name__} serves another runtime "
                                     "already: make one per runtime")
        self._runtime = runtime

    @property
    def runtime(self) -> Stepped:
        """The runtime this scheduler serves.

        Raises:
            ConfigurationError: it was given to no runtime.
        """
        if self._runtime is None:
            raise ConfigurationError(f"this {type(self).__name__} serves no runtime: pass it "
                                     "as Runtime(scheduler=…)")
        return self._runtime

    @property
    def driving(self) -> int:
        """How many sessions this scheduler steps now."""
        return len(self._tasks)

    def drives(self, key: SessionKey) -> bool:
        """Whether this scheduler steps the session now."""
        task = self._tasks.get(key)
        return task is not None and not task.done()

    async def wake(self, key: SessionKey, *, interrupt: bool = False) -> None:
        """``Scheduler.wake``: start the session's task, or have it look again."""
        self._wakes[key] = self._wakes.get(key, 0) + 1
        task = self._tasks.get(key)
        if task is None or task.done():  # (done: it ended before this wake, unseen)
            self.drive(key)

    def drive(self, key: SessionKey, lease: Lease | None = None) -> asyncio.Task[None]:
        """Start stepping the session in a task of its own (``lease``: claimed already)."""
        task = asyncio.create_task(self._drive(key, lease), name=f"durable-turns {key}")
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._ended(key, t))
        return task

    def _ended(self, key: SessionKey, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
            self._wakes.pop(key, None)
        failure = None if task.cancelled() else task.exception()
        self.runtime.stopped(key, failure)

    async def wait_idle(self) -> None:
        """``Scheduler.wait_idle``."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def close(self) -> None:
        """``Scheduler.close``: cancel the sessions' tasks (each releases its lease)."""
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _drive(self, key: SessionKey, lease: Lease | None) -> None:
        """Step the session until nothing is left (``lease``: claimed already, by a worker's
        look for work; its later looks claim without waiting, and a session another holder
        has is left to it)."""
        rt = self.runtime
        quiet = lease is not None
        failures = 0
        while True:
            seen = self._wakes.get(key, 0)
            try:
                if lease is None:
                    lease = await rt.store.claim(key, timeout=0 if quiet else rt.lease_timeout)
                try:
                    while True:
                        seen = self._wakes.get(key, 0)
                        if not (await rt.step(key, lease=lease)).more:
                            break
                finally:
                    held, lease = lease, None
                    await held.release()
                failures = 0
            except LeaseLostError as e:
                log.warning("durable_turns: %s; stopped driving it", e)
                return
            except LeaseTimeoutError as e:
                if quiet:
                    return  # another holder drives it: nothing failed
                log.error("durable_turns: %s; its turns stay for recover()", e)
                raise
            except StoreError as e:
                # The step was abandoned, nothing of it written: step the turn again after
                # a pause, from what the store holds.
                failures += 1
                if failures > STORE_RETRIES:
                    log.error("durable_turns: driving %s failed; its turns stay for "
                              "recover(): %s", key, e)
                    raise
                delay = min(STORE_BACKOFF * 2 ** (failures - 1), 5.0)
                log.warning("durable_turns: %s: %s; driving it again in %.2fs", key, e, delay)
                await self._back_off(key, delay)
                continue
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("durable_turns: driving %s failed; its turns stay for recover()",
                              key)
                raise
            if self._wakes.get(key, 0) == seen:
                return

    async def _back_off(self, key: SessionKey, delay: float) -> None:
        """Wait ``delay`` seconds before stepping again after a store failure, or less: the
        store's feed reports a change of the session when it hears from the database again
        (a listener that reconnected), and the turn goes on at once."""
        changed = asyncio.Event()
        unwatch = self.runtime.store.watch(key, lambda _events: changed.set())
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await changed.wait()
        finally:
            unwatch()


class NoDriveScheduler:
    """Steps nothing in this process: a front that accepts entries durably and answers
    ``wait`` and ``subscribe`` from the store, while workers drive (``durable-turns serve
    --no-drive``; the store's feed tells the workers, :class:`ClaimingScheduler`)."""

    steps_here = False

    def attach(self, runtime: Stepped) -> None:
        """``Scheduler.attach``: nothing to keep."""

    async def wake(self, key: SessionKey, *, interrupt: bool = False) -> None:
        """``Scheduler.wake``: the workers hear of it from the store."""

    async def wait_idle(self) -> None:
        """``Scheduler.wait_idle``: nothing runs here."""

    async def close(self) -> None:
        """``Scheduler.close``."""
