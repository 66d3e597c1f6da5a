"""The PostgreSQL store's leases: a row lease with a TTL, renewed by heartbeats.

A lease is ``sessions.lease_until`` (database time, so the workers' clocks never matter) and
``sessions.lease_owner`` (``host:pid``). ``claim()`` takes a free or expired lease, whoever
held it, and bumps ``sessions.epoch`` in the same transaction; ``claim_ready()`` does the same
for many sessions in one statement (``FOR UPDATE SKIP LOCKED``: workers claiming together
never wait on each other and never get the same session). A heartbeat renews a lease every
``lease_ttl / 3`` seconds while held; a crashed or paused holder loses it ``lease_ttl``
seconds after its last heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from typing import Any, Protocol, TypeVar

from ..errors import StoreError
from ..records import SessionKey
from .kit import retry_until
from .sql import LAST_ROW, NEEDS_DRIVING, Grant, SqlLease, SqlStore, counters

T = TypeVar("T")
log = logging.getLogger("durable_turns")


class LeaseDialect(Protocol):
    """What the leases need of their dialect."""

    lease_ttl: float
    owner: str

    @property
    def is_open(self) -> bool:
        """Whether the store is open (heartbeats stop when it closes)."""
        ...

    async def run_lease_job(self, job: Callable[[Any], T]) -> T:
        """Run ``job`` on a connection of the leases' own pool."""
        ...


_TRY_LEASE = (
    "UPDATE sessions SET lease_until = clock_timestamp() + make_interval(secs => %s), "
    "lease_owner = %s "
    "WHERE sid = %s AND (lease_until IS NULL OR lease_until < clock_timestamp()) RETURNING sid")
_RENEW = ("UPDATE sessions SET lease_until = clock_timestamp() + make_interval(secs => %s) "
          "WHERE sid = %s AND epoch = %s RETURNING sid")
_RELEASE = ("UPDATE sessions SET lease_until = NULL, lease_owner = NULL "
            "WHERE sid = %s AND epoch = %s")
# Sessions of these agents with work and a free or expired lease, claimed in one statement.
# SKIP LOCKED: a row another worker is claiming (or a step is committing) is passed over,
# never waited for; READ COMMITTED re-checks the lease condition on the row it locks, so two
# workers never both get a session.
_CLAIM_READY = f"""
WITH ready AS (
    SELECT s.sid FROM sessions s
    WHERE s.agent = ANY(%(agents)s)
      AND (s.lease_until IS NULL OR s.lease_until < clock_timestamp())
      AND EXISTS (SELECT 1 FROM turns t WHERE t.sid = s.sid AND {NEEDS_DRIVING})
    ORDER BY s.sid
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
), claimed AS (
    UPDATE sessions s
    SET epoch = s.epoch + 1, lease_owner = %(owner)s,
        lease_until = clock_timestamp() + make_interval(secs => %(ttl)s)
    FROM ready WHERE s.sid = ready.sid
    RETURNING s.sid, s.agent, s.session, s.epoch, s.generation
)
SELECT c.sid, c.agent, c.session, c.epoch, c.generation, l.seq, l.gen, l.n
FROM claimed c LEFT JOIN LATERAL ({LAST_ROW.format("c.sid")}) l ON true ORDER BY c.sid
"""


class Beat:
    """A lease's heartbeat (its ``Grant.hold``)."""

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.lost = False
        """Set when a heartbeat found the lease taken over (commits are refused anyway)."""


class RowLeases:
    """Row leases with a TTL, renewed by heartbeats (``Leases``); see the module docstring."""

    def __init__(self, dialect: LeaseDialect) -> None:
        self._d = dialect
        self.held: dict[Beat, tuple[int, int]] = {}
        """The heartbeats running, with their lease's ``(sid, epoch)``."""
        self.unreleased: dict[int, int] = {}
        """Leases whose release failed (the database was away), ``sid: epoch``: released
        by this store's next claim, so a worker takes its own sessions back as soon as the
        database returns instead of after ``lease_ttl``."""

    def _release_pending(self, c: Any) -> dict[int, int]:
        """In a lease job: free the leases whose release failed; returns those it freed."""
        pending = dict(self.unreleased)
        for sid, epoch in pending.items():
            c.execute(_RELEASE, (sid, epoch))
        return pending

    def _released(self, pending: dict[int, int]) -> None:
        for sid, epoch in pending.items():
            if self.unreleased.get(sid) == epoch:
                del self.unreleased[sid]

    def _grant(self, key: SessionKey, sid: int, epoch: int, gen: int, seq: int,
               count: int) -> Grant:
        beat = Beat()
        self.held[beat] = (sid, epoch)
        beat.task = asyncio.ensure_future(self._heartbeat(key, beat, sid, epoch))
        return Grant(sid, epoch, gen, seq, count, beat)

    async def claim(self, store: SqlStore, key: SessionKey, timeout: float | None) -> Grant:
        """``Leases.claim``: take a free or expired row lease and raise the epoch, in one
        transaction."""
        d, st = self._d, store.statements

        freed: dict[int, int] = {}

        def try_claim(c: Any) -> tuple[int, int, int, int, int] | None:
            freed.update(self._release_pending(c))
            sid = st.sid(c, key, create=True)
            if c.execute(_TRY_LEASE, (d.lease_ttl, d.owner, sid)).fetchone() is None:
                return None
            return st.claim(c, key)

        async def attempt() -> tuple[int, int, int, int, int] | None:
            got = await d.run_lease_job(lambda c: store.dialect.atomic(c, try_claim))
            self._released(freed)
            return got

        sid, epoch, gen, seq, count = await retry_until(attempt, key, timeout,
                                                        first_pause=0.005)
        return self._grant(key, sid, epoch, gen, seq, count)

    async def claim_ready(self, store: SqlStore, agents: Collection[str],
                          limit: int) -> list[tuple[SessionKey, Grant]]:
        """``Leases.claim_ready``: one ``FOR UPDATE SKIP LOCKED`` statement."""
        if limit <= 0 or not agents:
            return []
        d = self._d
        params = {"agents": list(agents), "limit": limit, "owner": d.owner, "ttl": d.lease_ttl}
        freed: dict[int, int] = {}

        def claim(c: Any) -> list[Any]:
            freed.update(self._release_pending(c))
            rows: list[Any] = c.execute(_CLAIM_READY, params).fetchall()
            return rows

        rows = await d.run_lease_job(claim)
        self._released(freed)
        out = []
        for sid, agent, session, epoch, gen, seq, last_gen, n in rows:
            key = SessionKey(agent, session)
            last = counters(None if seq is None else (seq, last_gen, n), gen)
            out.append((key, self._grant(key, sid, epoch, gen, *last)))
        return out

    async def _heartbeat(self, key: SessionKey, beat: Beat, sid: int, epoch: int) -> None:
        d = self._d
        every = d.lease_ttl / 3
        def renew(c: Any) -> Any:
            return c.execute(_RENEW, (d.lease_ttl, sid, epoch)).fetchone()

        while d.is_open:
            await asyncio.sleep(every)
            try:
                row = await d.run_lease_job(renew)
            except StoreError as e:
                log.warning("heartbeat of %s failed (retrying): %s", key, e)
                continue
            if row is None:
                beat.lost = True
                return

    async def stop(self, beat: Beat) -> bool:
        """Stop renewing a lease (it then expires); whether it was still beating."""
        self.held.pop(beat, None)
        task, beat.task = beat.task, None
        if task is None:
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True

    async def release(self, store: SqlStore, lease: SqlLease) -> None:
        """``Leases.release``: stop the heartbeat, then free the row (unless the lease was lost)."""
        beat: Beat = lease.hold
        if not await self.stop(beat) or beat.lost:
            return
        d, sid, epoch = self._d, lease.sid, lease.epoch
        try:
            await d.run_lease_job(lambda c: c.execute(_RELEASE, (sid, epoch)))
        except StoreError as e:  # the next claim releases it, or it expires on its own
            self.unreleased[sid] = epoch
            log.warning("release of %s failed (the next claim here releases it; else it "
                        "expires in %ss): %s", lease.key, d.lease_ttl, e)
