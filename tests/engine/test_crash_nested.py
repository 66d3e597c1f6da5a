"""Crash safety of subagents (F13) and parallel batches (F15): a real SIGKILL, then the
same turn delivered again in a new process."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from crashkit_nested import TURN_ID, run
from durable_turns import SqliteStore
from durable_turns.messages import Message
from durable_turns.stores import SessionKey


def rows(db: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(db) as c:
        return list(c.execute("SELECT session, call_id, pid FROM rows"))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def report(db: Path, tag: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((db.parent / f"report-{tag}.json").read_text())
    return out


def killed(p: Any) -> bool:
    return bool(p.returncode == -signal.SIGKILL)


@pytest.mark.parametrize("kill", ["child-model", "child-local", "child-step"])
def test_a_crash_inside_the_child_replays_into_the_same_child(tmp_path: Path,
                                                              kill: str) -> None:
    db = tmp_path / "store.sqlite"
    first = run(db, "subagent", "crash", kill)
    assert killed(first), first.stderr
    again = run(db, "subagent", "replay")
    assert again.returncode == 0, again.stderr
    assert report(db, "replay") == {"status": "completed", "error": None,
                                    "text": "Helper: {'answer': 'Recorded once.'}"}
    helper_sessions, child_turns, lead_steps, forwarded, child_seqs = asyncio.run(
        read_subagent(db))
    # Every event of the child is in the parent's stream once, in order, however the
    # forwarding was cut by the crash.
    assert forwarded == child_seqs
    assert len(helper_sessions) == 1 and len(child_turns) == 1
    assert [s for s in lead_steps if s.startswith("child:")] == [f"child:{TURN_ID}:s1"]
    # The child's local tool wrote its row exactly once (the killed write rolled back).
    written = rows(db)
    assert len(written) == 1 and written[0][:2] == (helper_sessions[0].session, "h1")
    crashed_pid = lines(tmp_path / "events.jsonl")[0]["pid"]
    # Killed before its step committed, the row is the replay's; after, the first's.
    assert (written[0][2] == crashed_pid) is (kill == "child-step")


async def read_subagent(db: Path) -> tuple[list[SessionKey], list[str], list[str], list[int],
                                           list[int]]:
    store = SqliteStore(db)
    await store.open()
    try:
        helpers = await store.list_sessions("helper")
        turns = [t.turn_id for k in helpers for t in await store.entries(k) if t.kind == "turn"]
        lead = SessionKey("lead", "s1")
        steps = list(await store.read_steps(lead))
        forwarded = [e.child["seq"] for e in await store.read_events(lead) if e.child]
        child_seqs = [e.seq for k in helpers for e in await store.read_events(k)]
        return helpers, turns, steps, forwarded, child_seqs
    finally:
        await store.close()


async def read_transcript(db: Path) -> list[Message]:
    store = SqliteStore(db)
    await store.open()
    try:
        return await store.read_messages(SessionKey("ops", "s1"))
    finally:
        await store.close()


def test_a_crash_mid_batch_replays_only_the_calls_that_had_not_committed(
        tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    first = run(db, "parallel", "crash", "batch")
    assert killed(first), first.stderr
    events = lines(tmp_path / "events.jsonl")
    crashed_pid = events[0]["pid"]
    assert sorted(e["call"]["id"] for e in events if e["type"] == "action.completed") == [
        "c2", "c3", "c4"]
    again = run(db, "parallel", "replay")
    assert again.returncode == 0, again.stderr
    assert report(db, "replay")["status"] == "completed"
    effects = Counter(e["call"] for e in lines(tmp_path / "effects.jsonl"))
    assert effects == {"c1": 2, "c2": 1, "c3": 1}  # only c1 ran again
    assert [r[1] for r in rows(db)] == ["c4"]  # the local call: once
    replayed = [e for e in lines(tmp_path / "events.jsonl") if e["pid"] != crashed_pid]
    assert [e["call"]["id"] for e in replayed if e["type"] == "action.completed"] == ["c1"]
    msgs = asyncio.run(read_transcript(db))
    assert [m.call_id for m in msgs if m.role == "tool"] == ["c1", "c2", "c3", "c4"]
