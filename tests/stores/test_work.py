"""F14 many workers: a ClaimingScheduler drives what other processes accepted, on every
store; a NoDriveScheduler front drives nothing."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from durable_turns import Agent, ModelReply, Runtime, scripted
from durable_turns.errors import ConfigurationError
from durable_turns.scheduling import ClaimingScheduler, NoDriveScheduler, Scheduler
from durable_turns.stores import SessionStore


def _runtime(store: SessionStore, scheduler: Scheduler | None = None) -> Runtime:
    return Runtime([Agent("ops", "You run ops.", [])], store,
                   scripted(lambda _r: ModelReply("done")), scheduler=scheduler)


async def test_a_worker_drives_turns_another_runtime_accepted(store: SessionStore) -> None:
    front = _runtime(store, NoDriveScheduler())  # accepts and answers, drives nothing
    started = [await front.session("ops", f"s{i}").start("hi", turn_id="t1") for i in range(3)]
    assert all(s.new for s in started)
    claims = ClaimingScheduler(poll_interval=0.01)
    worker = _runtime(store, claims)
    working = asyncio.ensure_future(claims.run())
    try:
        async with asyncio.timeout(30):
            results = [await front.session("ops", f"s{i}").result("t1") for i in range(3)]
        assert [(r.status, r.text) for r in results] == [("completed", "done")] * 3
        # Accepted later, while the worker works: driven too.
        await front.session("ops", "late").start("hi", turn_id="t2")
        async with asyncio.timeout(30):
            late = await front.session("ops", "late").result("t2")
        assert late.status == "completed"
    finally:
        working.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await working
        await worker.close()
        await front.close()


async def test_a_front_drives_nothing_and_the_removed_drive_flag_says_what_replaced_it(
        store: SessionStore) -> None:
    front = _runtime(store, NoDriveScheduler())
    await front.session("ops", "s1").start("hi", turn_id="t1")
    with pytest.raises(TimeoutError):
        await front.session("ops", "s1").result("t1", timeout=0.2)
    assert [t.status.value for t in await front.session("ops", "s1").turns()] == ["queued"]
    await front.close()
    with pytest.raises(ConfigurationError, match="NoDriveScheduler"):
        Runtime([Agent("ops")], store, drive=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="one per runtime"):
        shared = ClaimingScheduler()
        _runtime(store, shared)
        _runtime(store, shared)


async def test_a_worker_drives_at_most_max_sessions_at_once(store: SessionStore) -> None:
    from durable_turns import ModelRequest, ToolCall, tool
    from durable_turns.models.scripted import calls_this_turn

    inside, peak = 0, 0

    @tool
    async def wait_a_little() -> str:
        """Stay a moment in the tool (a remote tool: the session stays driven meanwhile)."""
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        for _ in range(20):
            await asyncio.sleep(0.005)
        inside -= 1
        return "ok"

    def reply(request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("", [ToolCall("c1", "wait_a_little", {})])
        return ModelReply("done")

    front = _runtime(store, NoDriveScheduler())
    for i in range(5):
        await front.session("ops", f"s{i}").start("hi", turn_id="t1")
    with pytest.raises(ValueError, match="max_sessions"):
        ClaimingScheduler(max_sessions=0)
    claims = ClaimingScheduler(poll_interval=0.01, max_sessions=2)
    worker = Runtime([Agent("ops", "You run ops.", [wait_a_little])], store, scripted(reply),
                     scheduler=claims)
    working = asyncio.ensure_future(claims.run())
    try:
        async with asyncio.timeout(30):
            results = [await front.session("ops", f"s{i}").result("t1") for i in range(5)]
        assert [r.text for r in results] == ["done"] * 5
        assert 1 <= peak <= 2
    finally:
        working.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await working
        await worker.close()
        await front.close()
