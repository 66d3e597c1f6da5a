"""F5, F14: The store-backed event feed across processes, and store I/O kept off the event loop."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import crashkit
from conftest import assert_slotted
from durable_turns import Agent, ModelReply, Runtime, SqliteStore, scripted
from durable_turns.events import TurnEvent

AGENT, SESSION, TURN_ID = crashkit.AGENT, crashkit.SESSION, crashkit.TURN_ID


async def wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    """Wait until ``path`` exists (the child reached a point), failing if the child died."""
    async with asyncio.timeout(timeout):
        while not path.exists():
            assert proc.poll() is None, proc.communicate()
            await asyncio.sleep(0.005)


async def test_a_turn_driven_by_another_process_reaches_subscribers_here(tmp_path: Path) -> None:
    db = tmp_path / "shop.sqlite"
    cfg = crashkit.Config(db, "observer", crashkit.KillPoint(""), False, None)
    async with Runtime([crashkit.build_agent(cfg)], SqliteStore(db),
                       crashkit.build_model(cfg)) as rt:
        rt.store.unwrap().execute(crashkit.ORDERS_DDL)
        key = rt.key(AGENT, SESSION)
        seen: list[TurnEvent] = []
        unobserve = rt.session(AGENT, SESSION).observe(seen.append)
        async with rt.subscribe(key, after_seq=0) as sub:
            child = crashkit.spawn(db, "driver")
            try:
                got: list[TurnEvent] = []
                async with asyncio.timeout(60):
                    async for e in sub:
                        got.append(e)
                        if e.type == "turn.completed":
                            break
                    # result() here is woken by the same feed; the turn ended elsewhere.
                    res = await rt.session(AGENT, SESSION).result(TURN_ID)
                _, err = child.communicate(timeout=crashkit.CHILD_TIMEOUT)
                assert child.returncode == 0, err
            finally:
                if child.poll() is None:
                    child.kill()
                    child.communicate()
        unobserve()
        stored = await rt.store.read_events(key)
    assert (res.status, res.text) == ("completed", crashkit.FINAL_TEXT)
    assert crashkit.report(db, "driver")["pid"] != 0
    # Every durable event, in order, once; the driving process's live text comes too, each
    # piece right after the event it follows.
    assert_slotted(got, stored)
    assert [e.seq for e in got if e.durable] == list(range(1, len(stored) + 1))
    assert_slotted(seen, stored)



async def test_listeners_made_before_the_store_opens_hear_another_process(
    tmp_path: Path,
) -> None:
    """An observer and a subscriber made before the store opens a new file (it is migrated
    as it opens, so the open waits on a thread), for a session that does not exist yet, hear
    the whole turn another process then drives."""
    db = tmp_path / "fresh.sqlite"
    cfg = crashkit.Config(db, "observer", crashkit.KillPoint(""), False, None)
    rt = Runtime([crashkit.build_agent(cfg)], SqliteStore(db), crashkit.build_model(cfg))
    key = rt.key(AGENT, SESSION)
    seen: list[TurnEvent] = []
    ended = asyncio.Event()

    def observed(e: TurnEvent) -> None:
        seen.append(e)
        if e.type == "turn.completed":
            ended.set()

    unobserve = rt.session(AGENT, SESSION).observe(observed, turn_id=TURN_ID)
    sub = rt.subscribe(key)
    child: subprocess.Popen[str] | None = None
    try:
        await rt.open()
        async with sub:  # ready: the cursor is fixed at 0, before the child starts
            rt.store.unwrap().execute(crashkit.ORDERS_DDL)
            child = crashkit.spawn(db, "driver")
            _, err = await asyncio.to_thread(child.communicate, timeout=crashkit.CHILD_TIMEOUT)
            assert child.returncode == 0, err
            # The turn is stored by now: the feed has a few polls to bring it here.
            got: list[TurnEvent] = []
            async with asyncio.timeout(10):
                async for e in sub:
                    got.append(e)
                    if e.type == "turn.completed":
                        break
                await ended.wait()
        unobserve()
        stored = await rt.store.read_events(key)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.communicate()
        await rt.close()
    assert stored[0].type == "turn.started" and stored[-1].type == "turn.completed"
    assert_slotted(got, stored)
    assert_slotted(seen, stored)


HOLD_THE_LOCK = textwrap.dedent("""
    import sqlite3, sys, time, pathlib
    db, flag = sys.argv[1], pathlib.Path(sys.argv[2])
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    flag.touch()
    time.sleep(2.0)  # the scenario: another process holds the write lock for 2 s
    conn.execute("COMMIT")
    flag.with_suffix(".released").touch()
""")


async def test_the_loop_keeps_ticking_while_another_process_holds_the_write_lock(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.sqlite"
    model = scripted([ModelReply("done")] * 4)
    async with Runtime([Agent("ops")], SqliteStore(db), model) as rt:
        history = rt.session("ops", "history")
        await history.turn("earlier", turn_id="h1")
        stored = await history.events()
        known = rt.session("ops", "known")  # its next accept and claim are one statement each
        await known.turn("earlier", turn_id="k1")
        flag = tmp_path / "locked"
        holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(db), str(flag)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            await wait_for_file(flag, holder)
            beats: list[float] = []
            stop = asyncio.Event()

            async def heartbeat() -> None:
                while not stop.is_set():
                    beats.append(time.monotonic())
                    await asyncio.sleep(0.01)

            ticking = asyncio.create_task(heartbeat())
            # A write waits for the lock on the store's writer thread...
            started = asyncio.create_task(rt.session("ops", "new").turn("hello"))
            again = asyncio.create_task(known.turn("again", turn_id="k2"))
            # ...while reads and subscribers of other sessions go on.
            got: list[TurnEvent] = []
            async with asyncio.timeout(30), rt.subscribe(history.key, after_seq=0) as sub:
                async for e in sub:
                    got.append(e)
                    if len(got) == len(stored):
                        break
            replayed_while_locked = not flag.with_suffix(".released").exists()
            assert await history.status() == "idle"
            async with asyncio.timeout(60):
                result = await started
                result_again = await again
            stop.set()
            await ticking
            _, err = holder.communicate(timeout=30)
            assert holder.returncode == 0, err
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.communicate()
    assert result.status == "completed" and result.text == "done"
    assert result_again.status == "completed"
    assert [e.to_dict() for e in got] == [e.to_dict() for e in stored]
    assert replayed_while_locked
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    # The lock was held for 2 s: a loop blocked by SQLite would show a gap that long. The
    # typical gap (about 10 ms) is a benchmark's business (bench/feed.py), not this test's.
    assert beats and max(gaps) < 1.0, max(gaps)
