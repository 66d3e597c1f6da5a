"""Crash safety (F2, F3): a real child process, SIGKILL at a checkpoint boundary, then the
same turn delivered again (or ``Runtime.recover()``) in a new process.

After every recovery the turn must have completed exactly as an uninterrupted run would:
one opening message, each call answered once, each local row written once, each remote
effect at least once overall and at most once per delivery (with the same idempotency key),
and no text of a model step committed before the kill streamed again.

The children are ``tests/crashkit.py``; see its docstring for the agent and the kill points.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import crashkit
from crashkit import (
    CHILD_TIMEOUT,
    FINAL_TEXT,
    LOCAL_CALLS,
    REMOTE_CALLS,
    SCRIPT,
    STEPS,
    TURN_ID,
    State,
    crash,
    deliver,
    load,
    spawn,
    wait_for,
)
from durable_turns import SessionKey, SqliteStore
from recovery import assert_every_call_answered_once, check_recovered


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "shop.sqlite"


async def crash_then_redeliver(db: Path, kill: str) -> tuple[State, State]:
    """Kill a first delivery at ``kill``; deliver the turn again; check; return both states."""
    crash(db, "crash", kill)
    before = await load(db)
    # The crashed child really streamed what it committed (the recorder works).
    assert crashkit.deltas(db, "crash").startswith("".join(before.replies()))
    assert before.turn is not None and before.turn.status == "running"
    return before, await crash_then_redeliver_from(db, before)


async def crash_then_redeliver_from(db: Path, before: State) -> State:
    rep = deliver(db, "replay")
    assert (rep["status"], rep["text"], rep["new"]) == ("completed", FINAL_TEXT, False)
    after = await load(db)
    check_recovered(db, before, after, ["crash"], "replay")
    return after


# -- (2) after each committed step ---------------------------------------------------------------


@pytest.mark.parametrize("k", range(STEPS))
async def test_kill_after_each_committed_step(db: Path, k: int) -> None:
    """k = 0 is right after the opening committed; then each model and tool step."""
    before, _ = await crash_then_redeliver(db, f"step:{k}")
    assert len(before.replies()) + len(before.tool_results()) == k


async def test_kill_after_the_last_step_then_redelivery_replays_nothing(db: Path) -> None:
    crash(db, "crash", f"step:{STEPS}")
    before = await load(db)
    assert before.turn is not None and before.turn.status == "completed"
    rep = deliver(db, "replay")
    assert (rep["status"], rep["text"], rep["new"]) == ("completed", FINAL_TEXT, False)
    after = await load(db)
    check_recovered(db, before, after, ["crash"], "replay")
    assert after.messages == before.messages and after.events == before.events
    assert crashkit.events(db, "replay") == []


async def test_kill_right_after_start_returned(db: Path) -> None:
    crash(db, "crash", "accepted")
    before = await load(db)
    assert before.turn is not None and before.turn.status == "queued"
    assert before.messages == [] and crashkit.events(db, "crash") == []
    await crash_then_redeliver_from(db, before)


# -- (3) inside a batch --------------------------------------------------------------------------


async def test_kill_inside_a_batch_resumes_the_remaining_calls_only(db: Path) -> None:
    # c3, c4, c5 are one assistant message's calls; die after c4 (the 2nd) committed.
    k = 1 + 1 + 1 + 1 + 1 + 2  # model, c1, model, c2, model, then c3 and c4
    before, after = await crash_then_redeliver(db, f"step:{k}")
    assert before.tool_results() == {"c1", "c2", "c3", "c4"}
    crash_pid = next(r[2] for r in before.rows if r[0] == "c3")
    rows = {r[0]: r[2] for r in after.rows}
    assert rows["c3"] == crash_pid and rows["c5"] != crash_pid
    by_call = {e["call"]: e["tag"] for e in crashkit.effects(db)}
    assert by_call == {"c2": "crash", "c4": "crash"}
    # The replay streamed only the final reply: the batch's reply was cached.
    assert crashkit.deltas(db, "replay") == FINAL_TEXT


# -- (1) inside a local tool, after its write, before the commit --------------------------------


@pytest.mark.parametrize("call", LOCAL_CALLS)
async def test_kill_inside_a_local_tool_rolls_its_write_back(db: Path, call: str) -> None:
    before, after = await crash_then_redeliver(db, f"local:{call}")
    assert call not in {r[0] for r in before.rows}, "the uncommitted row survived the kill"
    assert call not in before.tool_results()
    writer = next(r[2] for r in after.rows if r[0] == call)
    assert writer == crashkit.report(db, "replay")["pid"]


# -- (5) inside a remote tool, after its effect, before the commit ------------------------------


@pytest.mark.parametrize("call", REMOTE_CALLS)
async def test_kill_inside_a_remote_tool_repeats_it_with_the_same_key(
    db: Path, call: str
) -> None:
    before, _ = await crash_then_redeliver(db, f"remote:{call}")
    assert call not in before.tool_results()
    lines = [e for e in crashkit.effects(db) if e["call"] == call]
    assert [e["tag"] for e in lines] == ["crash", "replay"]  # at least once: here twice
    assert lines[0]["key"] == lines[1]["key"] and lines[0]["pid"] != lines[1]["pid"]


# -- (4) at a model call -----------------------------------------------------------------------


@pytest.mark.parametrize("i", range(len(SCRIPT)))
async def test_kill_inside_the_model_function(db: Path, i: int) -> None:
    before, _ = await crash_then_redeliver(db, f"model:{i}")
    assert len(before.replies()) == i
    # Earlier calls' text was streamed by the crashed child, and never again.
    assert crashkit.deltas(db, "crash") == "".join(r.text for r in SCRIPT[:i])
    assert crashkit.deltas(db, "replay") == "".join(r.text for r in SCRIPT[i:])


@pytest.mark.parametrize("i", range(len(SCRIPT)))
async def test_kill_while_the_model_streams(db: Path, i: int) -> None:
    before, _ = await crash_then_redeliver(db, f"stream:{i}")
    assert len(before.replies()) == i
    streamed = crashkit.deltas(db, "crash")
    committed = "".join(r.text for r in SCRIPT[:i])
    partial = streamed[len(committed):]
    assert partial and SCRIPT[i].text.startswith(partial) and partial != SCRIPT[i].text
    # The interrupted reply was never committed, so it streams again, whole.
    assert crashkit.deltas(db, "replay") == "".join(r.text for r in SCRIPT[i:])


# -- recover() instead of a redelivery ----------------------------------------------------------


@pytest.mark.parametrize(
    "kill", ["accepted", "step:0", "step:4", "local:c3", "remote:c4", "model:2", "stream:3"]
)
async def test_recover_in_a_new_process_finishes_the_turn(db: Path, kill: str) -> None:
    crash(db, "crash", kill)
    before = await load(db)
    rep = deliver(db, "recovery", "--recover")
    assert (rep["status"], rep["text"]) == ("completed", FINAL_TEXT)
    check_recovered(db, before, await load(db), ["crash"], "recovery")


# -- more than one crash -----------------------------------------------------------------------


async def test_a_replay_killed_again_is_replayed_again(db: Path) -> None:
    crash(db, "crash1", "local:c3")
    crash(db, "crash2", "remote:c4")
    before = await load(db)
    assert before.tool_results() == {"c1", "c2", "c3"}
    rep = deliver(db, "replay")
    assert (rep["status"], rep["new"]) == ("completed", False)
    check_recovered(db, before, await load(db), ["crash1", "crash2"], "replay")
    c4 = [e["tag"] for e in crashkit.effects(db) if e["call"] == "c4"]
    assert c4 == ["crash2", "replay"]


# -- a delivery waiting on the lease takes over ------------------------------------------------


async def test_a_waiting_delivery_takes_over_when_the_driver_is_killed(db: Path) -> None:
    """No redelivery and no recover(): the second delivery, parked on the lease, finishes."""
    driver = spawn(db, "driver", "--hold", "c2")  # sits in c2, its side effect done
    waiter = None
    try:
        wait_for(lambda: (db.parent / "held-driver").exists() or driver.poll() is not None,
                 "the driver to sit inside the remote tool")
        assert driver.poll() is None, driver.communicate(timeout=CHILD_TIMEOUT)[1]
        waiter = spawn(db, "waiter")
        wait_for(lambda: crashkit.in_acquire(waiter, db) or waiter.poll() is not None,
                 "the second delivery to wait for the lease")
        assert waiter.poll() is None
        before = await load(db)  # stable: the driver holds the lease, nothing else can write
        assert before.tool_results() == {"c1"}
        killed = time.monotonic()
        os.kill(driver.pid, signal.SIGKILL)
        assert driver.wait(timeout=CHILD_TIMEOUT) == -signal.SIGKILL
        _, err = waiter.communicate(timeout=CHILD_TIMEOUT)
        assert (waiter.returncode, err) == (0, "")
    finally:
        for p in (driver, waiter):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.communicate(timeout=CHILD_TIMEOUT)
    rep = crashkit.report(db, "waiter")
    assert (rep["status"], rep["text"], rep["new"]) == ("completed", FINAL_TEXT, False)
    check_recovered(db, before, await load(db), ["driver"], "waiter")
    assert min(e["t"] for e in crashkit.events(db, "waiter")) > killed


# -- a turn that ends cancelled after a crash leaves no call unanswered --------------------------


@pytest.mark.parametrize("kill", ["step:0", "step:3", "remote:c4", "local:c3", "model:3"])
async def test_a_turn_cancelled_after_a_crash_answers_every_owed_call(db: Path, kill: str) -> None:
    crash(db, "crash", kill)
    before = await load(db)
    store = SqliteStore(db)
    await store.open()
    try:
        key = SessionKey(crashkit.AGENT, crashkit.SESSION)
        assert await store.request_cancel(key, TURN_ID, "stopped after the crash") == [TURN_ID]
    finally:
        await store.close()
    rep = deliver(db, "replay")
    assert (rep["status"], rep["new"]) == ("cancelled", False)
    after = await load(db)
    assert after.messages[: len(before.messages)] == before.messages
    assert_every_call_answered_once(after.messages)
    synthetic = after.messages[len(before.messages):]
    assert all(m.role == "tool" and m.result == {"cancelled": True} for m in synthetic)
    assert after.turn is not None and after.turn.reason == "stopped after the crash"
