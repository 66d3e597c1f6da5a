"""A child process for the schedules' PostgreSQL test: a worker that fires one store's
schedules at explicit times, one due time after another, as fast as it can (its clock is its
own: two of them disagree by whatever their pace makes it).

    python tests/schedulekit.py DSN WORK TAG END_ISO

It writes ``ready-TAG`` once open and waits for ``go-TAG`` (files in WORK); then, until every
fire time up to END is past: it fires what is due at the schedule's next time (or, when
another worker holds that schedule's claim, at when the claim runs out), printing one line
per fire it started. The runtime drives nothing (its turns stay queued: the test counts
them).
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import datetime
from pathlib import Path

from durable_turns import Agent, PostgresStore, Runtime
from durable_turns.scheduling import NoDriveScheduler
from durable_turns.testing import TestModel

TIMEOUT = 60.0


async def main(dsn: str, work: Path, tag: str, end: datetime) -> None:
    agent = Agent(name="ops", instructions="Report.", model=TestModel())
    runtime = Runtime([agent], PostgresStore(dsn), scheduler=NoDriveScheduler())
    async with runtime:
        (work / f"ready-{tag}").write_text("")
        deadline = time.monotonic() + TIMEOUT
        while not (work / f"go-{tag}").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("no go")
            await asyncio.sleep(0.005)
        while True:
            nxt = await runtime.fires.next_due()
            if nxt is None or nxt > end:
                break
            for fired in await runtime.fires.fire(nxt):
                print(fired.outcome, fired.turn_id, flush=True)
            if time.monotonic() > deadline:
                raise TimeoutError("the schedule did not reach its end")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3],
                     datetime.fromisoformat(sys.argv[4])))
