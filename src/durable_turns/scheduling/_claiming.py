"""A worker of a shared store: :class:`ClaimingScheduler` claims sessions that have work."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..errors import StoreError
from ._inprocess import InProcessScheduler

__all__ = ["ClaimingScheduler"]

log = logging.getLogger("durable_turns")

AWAY_POLL = 0.1
"""Seconds between a worker's looks for work while its store refuses them."""
AWAY_LOG_EVERY = 30.0
"""Seconds between a worker's warnings that its store refuses its looks."""


class ClaimingScheduler(InProcessScheduler):
    """Be one of many workers of a store: step every session of the runtime's agents that
    has a queued or running turn, as such sessions appear (:meth:`run`), and what the
    runtime accepts itself, as :class:`InProcessScheduler` does.

    Many workers (processes, machines) may work one store. Sessions are claimed with
    ``store.claim_ready`` (PostgreSQL: ``FOR UPDATE SKIP LOCKED``), so workers never wait on
    each other and never get the same session; a session whose holder died is taken over
    once its lease expired (PostgreSQL: ``lease_ttl``; SQLite: at once, the OS lock died with
    the process). The worker looks when the store's feed reports a change of a chain
    (PostgreSQL: a NOTIFY of a new turn, a resume or a cancel) or a session of its own is
    done, and every ``poll_interval`` seconds anyway, so a lost notification is only a
    delay. A look the store refuses (the database away) is logged and made again.

    Args:
        poll_interval: seconds between looks when nothing woke the worker.
        max_sessions: how many sessions this worker steps at once, at most; the rest are
            left to other workers (or to this one, once it has room).

    Raises:
        ValueError: ``poll_interval`` is not positive, or ``max_sessions`` is below 1.
    """

    def __init__(self, *, poll_interval: float = 0.5, max_sessions: int = 100) -> None:
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        super().__init__()
        self.poll_interval = poll_interval
        self.max_sessions = max_sessions

    async def run(self) -> None:
        """Look for sessions with work and step them, until cancelled."""
        rt = self.runtime
        rt.require_open()
        wake = asyncio.Event()
        # Woken by the store's feed (PostgreSQL: NOTIFY of a new turn, resume or cancel);
        # the poll makes a lost notification only a delay.
        stop = rt.store.watch(None, lambda _events: wake.set())
        agents = list(rt.agents)
        loop = asyncio.get_running_loop()
        away_since: float | None = None
        said = 0.0
        try:
            while True:
                wake.clear()
                room = self.max_sessions - self.driving
                pause = self.poll_interval
                try:
                    claimed = await rt.store.claim_ready(agents, room) if room > 0 else ()
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
                    pause = min(self.poll_interval, AWAY_POLL)
                else:
                    if away_since is not None:
                        log.warning("worker: the store answers again (it was away for %.1fs)",
                                    loop.time() - away_since)
                        away_since = None
                for lease in claimed:
                    if self.drives(lease.key):
                        await lease.release()  # this worker steps it already
                        await self.wake(lease.key)
                        continue
                    self.drive(lease.key, lease).add_done_callback(lambda _t: wake.set())
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that comes
                # as the wait ends, and run() would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await wake.wait()
        finally:
            stop()
