"""Checks of what a store declares (``store.capabilities``): the required check that the
declaration is well formed, and the optional tiers, each run on a store that declares its
capability (see the package's docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from ..errors import LeaseLostError, LeaseTimeoutError
from ..events import MessageDelta, TurnEvent, TurnStarted
from ..messages import Message
from ..records import NewEntry, SessionKey, TurnResult, TurnStatus
from ..stores import SessionStore, StoreCapabilities
from .helpers import KEY, event_ids, get_turn, opening

StoreFactory = Callable[[], SessionStore]
"""Makes a store (not opened yet); every store one factory makes in a check is on the same
storage (the same file, the same database)."""

_MARKS = {"qmark": "?", "format": "%s", "pyformat": "%s"}
WAIT = 30.0
"""The bound on every wait of these checks, in seconds (a lease's TTL is added to it)."""


async def check_capabilities_are_declared(store: SessionStore) -> None:
    """A store declares what it can do, in a well-formed record that does not change."""
    caps = store.capabilities
    assert isinstance(caps, StoreCapabilities), caps
    assert caps.shared_by in ("process", "processes", "machines"), caps
    assert caps.lease_ttl is None or caps.lease_ttl > 0, caps
    assert caps.paramstyle is None or caps.paramstyle in _MARKS, caps
    assert not caps.exactly_once_local or caps.paramstyle is not None, \
        "a store whose local writes join the step hands tools a SQL handle: its paramstyle"
    assert caps.shared_by == "process" or caps.durable, "shared storage outlives a process"
    assert store.capabilities == caps


def _sql(handle: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """Run one statement on a store's raw handle, either shape: DB-API (``execute(sql,
    params)``) or ``exec(sql, *bindings)`` returning a cursor with ``raw()`` (a Durable
    Object's); its rows."""
    if hasattr(handle, "execute"):
        cur = handle.execute(sql, params)
        return list(cur.fetchall()) if cur.description is not None else []
    return list(handle.exec(sql, *params).raw().toArray())


async def check_local_writes_join_the_transaction(store: SessionStore) -> None:
    """``exactly_once_local``: a local tool's writes through the raw handle commit with its
    step, and roll back when the tool raises, when the step fails before its commit, and when
    the commit is refused (a stale epoch)."""
    mark = _MARKS[store.capabilities.paramstyle or "qmark"]
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)

    def setup(h: Any) -> None:
        _sql(h, "CREATE TABLE IF NOT EXISTS conformance_rows (v TEXT)")

    def write(value: str, fail: bool) -> Callable[[Any], None]:
        def run(h: Any) -> None:
            _sql(h, f"INSERT INTO conformance_rows (v) VALUES ({mark})", (value,))
            if fail:
                raise ValueError("tool failed")

        return run

    async with lease.transaction() as tx:
        await tx.run_local(setup)
    async with lease.transaction() as tx:
        await tx.run_local(write("kept", False))
        with contextlib.suppress(ValueError):
            await tx.run_local(write("rolled back", True))
        await tx.run_local(write("kept too", False))
        tx.add_message(opening("t1"))
    async with lease.transaction() as tx:  # a failing first tool: nothing of it stays
        with contextlib.suppress(ValueError):
            await tx.run_local(write("rolled back first", True))
        tx.add_message(opening("t1", "again"))
    try:
        async with lease.transaction() as tx:
            await tx.run_local(write("lost with the step", False))
            raise RuntimeError("crash before commit")
    except RuntimeError:
        pass
    await lease.release()
    current = await store.claim(KEY)
    try:
        async with lease.transaction() as tx:  # the released lease: its commit is refused
            await tx.run_local(write("fenced off", False))
            tx.add_event(TurnStarted(**event_ids("t1")))
    except LeaseLostError:
        pass
    else:
        raise AssertionError("a commit under a stale epoch was accepted")
    await current.release()
    rows = _sql(store.unwrap(), "SELECT v FROM conformance_rows ORDER BY v")
    assert [r[0] for r in rows] == ["kept", "kept too"]
    assert len(await store.read_messages(KEY)) == 2


async def check_a_cancel_never_waits_for_a_step(store: SessionStore) -> None:
    """``local_off_loop``: a cancel requested while a step's transaction is open (a local
    tool runs in it and has written, holding whatever the step holds) returns without
    waiting for the step, and the lease's cancel check sees it once the step committed (F7:
    the turn ends at that boundary)."""
    mark = _MARKS[store.capabilities.paramstyle or "qmark"]
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)
    running, release = threading.Event(), threading.Event()

    def hold(h: Any) -> None:
        h.execute("CREATE TABLE IF NOT EXISTS conformance_held (v TEXT)")
        h.execute(f"INSERT INTO conformance_held (v) VALUES ({mark})", ("held",))
        running.set()
        if not release.wait(WAIT):
            raise AssertionError("the check never let the local tool end")

    async def step() -> None:
        async with lease.transaction() as tx:
            await tx.run_local(hold)
            tx.add_message(opening("t1"))

    stepping = asyncio.create_task(step())
    try:
        assert await asyncio.to_thread(running.wait, WAIT), "the local tool never ran"
        cancelled = await asyncio.wait_for(store.request_cancel(KEY, "t1", "stop"), WAIT)
        assert cancelled == ["t1"], cancelled
        assert not stepping.done(), "request_cancel waited for the step to end"
    finally:
        release.set()
    await asyncio.wait_for(stepping, WAIT)
    assert await lease.cancel_requested("t1") == "stop"
    assert (await get_turn(store, KEY, "t1")).cancel == "stop"  # type: ignore[union-attr]
    await lease.release()


async def check_commits_outlive_the_store(store: SessionStore, factory: StoreFactory) -> None:
    """``durable``: what one store committed, a store opened afterwards on the same storage
    reads, leases' counters included."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        tx.add_message(opening("t1"))
        tx.add_event(TurnStarted(**event_ids("t1"), text="hello"))
        tx.set_turn(TurnResult("t1", TurnStatus.RUNNING))
    await lease.release()
    await store.close()
    again = factory()
    await again.open()
    try:
        assert await again.read_messages(KEY) == [opening("t1")]
        assert [e.seq for e in await again.read_events(KEY)] == [1]
        t1 = await get_turn(again, KEY, "t1")
        assert t1 is not None and t1.status == "running"
        lease = await again.claim(KEY, timeout=WAIT)
        assert (lease.last_seq, lease.message_count) == (1, 1)
        await lease.release()
    finally:
        await again.close()


async def check_stores_on_one_storage_share_sessions(store: SessionStore,
                                                     factory: StoreFactory) -> None:
    """``shared_by`` processes or machines: two stores on one storage (as two processes
    would have) see each other's writes, exclude each other's leases, fence each other's
    stale holders and wake each other's subscribers."""
    other = factory()
    await other.open()
    try:
        await store.enqueue(KEY, NewEntry("t1", opening("t1")))
        assert [t.turn_id for t in await other.entries(KEY)] == ["t1"]
        held = await store.claim(KEY)
        with contextlib.suppress(LeaseTimeoutError):
            await other.claim(KEY, timeout=0.05)
            raise AssertionError("a lease held by one store was granted to another")
        async with other.subscribe(KEY, after_seq=0) as sub:
            async with held.transaction() as tx:
                tx.add_event(TurnStarted(**event_ids("t1"), text="hello"))
            async with asyncio.timeout(WAIT):
                seen = await anext(sub)
            assert (seen.seq, seen.type) == (1, "turn.started")
        await held.release()
        taken = await other.claim(KEY, timeout=WAIT)
        assert taken.epoch > held.epoch
        with contextlib.suppress(LeaseLostError):
            async with held.transaction() as tx:
                tx.add_message(opening("t1"))
            raise AssertionError("a released lease's commit was accepted")
        await taken.release()
        assert await other.read_messages(KEY) == []
    finally:
        await other.close()


async def check_an_unrenewed_lease_expires(store: SessionStore, factory: StoreFactory) -> None:
    """``lease_ttl``: a lease whose holder stops renewing it (its store closed without
    releasing it, as a paused or cut-off process) is taken over about ``lease_ttl`` seconds
    later, with a higher epoch; until then it is not."""
    ttl = store.capabilities.lease_ttl
    assert ttl is not None
    other = factory()
    await other.open()
    try:
        await store.enqueue(SessionKey("agent", "ttl"), NewEntry("t1", opening("t1")))
        held = await store.claim(SessionKey("agent", "ttl"))
        with contextlib.suppress(LeaseTimeoutError):
            await other.claim(held.key, timeout=min(0.2, ttl / 4))
            raise AssertionError("a renewed lease was taken over")
        await store.close()  # no release: the lease is left to expire
        loop = asyncio.get_running_loop()
        start = loop.time()
        taken = await other.claim(held.key, timeout=ttl + WAIT)
        assert taken.epoch > held.epoch
        assert loop.time() - start < ttl + WAIT
        async with taken.transaction() as tx:
            tx.add_message(Message("user", "taken over", turn_id="t1"))
        await taken.release()
    finally:
        await other.close()


async def check_live_events_reach_a_store_on_the_same_storage(store: SessionStore,
                                                              factory: StoreFactory) -> None:
    """``shared_by`` processes or machines: live events one store publishes (text a turn
    streams) reach the subscribers of another store on the same storage, each after the
    durable event whose ``seq`` it carries, with no stored copy. Best effort by contract, so
    the check publishes until one arrives (a receiver may start listening late); each turn
    of it streams a text, then commits the event that follows."""
    other = factory()
    await other.open()
    got: list[TurnEvent] = []
    try:
        async with other.subscribe(KEY, after_seq=0) as sub:
            deadline = asyncio.get_running_loop().time() + WAIT
            seq = 0
            while not any(e.type == "message.delta" for e in got):
                assert asyncio.get_running_loop().time() < deadline, \
                    "no live event reached the other store"
                lease = await store.claim(KEY)
                async with lease.transaction() as tx:
                    seq = tx.add_event(TurnStarted(**event_ids("t1"), text="go")).seq
                if store.wants_live(KEY):
                    store.publish_live(MessageDelta(**event_ids("t1"), seq=seq, text="hel"))
                    store.publish_live(MessageDelta(**event_ids("t1"), seq=seq, text="lo"))
                async with lease.transaction() as tx:  # the step that follows the text
                    seq = tx.add_event(TurnStarted(**event_ids("t1"), text="next")).seq
                await lease.release()
                async with asyncio.timeout(WAIT):
                    while not got or got[-1].seq != seq:
                        got.append(await anext(sub))
    finally:
        await other.close()
    durable = [e.seq for e in got if e.durable]
    assert durable == list(range(1, durable[-1] + 1)), "durable events: no gap, no duplicate"
    for i, e in enumerate(got):
        if e.durable:
            continue
        before = [d for d in got[:i] if d.durable]
        assert before and before[-1].seq == e.seq, f"{e} is not right after event {e.seq}"
        assert before[-1].text == "go"  # type: ignore[attr-defined]
    texts = "".join(getattr(e, "text", "") for e in got if not e.durable)
    assert texts and set(texts.split("hello")) == {""}, texts


__all__ = [
    "WAIT",
    "StoreFactory",
    "check_an_unrenewed_lease_expires",
    "check_capabilities_are_declared",
    "check_commits_outlive_the_store",
    "check_live_events_reach_a_store_on_the_same_storage",
    "check_local_writes_join_the_transaction",
    "check_stores_on_one_storage_share_sessions",
]
