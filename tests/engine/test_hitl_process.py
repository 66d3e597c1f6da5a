"""F6: A park outlives its process; many sessions park side by side in one runtime.

What a parked session costs in memory is measured by ``bench/parked.py``, not asserted here.
"""

from __future__ import annotations

import asyncio
import signal
import sys
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
from durable_turns.stores import SessionKey

WAIT = 30.0
"""The bound on every wait on a child process: a backstop against a hang."""

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


async def spawn(db: Path, effects: Path, mode: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(db), str(effects), mode, stdout=asyncio.subprocess.PIPE)


async def killed(proc: asyncio.subprocess.Process) -> int:
    """SIGKILL ``proc`` if it still runs; its exit code once it is reaped."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGKILL)
    await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode is not None
    return proc.returncode


@tool
async def issue_refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund once approved (the test process's copy of the child's tool)."""
    ok = await ctx.request_input("approve", f"Refund {order_id}?", schema={"type": "boolean"})
    return {"refunded": ok}


async def test_park_in_one_process_resume_in_another_after_sigkill(tmp_path: Path) -> None:
    db, effects = tmp_path / "db.sqlite", tmp_path / "effects"
    child = await spawn(db, effects, "park")
    try:
        assert child.stdout is not None
        assert (await asyncio.wait_for(child.stdout.readline(), WAIT)).strip() == b"suspended"
    finally:
        await killed(child)
    # the resumer is killed after the refund's effect, before its step commits
    resumer = await spawn(db, effects, "kill-after-refund")
    try:
        await asyncio.wait_for(resumer.wait(), WAIT)
    finally:
        assert await killed(resumer) == -signal.SIGKILL
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


async def test_a_thousand_sessions_park_side_by_side_and_each_can_be_resumed(
    tmp_path: Path,
) -> None:
    replies = [ModelReply("", [ToolCall("c1", "issue_refund", {"order_id": "42"})]),
               ModelReply("refunded")]
    rt = Runtime([Agent("ops", "", [issue_refund])],
                 SqliteStore(tmp_path / "db.sqlite", synchronous="OFF"), scripted(replies))
    n = 1_000
    turns: dict[int, str] = {}
    for first in range(0, n, 500):  # 500 turns in flight at once
        batch = range(first, min(first + 500, n))
        for i in batch:
            turns[i] = (await rt.session("ops", f"s{i}").start("refund 42")).turn_id
        for i in batch:
            r = await asyncio.wait_for(rt.session("ops", f"s{i}").result(turns[i]), WAIT)
            assert r.status == "suspended" and r.request is not None
            assert r.request.id == "approve"
    await asyncio.wait_for(rt.idle(), WAIT)
    parked = set(await rt.store.find_sessions("parked"))
    assert parked == {SessionKey("ops", f"s{i}") for i in range(n)}
    # Parked, each is still there to answer: the first, one in the middle and the last.
    for i in (0, n // 2, n - 1):
        s = rt.session("ops", f"s{i}")
        pending = await s.pending()
        assert pending is not None and (pending.id, pending.turn_id) == ("approve", turns[i])
        await s.resume(turns[i], "approve", True)
        r = await asyncio.wait_for(s.result(turns[i]), WAIT)
        assert (r.status, r.text) == ("completed", "refunded")
        assert await s.pending() is None
    assert len(await rt.store.find_sessions("parked")) == n - 3
    await rt.close()
