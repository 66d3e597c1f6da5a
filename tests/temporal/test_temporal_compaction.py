"""F23 on Temporal: a long session's compaction is one more step of its workflow's activities;
a worker SIGKILLed after a compaction committed (inside the next model call) is replaced by
another, which goes on from the stored compaction and never summarises that head again.

A real Temporal dev server (the session's ``temporal_target``), workers in child processes
(``temporalkit``'s ``compact`` agent), the front runtime in the test's process driving
nothing.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from durable_turns import SqliteStore, TurnStatus
from durable_turns.compaction import SUMMARY_PREFIX
from temporalkit import WAIT, compact_agent, front, logged, queue, spawn, stop

TURNS = 40


async def test_a_worker_killed_after_a_compaction_never_summarises_it_again(
        temporal_target: str, tmp_path: Path) -> None:
    db, q = tmp_path / "db.sqlite", queue()
    agent, _ = compact_agent(tmp_path, kill=False)
    async with front(temporal_target, q, agent, SqliteStore(db)) as rt:
        s = rt.session("compact", "long")
        for i in range(TURNS):
            await s.start(f"read {i}", turn_id=f"t{i}")
        killer = spawn(temporal_target, q, tmp_path, "killer", "--db", str(db),
                       "--agent", "compact", "--kill", "in-model")
        await asyncio.to_thread(killer.wait, WAIT)
        assert killer.returncode == -signal.SIGKILL, logged(tmp_path, "killer")
        summaries = tmp_path / "summaries"
        (first,) = summaries.read_text().split()  # one summary, committed, then killed
        assert int(first) == killer.pid
        rescuer = spawn(temporal_target, q, tmp_path, "rescuer", "--db", str(db),
                        "--agent", "compact")
        try:
            last = await s.result(f"t{TURNS - 1}", timeout=WAIT)
        finally:
            err = stop(rescuer, tmp_path, "rescuer")
        assert last.status == TurnStatus.COMPLETED, err
        results = [await s.result(f"t{i}", timeout=WAIT) for i in range(TURNS)]
        events = await s.events()
        context = await s.context()
        transcript = await s.transcript()
    assert all(r.status == TurnStatus.COMPLETED for r in results)
    assert len(transcript) == 4 * TURNS  # every message stays in the store
    summarised = [e.to_dict() for e in events if e.type == "context.compacted"
                  and e.to_dict()["summarised"]]
    calls = summaries.read_text().split()
    assert len(summarised) > 1 and len(calls) == len(summarised)  # none made twice
    assert calls[0] == first and str(killer.pid) not in calls[1:]
    assert context.messages[0].text == SUMMARY_PREFIX + summarised[-1]["summary"]
