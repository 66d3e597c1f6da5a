"""F24: a sleep outlives its process. A turn sleeps 2 s, its process is SIGKILLed while it
sleeps, and a new process started after the wake time wakes it as it opens (a wake-up due
while no process ran fires when one starts): the tool's body ran twice, the effect after
its sleep once."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from datetime import datetime
from pathlib import Path

from durable_turns.clock import SystemClock

WAIT = 30.0
"""The bound on every wait on a child process: a backstop against a hang."""

CHILD = """
import asyncio, json, pathlib, sys
from durable_turns import Agent, ModelReply, Runtime, SqliteStore, ToolCall, ToolContext
from durable_turns import scripted, tool

db, effects, mode = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]

@tool
async def nap(seconds: float, ctx: ToolContext) -> str:
    '''Sleep, then act.'''
    with effects.open("a") as f:
        f.write("body\\n")
    await ctx.sleep(seconds)
    with effects.open("a") as f:
        f.write("after sleep\\n")
    return "rested"

model = scripted([ModelReply("", [ToolCall("c1", "nap", {"seconds": 2})]),
                  ModelReply("done")])

async def main():
    async with Runtime([Agent("ops", "", [nap])], SqliteStore(db), model) as rt:
        s = rt.session("ops", "s1")
        if mode == "start":
            t = await s.start("nap", turn_id="t1")
            r = await s.result(t.turn_id)
            until = [e.until for e in await s.events() if e.type == "turn.sleeping"]
            print(json.dumps({"status": str(r.status), "until": until[0]}), flush=True)
            await asyncio.Event().wait()  # parked: killed here
        else:
            async with asyncio.timeout(20), rt.subscribe(s.key, 0) as events:
                async for e in events:  # woken by the clock loop as the runtime opened
                    if e.type == "turn.completed":
                        break
            r = await rt.wait(s.key, "t1", timeout=20)
            print(json.dumps({"status": str(r.status), "text": r.text}), flush=True)

asyncio.run(main())
"""


async def _child(tmp_path: Path, mode: str) -> asyncio.subprocess.Process:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(tmp_path / "db.sqlite"), str(tmp_path / "effects"),
        mode, stdout=asyncio.subprocess.PIPE)


async def _line(proc: asyncio.subprocess.Process) -> dict[str, str]:
    assert proc.stdout is not None
    async with asyncio.timeout(WAIT):
        line = await proc.stdout.readline()
    assert line, "the child ended without a word"
    out: dict[str, str] = json.loads(line)
    return out


async def test_a_sleep_survives_sigkill_and_wakes_in_a_process_started_after_it(
        tmp_path: Path) -> None:
    first = await _child(tmp_path, "start")
    try:
        parked = await _line(first)
        assert parked["status"] == "suspended"
    finally:
        first.send_signal(signal.SIGKILL)
        async with asyncio.timeout(WAIT):
            assert await first.wait() == -signal.SIGKILL
    # Nothing runs until the wake time has passed: the wake-up is due with no process up.
    await SystemClock().wait(datetime.fromisoformat(parked["until"]), asyncio.Event())
    second = await _child(tmp_path, "wake")
    try:
        done = await _line(second)
        async with asyncio.timeout(WAIT):
            assert await second.wait() == 0
    finally:
        if second.returncode is None:
            second.kill()
            await second.wait()
    assert done == {"status": "completed", "text": "done"}
    assert (tmp_path / "effects").read_text().splitlines() == ["body", "body", "after sleep"]
