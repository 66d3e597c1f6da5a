"""How late schedules fire (F24): 1,000 schedules due in the same minute, on SQLite and on
PostgreSQL.

Usage (from the repository root, with the package installed)::

    python bench/schedules.py                   # SQLite (a temporary file)
    python bench/schedules.py --pg DSN          # and PostgreSQL (extra 'postgres')
    python bench/schedules.py -n 200 --quick    # fewer schedules, one run each
    python bench/schedules.py --json            # the same figures, machine-readable

For each store, two shapes of the same minute, each on a fresh database:

- **burst**: ``-n`` (1,000) one-time schedules (``at=``) all due at the same second, a few
  seconds ahead (a cron like ``0 9 * * *`` shared by every tenant);
- **spread**: the same number due over the minute's 60 seconds (about 17 a second).

One runtime on the machine's clock (``SystemClock``) fires them: its clock loop, woken at
the earliest due time, claims the due schedules (100 a claim; ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL) and starts each one's turn. The turns are not driven (``NoDriveScheduler``, the
clock loop started by hand): what is measured is the firing, not the model. Each fire is
timed by the public hook ``runtime.fires.on_fire``, called once its turn is durable and its
schedule has moved on: **lateness** is that moment minus the fire's nominal time. p50, p99
and the worst are printed per shape and store, with the fires per second of the burst.

Every schedule is checked to have fired once: one turn, whose id is the schedule's and its
time's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from durable_turns import Agent, Runtime, SqliteStore
from durable_turns.records import SessionKey
from durable_turns.schedule_fires import Fired
from durable_turns.schedules import Schedule, fire_turn_id
from durable_turns.scheduling import NoDriveScheduler
from durable_turns.stores import SessionStore
from durable_turns.testing import TestModel

LEAD = 3.0
"""Seconds between the last schedule stored and the first fire time (whole seconds)."""


def _store(kind: str, dsn: str | None, folder: Path) -> SessionStore:
    if kind == "sqlite":
        return SqliteStore(folder / f"schedules-{time.monotonic_ns()}.db")
    import psycopg

    from durable_turns import PostgresStore

    assert dsn is not None
    schema = f"bench_schedules_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    return PostgresStore(psycopg.conninfo.make_conninfo(dsn, options=f"-csearch_path={schema}"))


async def run(kind: str, shape: str, n: int, dsn: str | None, folder: Path) -> dict[str, Any]:
    agent = Agent(name="ops", instructions="Report.", model=TestModel())
    runtime = Runtime([agent], _store(kind, dsn, folder), scheduler=NoDriveScheduler())
    late: list[float] = []
    done = asyncio.Event()

    async def timed(schedule: Schedule, fired: Fired) -> None:
        assert fired.at is not None
        late.append(time.time() - fired.at.timestamp())
        if len(late) == n:
            done.set()

    async with runtime:
        runtime.fires.on_fire(timed)
        # Stored first (not timed), a little ahead of the first fire, on a whole second.
        first = datetime.fromtimestamp(int(time.time() + LEAD + n / 200) + 1, UTC)
        times = [first + timedelta(seconds=(i * 60 // n) if shape == "spread" else 0)
                 for i in range(n)]
        for i, at in enumerate(times):
            await runtime.schedule(f"s{i:05d}", agent="ops", seed="Report", at=at)
        if time.time() > first.timestamp():
            raise SystemExit(f"storing {n} schedules took past their time: raise LEAD")
        runtime.clock_loop.start()
        await asyncio.wait_for(done.wait(), 60 + LEAD + 120)
        burst = max(late) if shape == "burst" else None
        for i, at in enumerate(times):  # each fired once: its one turn
            key = SessionKey("ops", f"schedule:s{i:05d}")
            ids = [e.turn_id for e in await runtime.store.entries(key)]
            assert ids == [fire_turn_id(f"s{i:05d}", at)], ids
    q = statistics.quantiles(late, n=100)
    return {"store": kind, "shape": shape, "schedules": n, "p50_ms": q[49] * 1000,
            "p99_ms": q[98] * 1000, "max_ms": max(late) * 1000,
            "fires_per_s": n / burst if burst else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=1000, help="schedules (default %(default)s)")
    p.add_argument("--pg", metavar="DSN", help="also on PostgreSQL")
    p.add_argument("--quick", action="store_true", help="the burst only")
    p.add_argument("--json", action="store_true", help="machine-readable")
    args = p.parse_args()
    kinds = ["sqlite", *(["postgres"] if args.pg else [])]
    shapes = ["burst"] if args.quick else ["burst", "spread"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            for shape in shapes:
                rows.append(asyncio.run(run(kind, shape, args.n, args.pg, Path(tmp))))
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"rows": rows, "load": load}))
        return
    print(f"{'store':<10} {'shape':<7} {'n':>6} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} "
          f"{'fires/s':>8}")
    for r in rows:
        rate = f"{r['fires_per_s']:8.0f}" if r["fires_per_s"] else f"{'':>8}"
        print(f"{r['store']:<10} {r['shape']:<7} {r['schedules']:>6} {r['p50_ms']:9.1f} "
              f"{r['p99_ms']:9.1f} {r['max_ms']:9.1f} {rate}")
    print(f"load average {load:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
