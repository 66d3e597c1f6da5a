"""A child process for the Durable Object fake's crash tests: it writes, then SIGKILLs itself
at the moment its argument names, so the parent can see what a crash there keeps.

``python storage_child.py FILE MOMENT``, MOMENT one of:

- ``implicit-no-await``: a write outside any transaction, killed before the next turn of the
  event loop;
- ``implicit-after-await``: the same write, killed after an await;
- ``store-step``: a :class:`~durable_turns.cloudflare.DurableObjectStore` step whose local
  tool wrote a row, killed after an await between the tool and the step's commit.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from durable_turns.cloudflare import DurableObjectStore
from durable_turns.cloudflare.testing import DurableObjectStorage
from durable_turns.records import NewEntry, SessionKey
from durable_turns.testing.helpers import opening


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


async def main(path: str, moment: str) -> None:
    storage = DurableObjectStorage(path)
    if moment.startswith("implicit"):
        storage.sql.exec("INSERT INTO rows (v) VALUES (?)", moment)
        if moment == "implicit-after-await":
            await asyncio.sleep(0.01)
        _die()
    store = DurableObjectStore(storage)
    await store.open()
    key = SessionKey("agent", "s1")
    await store.enqueue(key, NewEntry("t1", opening("t1")))
    lease = await store.claim(key)
    await asyncio.sleep(0.01)  # what came before the step is committed

    def tool(h: Any) -> None:
        h.exec("INSERT INTO rows (v) VALUES (?)", "tool")

    async with lease.transaction() as tx:
        await tx.run_local(tool)
        await asyncio.sleep(0.01)  # a real await: an implicit transaction would commit here
        print("tool ran", flush=True)
        _die()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
