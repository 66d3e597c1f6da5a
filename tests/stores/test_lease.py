"""The session lease across real processes (F2): one driver at a time, freed by the kernel.

- While one process drives a session (parked inside a slow tool), another cannot take its
  lease; once that process is SIGKILLed, the lease is free at once.
- Processes that deliver the same turn at the same moment run every step exactly once and
  all report the same result.

The children are ``tests/crashkit.py`` (see its docstring).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

import crashkit
from crashkit import (
    AGENT,
    CALLS,
    FINAL_TEXT,
    LOCAL_CALLS,
    REMOTE_CALLS,
    SCRIPT,
    SESSION,
    TURN_ID,
    load,
    spawn,
    wait_for,
)
from durable_turns import SqliteStore
from durable_turns.errors import LeaseTimeoutError
from durable_turns.stores import SessionKey


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "shop.sqlite"


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=crashkit.CHILD_TIMEOUT)
    return proc.returncode, err


async def test_a_held_lease_refuses_others_until_its_process_is_killed(db: Path) -> None:
    holder = spawn(db, "a", "--hold", "c2")
    try:
        wait_for(lambda: (db.parent / "held-a").exists() or holder.poll() is not None,
                 "the child to sit inside the remote tool")
        assert holder.poll() is None, finish(holder)[1]
        store = SqliteStore(db)
        await store.open()
        try:
            key = SessionKey(AGENT, SESSION)
            t0 = time.monotonic()
            with pytest.raises(LeaseTimeoutError):
                await store.claim(key, timeout=0.2)
            assert time.monotonic() - t0 >= 0.2
            # The lease is per session: another session of the same file is free.
            other = await store.claim(SessionKey(AGENT, "s2"), timeout=0)
            await other.release()

            os.kill(holder.pid, signal.SIGKILL)
            assert finish(holder)[0] == -signal.SIGKILL
            lease = await store.claim(key, timeout=0)  # one try: free at once
            assert lease.key == key
            await lease.release()
        finally:
            await store.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            finish(holder)

    # The killed holder's turn is still there to finish, by a new delivery.
    rep = crashkit.deliver(db, "replay")
    assert (rep["status"], rep["text"]) == ("completed", FINAL_TEXT)


async def test_a_lease_held_by_this_process_blocks_a_child(db: Path) -> None:
    """The other direction: a child's delivery waits for the lease, and runs once it is free."""
    crashkit.crash(db, "crash", "step:0")  # creates the session and leaves its turn running
    store = SqliteStore(db)
    await store.open()
    try:
        lease = await store.claim(SessionKey(AGENT, SESSION), timeout=0)
        child = spawn(db, "waiter")
        try:
            wait_for(lambda: crashkit.in_acquire(child, db) or child.poll() is not None,
                     "the child to wait for the lease")
            assert child.poll() is None
            assert len((await load(db)).messages) == 1, "a step ran under another's lease"
            released = time.monotonic()
            await lease.release()
        finally:
            rc, err = finish(child)
        assert (rc, err) == (0, "")
    finally:
        await store.close()
    rep = crashkit.report(db, "waiter")
    assert (rep["status"], rep["new"]) == ("completed", False)
    assert min(e["t"] for e in crashkit.events(db, "waiter")) > released


@pytest.mark.parametrize("n", [2, 4])
async def test_processes_delivering_the_same_turn_at_once_run_each_step_once(
    db: Path, n: int
) -> None:
    tags = [f"p{i}" for i in range(n)]
    gate, release = os.pipe()
    procs = [spawn(db, tag, "--gate", gate=gate) for tag in tags]
    os.close(gate)
    try:
        wait_for(lambda: all((db.parent / f"ready-{t}").exists() or p.poll() is not None
                             for t, p in zip(tags, procs, strict=True)),
                 "every child to be ready")
        os.close(release)  # the barrier: every child reads EOF at once
        release = -1
        # The turn cannot end before the go file exists (the remote tool waits for it), so
        # every delivery below lands while the turn is still running in one of the children.
        wait_for(lambda: all((db.parent / f"delivered-{t}").exists() or p.poll() is not None
                             for t, p in zip(tags, procs, strict=True)),
                 "every child to have delivered the turn")
        (db.parent / "go").touch()
        outcomes = [finish(p) for p in procs]
    finally:
        if release >= 0:
            os.close(release)
        for p in procs:
            if p.poll() is None:
                p.kill()
                finish(p)
    assert outcomes == [(0, "")] * n

    reports = [crashkit.report(db, t) for t in tags]
    assert {(r["status"], r["text"]) for r in reports} == {("completed", FINAL_TEXT)}
    assert sorted(r["new"] for r in reports) == [False] * (n - 1) + [True]
    # They overlapped: no process saw the turn end before every delivery was in (ordering on
    # the system-wide monotonic clock, made certain by the go file, not by a timing window).
    assert max(r["t_delivered"] for r in reports) < min(r["t_done"] for r in reports)

    # Each step ran (and was published) in exactly one process.
    seen = Counter(e["type"] for t in tags for e in crashkit.events(db, t))
    assert seen["message.completed"] == len(SCRIPT)
    assert seen["action.completed"] == len(CALLS)
    assert seen["turn.started"] == seen["turn.completed"] == 1
    assert sum(len(crashkit.deltas(db, t)) for t in tags) == len("".join(r.text for r in SCRIPT))

    state = await load(db)
    assert state.turn is not None and state.turn.status == "completed"
    assert [m.role for m in state.messages].count("user") == 1
    assert Counter(m.call_id for m in state.messages if m.role == "tool") == dict.fromkeys(
        (c.id for c in CALLS), 1)
    assert Counter(r[0] for r in state.rows) == dict.fromkeys(LOCAL_CALLS, 1)
    assert Counter(e["call"] for e in crashkit.effects(db)) == dict.fromkeys(REMOTE_CALLS, 1)
    assert [e.seq for e in state.events] == list(range(1, len(state.events) + 1))
    assert {m.turn_id for m in state.messages} == {TURN_ID}
