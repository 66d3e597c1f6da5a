"""F24 on PostgreSQL: two worker processes and one due schedule fire each of its 50 times
once, with one worker SIGKILLed mid-way (its claim runs out; the other fires on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durable_turns import Agent, PostgresStore, Runtime
from durable_turns.records import SessionKey
from durable_turns.schedules import fire_turn_id
from durable_turns.scheduling import NoDriveScheduler
from durable_turns.testing import TestModel

KIT = Path(__file__).parents[1] / "schedulekit.py"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
TIMEOUT = 60.0


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, f"timed out waiting for {path.name}"
        time.sleep(0.01)


async def test_two_workers_fire_each_time_once_with_one_killed(pg_dsn: str,
                                                              tmp_path: Path) -> None:
    agent = Agent(name="ops", instructions="Report.", model=TestModel())
    async with Runtime([agent], PostgresStore(pg_dsn), scheduler=NoDriveScheduler()) as r:
        await r.fires.define("report", agent="ops", seed="Report", every=60,
                             overlap="queue", missed="run_once", now=T0)
    end = T0 + timedelta(minutes=50)
    procs = [subprocess.Popen([sys.executable, str(KIT), pg_dsn, str(tmp_path), tag,
                               end.isoformat()], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for tag in ("a", "b")]
    try:
        for tag, p in zip("ab", procs, strict=True):
            _wait_for(tmp_path / f"ready-{tag}", p)
        # Worker a fires first; b joins once a has started 5 fires, and a is killed at its
        # 8th, while both fire (so a's kill lands mid-way whatever the two workers' pace).
        (tmp_path / "go-a").write_text("")
        victim = procs[0]
        assert victim.stdout is not None
        started = 0
        deadline = time.monotonic() + TIMEOUT
        while started < 8:
            line = victim.stdout.readline()
            assert line, f"worker a ended early: {victim.stderr.read() if victim.stderr else ''}"
            started += line.startswith("started")
            if started == 5 and not (tmp_path / "go-b").exists():
                (tmp_path / "go-b").write_text("")
            assert time.monotonic() < deadline
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(TIMEOUT)
        out, err = procs[1].communicate(timeout=TIMEOUT)
        assert procs[1].returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(TIMEOUT)
            for pipe in (p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()
    async with Runtime([agent], PostgresStore(pg_dsn), scheduler=NoDriveScheduler()) as r:
        ids = [e.turn_id for e in await r.store.entries(SessionKey("ops", "schedule:report"))]
        (s,) = await r.schedules()
    assert len(ids) == len(set(ids)) == 50
    assert ids == [fire_turn_id("report", T0 + timedelta(minutes=n)) for n in range(1, 51)]
    assert s.next_fire == T0 + timedelta(minutes=51)
    assert out.count("started") >= 1  # the survivor fired after the kill
    # (A fire the victim had claimed when it died is fired by the survivor once its claim ran
    # out: missed="run_once" fires a time found late.)
