"""Make ``fixtures/v4_store.sqlite`` and ``fixtures/v4_store.json``: a store of schema
version 4 (the step log and its transcript copies) written by the engine of that time, and
what its reads returned then.

Run it with the durable_turns of schema version 4 (commit ce07366) on the path::

    git archive ce07366 src | tar -x -C /tmp/v4
    PYTHONPATH=/tmp/v4/src:tests python tests/v4_store.py

``tests/stores/test_migration.py`` opens a copy of the file with today's code (SQLite, and
PostgreSQL filled with the same rows) and checks that every read returns what the JSON
recorded, then goes on writing.

The sessions: those of ``v2_store`` (a reset, a park answered, a parallel batch, a turn left
parked), and ``ops/s4``, which ran twelve turns of two tool calls each: more messages than a
``log_transcript`` row holds, so the file has transcript copies.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from durable_turns import Runtime, SqliteStore
from durable_turns.records import SessionKey
from v2_store import SESSIONS, dump, write_sessions

HERE = Path(__file__).parent / "fixtures"
V4_SESSIONS = [*SESSIONS, SessionKey("ops", "s4")]


async def long_session(rt: Runtime) -> None:
    """``ops/s4``: twelve turns of two tool calls each."""
    s4 = rt.session("ops", "s4")
    for k in range(12):
        assert (await s4.turn(f"look {k}", turn_id=f"l{k}")).status == "completed"


async def main() -> None:
    db = HERE / "v4_store.sqlite"
    for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}-lease")):
        p.unlink(missing_ok=True)
    await write_sessions(db, long_session)
    store = SqliteStore(db)
    await store.open()
    try:
        expected = await dump(store, V4_SESSIONS)
        c = store.unwrap()
        version = c.execute("PRAGMA user_version").fetchone()[0]
        copies = c.execute("SELECT count(*) FROM log_transcript").fetchone()[0]
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        await store.close()
    if version != 4 or not copies:
        sys.exit(f"made schema version {version} ({copies} transcript rows): run this with "
                 "the durable_turns of version 4")
    for p in (Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}-lease")):
        p.unlink(missing_ok=True)
    (HERE / "v4_store.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
