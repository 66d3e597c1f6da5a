"""A park outlives its process; parked sessions cost a runtime no memory."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from durable_turns import (
    Agent,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)

CHILD = """
import asyncio, os, signal, sys, pathlib
from durable_turns import (
    Agent,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)

db, effects, mode = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]

@tool
async def issue_refund(order_id: str, ctx: ToolContext) -> dict:
    '''Refund once approved.'''
    ok = await ctx.request_input("approve", f"Refund {order_id}?", schema={"type": "boolean"})
    with effects.open("a") as f:
        f.write(f"refund {order_id} {ctx.idempotency_key} {os.getpid()}\\n")
    if mode == "kill-after-refund":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"refunded": ok}

model = scripted([ModelReply("", [ToolCall("c1", "issue_refund", {"order_id": "42"})]),
                  ModelReply("done")])

async def main():
    rt = Runtime([Agent("ops", "", [issue_refund])], SqliteStore(db), model)
    s = rt.session("ops", "s1")
    if mode == "park":
        await s.start("refund 42", turn_id="t1")
        r = await s.result("t1")
        print(r.status, flush=True)
        await asyncio.Event().wait()   # stays alive until SIGKILLed
    else:
        await s.resume("t1", "approve", True)
        await s.result("t1")

asyncio.run(main())
"""


def spawn(db: Path, effects: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(db), str(effects), mode],
                            stdout=subprocess.PIPE, text=True)


@tool
async def issue_refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund once approved (the test process's copy of the child's tool)."""
    ok = await ctx.request_input("approve", f"Refund {order_id}?", schema={"type": "boolean"})
    return {"refunded": ok}


async def test_park_in_one_process_resume_in_another_after_sigkill(tmp_path: Path) -> None:
    db, effects = tmp_path / "db.sqlite", tmp_path / "effects"
    child = spawn(db, effects, "park")
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "suspended"
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    # the resumer is killed after the refund's effect, before its step commits
    resumer = spawn(db, effects, "kill-after-refund")
    assert resumer.wait() == -signal.SIGKILL
    assert resumer.stdout is not None
    resumer.stdout.close()
    lines = effects.read_text().splitlines()
    assert len(lines) == 1
    # a third process redelivers: the stored answer is still there, the tool runs again
    rt = Runtime([Agent("ops", "", [issue_refund])], SqliteStore(db),
                 scripted([ModelReply("", [ToolCall("c1", "issue_refund", {"order_id": "42"})]),
                           ModelReply("done")]))
    s = rt.session("ops", "s1")
    await s.start("refund 42", turn_id="t1")
    r = await s.result("t1")
    assert (r.status, r.text) == ("completed", "done")
    results = [m.result for m in await s.transcript() if m.role == "tool"]
    assert results == [{"refunded": True}]
    assert len({line.split()[2] for line in lines}) == 1  # one idempotency key
    await rt.close()


async def test_ten_thousand_parked_sessions_hold_no_memory_in_the_runtime(tmp_path: Path) -> None:
    replies = [ModelReply("", [ToolCall("c1", "issue_refund", {"order_id": "42"})])]
    rt = Runtime([Agent("ops", "", [issue_refund])],
                 SqliteStore(tmp_path / "db.sqlite", synchronous="OFF"), scripted(replies))

    async def park(first: int, count: int) -> None:
        for start in range(first, first + count, 500):
            batch = range(start, min(start + 500, first + count))
            turns = [await rt.session("ops", f"s{i}").start("refund 42") for i in batch]
            for i, t in zip(batch, turns, strict=True):
                assert (await rt.session("ops", f"s{i}").result(t.turn_id)).status == "suspended"
        await rt.idle()

    await park(0, 500)  # warm up: caches, statements, the transcript LRU fills
    gc.collect()
    blocks, objects = sys.getallocatedblocks(), len(gc.get_objects())
    t0 = time.monotonic()
    await park(500, 10_000)
    elapsed = time.monotonic() - t0
    gc.collect()
    grown = sys.getallocatedblocks() - blocks
    # 10,000 more parked sessions: what the runtime holds must not grow with them (a
    # session kept in memory would cost dozens of blocks and objects each)
    assert grown < 2_000, f"{grown} more memory blocks after 10,000 parks"
    assert len(gc.get_objects()) - objects < 1_000
    assert not rt._pumps and not rt._waiters and not rt._engines
    assert len(rt._cache) <= 64
    parked = rt.store.unwrap().execute(
        "SELECT count(*) FROM sessions WHERE status = 'suspended'").fetchone()[0]
    assert parked == 10_500
    print(f"parked 10,000 sessions in {elapsed:.1f}s; {grown} more memory blocks")
    await rt.close()
