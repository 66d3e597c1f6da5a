"""Checks of leases and of the event feed: exclusive holders, workers' claims, replay then live."""

from __future__ import annotations

import asyncio

from ..errors import LeaseTimeoutError
from ..events import (
    MessageDelta,
    TurnCompleted,
    TurnEvent,
    TurnStarted,
)
from ..records import (
    NewEntry,
    SessionKey,
)
from ..stores import SessionStore
from .helpers import KEY, commit_events, event_ids, opening, park


async def check_lease_is_exclusive(store: SessionStore) -> None:
    """One holder per session at a time; other sessions are free; a released lease is claimed
    again."""
    lease = await store.claim(KEY)
    try:
        await store.claim(KEY, timeout=0.05)
    except LeaseTimeoutError:
        pass
    else:
        raise AssertionError("a second lease on one session was granted")
    other = await store.claim(SessionKey("agent", "s2"), timeout=0.05)
    await other.release()
    await lease.release()
    again = await store.claim(KEY, timeout=1)
    await again.release()


async def check_two_holders_contend_for_one_session(store: SessionStore) -> None:
    """A claim that waits gets the session once its holder releases it, with a higher epoch."""
    order: list[str] = []
    first = await store.claim(KEY)

    async def second() -> int:
        lease = await store.claim(KEY, timeout=30)
        order.append("second holds")
        epoch = lease.epoch
        await lease.release()
        return epoch

    waiting = asyncio.ensure_future(second())
    await asyncio.sleep(0.05)  # give the contender time to try (and be refused)
    assert order == [] and not waiting.done()
    order.append("first releases")
    await first.release()
    async with asyncio.timeout(30):
        epoch = await waiting
    assert order == ["first releases", "second holds"]
    assert epoch > first.epoch


async def check_ready_sessions_are_claimed_once(store: SessionStore) -> None:
    """claim_ready claims sessions with work and a free lease, each by one claimer only."""
    other, parked = SessionKey("agent", "s2"), SessionKey("agent", "parked")
    foreign = SessionKey("another", "s1")
    assert list(await store.claim_ready(["agent"])) == []
    for key in (KEY, other, foreign):
        await store.enqueue(key, NewEntry("t1", opening("t1")))
    await park(store, parked, "t1")
    held = await store.claim(KEY)
    # Two workers claiming at once share the ready sessions out, never one to both.
    first, second = await asyncio.gather(store.claim_ready(["agent"]),
                                         store.claim_ready(["agent"]))
    assert sorted(x.key for x in [*first, *second]) == [other]  # KEY is held, parked waits
    got = [*first, *second][0]
    assert list(await store.claim_ready(["agent", "another"], limit=0)) == []
    assert [x.key for x in await store.claim_ready(["another"])] == [foreign]
    # A claimed lease is a lease: a new epoch that commits, and nobody else's until released.
    async with got.transaction() as tx:
        tx.add_message(opening("t1"))
    assert list(await store.claim_ready(["agent"])) == []
    await held.release()
    await got.release()
    again = await store.claim_ready(["agent"], limit=1)
    assert len(again) == 1 and again[0].key in (KEY, other)
    rest = await store.claim_ready(["agent"])
    assert {x.key for x in [*again, *rest]} == {KEY, other}
    assert [x.epoch for x in [*again, *rest] if x.key == other] > [got.epoch]
    for x in [*again, *rest]:
        await x.release()


async def check_subscribe_replays_then_goes_live(store: SessionStore) -> None:
    """A subscription replays the stored events after its cursor, then live ones: no gap, no
    duplicate."""
    await commit_events(store, KEY, "t1", 3)
    got: list[TurnEvent] = []
    live: list[TurnEvent] = []
    async with store.subscribe(KEY, after_seq=1) as replay, store.subscribe(KEY) as newest:
        # Commits that race the backlog read are neither lost nor doubled.
        await commit_events(store, KEY, "t1", 2)
        async with asyncio.timeout(10):
            while len(got) < 4:
                got.append(await anext(replay))
            while len(live) < 2:
                live.append(await anext(newest))
        await commit_events(store, KEY, "t2", 1)
        async with asyncio.timeout(10):
            got.append(await anext(replay))
            live.append(await anext(newest))
    assert [e.seq for e in got] == [2, 3, 4, 5, 6]
    assert [e.seq for e in live] == [4, 5, 6]
    assert got[-1].turn_id == "t2" and isinstance(got[-1], TurnStarted)
    # An unknown session is no error: it has nothing yet.
    async with store.subscribe(SessionKey("agent", "none"), after_seq=0) as empty:
        assert empty.cursor == 0


async def check_live_events_are_slotted_after_their_durable_event(store: SessionStore) -> None:
    """Live events (``publish_live``) reach this process's subscribers that take them, right
    after the durable event whose ``seq`` they carry: one published before that event waits
    for it, one whose durable successor was handed over is dropped; a subscription made
    with ``live=False`` gets none."""
    ids = event_ids("t1")
    await commit_events(store, KEY, "t1", 1)
    got: list[TurnEvent] = []
    plain: list[TurnEvent] = []
    async with store.subscribe(KEY, after_seq=0) as sub, \
            store.subscribe(KEY, after_seq=0, live=False) as durable_only:
        async with asyncio.timeout(10):
            got.append(await anext(sub))
            plain.append(await anext(durable_only))
        assert store.wants_live(KEY), "a subscriber takes live events: a turn must make them"
        store.publish_live(MessageDelta(**ids, seq=1, text="a"))
        store.publish_live(MessageDelta(**ids, seq=2, text="early"))  # its event is not in yet
        await commit_events(store, KEY, "t1", 1)
        store.publish_live(MessageDelta(**ids, seq=1, text="late"))  # after seq 2: dropped
        store.publish_live(MessageDelta(**ids, seq=2, text="b"))
        await commit_events(store, KEY, "t1", 1)
        async with asyncio.timeout(10):
            while not got or got[-1].seq != 3 or not got[-1].durable:
                got.append(await anext(sub))
            while len(plain) < 3:
                plain.append(await anext(durable_only))
    assert [(e.seq, getattr(e, "text", "")) for e in got] == [
        (1, "e1"), (1, "a"), (2, "e2"), (2, "early"), (2, "b"), (3, "e3")]
    assert [e.type for e in got].count("message.delta") == 3
    assert [e.seq for e in plain] == [1, 2, 3] and all(e.durable for e in plain)


async def check_watchers_hear_commits_and_cancels(store: SessionStore) -> None:
    """Watchers hear this process's commits (the events) and other changes (None) until they stop
    watching."""
    await store.enqueue(KEY, NewEntry("t1", opening("t1")))
    heard: list[list[TurnEvent] | None] = []
    stop = store.watch(KEY, heard.append)
    lease = await store.claim(KEY)
    async with lease.transaction() as tx:
        done = tx.add_event(TurnCompleted(**event_ids("t1"), text="ok"))
    await lease.release()
    # ``None`` ("look again") may come at any time; committed events come as a list.
    assert [[e.seq for e in h] for h in heard if h is not None] == [[done.seq]]
    await store.enqueue(KEY, NewEntry("t2", opening("t2")))
    heard.clear()
    await store.request_cancel(KEY, "t2", "stop")
    assert None in heard
    stop()
    n = len(heard)
    await store.request_cancel(KEY, None, "again")
    assert len(heard) == n


__all__ = [
    "check_lease_is_exclusive",
    "check_live_events_are_slotted_after_their_durable_event",
    "check_ready_sessions_are_claimed_once",
    "check_subscribe_replays_then_goes_live",
    "check_two_holders_contend_for_one_session",
    "check_watchers_hear_commits_and_cancels",
]
