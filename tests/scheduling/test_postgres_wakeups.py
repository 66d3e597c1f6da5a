"""F24 on PostgreSQL: workers share the due wake-ups out, each fired once. Two stores (two
pools, as two worker processes have) claim the same due timers at once and never get the
same one (``FOR UPDATE SKIP LOCKED``); two worker runtimes on one database, their clocks at
the same time, wake each of many sleeping turns once."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from durable_turns import Agent, ModelReply, Runtime, ToolCall, ToolContext, scripted, tool
from durable_turns.clock import ManualClock
from durable_turns.records import InputRequest, SessionKey
from durable_turns.scheduling import ClaimingScheduler
from durable_turns.stores.postgres import PostgresStore
from durable_turns.testing.helpers import park
from durable_turns.testing.timers import T0

SESSIONS = 40
after: list[str] = []


async def test_two_stores_claiming_at_once_never_share_a_timer(pg_dsn: str) -> None:
    stores = [PostgresStore(pg_dsn), PostgresStore(pg_dsn)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        for i in range(SESSIONS):
            await park(stores[0], SessionKey("ops", f"s{i:02}"), "t1", InputRequest(
                "zz", "", expires=(T0 + timedelta(seconds=i)).isoformat(), sleep=True))
        now = T0 + timedelta(minutes=5)
        batches = await asyncio.gather(*(
            stores[n % 2].claim_timers(["ops"], now, limit=7) for n in range(10)))
        claimed = [(t.key, t.id) for batch in batches for t in batch]
        assert len(claimed) == len(set(claimed)) == SESSIONS
        assert all(batch == [] or len(batch) <= 7 for batch in batches)
    finally:
        await asyncio.gather(*(s.close() for s in stores))


@tool
async def nap(ctx: ToolContext) -> str:
    """Sleep an hour, then act."""
    await ctx.sleep(3600)
    after.append(ctx.session)
    return "rested"


def _worker(dsn: str, clock: ManualClock) -> Runtime:
    model = scripted(lambda request: ModelReply("Rested.") if any(
        m.role == "tool" for m in request.messages) else ModelReply(
            "", [ToolCall("c1", "nap", {})]))
    return Runtime([Agent("ops", "", [nap])], PostgresStore(dsn, lease_ttl=5.0), model,
                   clock=clock, scheduler=ClaimingScheduler(poll_interval=0.05))


async def _until(rt: Runtime, keys: list[SessionKey], status: str) -> None:
    async with asyncio.timeout(60):
        for key in keys:
            while (await rt.session("ops", key.session).result("t1")).status != status:
                await asyncio.sleep(0.01)  # a poll of the store, bounded by the timeout


async def test_two_workers_wake_each_sleeping_turn_once(pg_dsn: str) -> None:
    after.clear()
    clock = ManualClock()
    workers = [_worker(pg_dsn, clock), _worker(pg_dsn, clock)]
    async with workers[0], workers[1]:
        runs = [asyncio.create_task(w.scheduler.run()) for w in workers
                if isinstance(w.scheduler, ClaimingScheduler)]
        try:
            keys = [workers[0].key("ops", f"s{i:02}") for i in range(SESSIONS)]
            for key in keys:
                await workers[0].session("ops", key.session).start("nap", turn_id="t1")
            await _until(workers[0], keys, "suspended")
            clock.advance(3600)
            await _until(workers[1], keys, "completed")
        finally:
            for r in runs:
                r.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
    assert sorted(after) == sorted(k.session for k in keys)  # each woke, and once
