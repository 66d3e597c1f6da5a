"""F27: the agent's Durable Object under Pyodide (npm ``pyodide`` in npm's Node 22, offline),
on ``ctx.storage`` faked over ``node:sqlite`` (``tests/pyodide/storage.mjs``): a turn streamed
over the object's SSE, a local tool exactly once with the Node process SIGKILLed inside its
step and a new process on the same files finishing the turn from the alarm, a park that
survives an eviction (the process killed) and resumes, a cancel, a reset, a replay by
cursor, a client that leaves a turn's stream (the turn goes on), ``?mode=steer`` joining a
running turn, a tool result over the storage's 4 MiB per value committed in parts; and the
engine's core imported there without orjson, rpds-py or a thread."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

from pyodide_host import object_process, require_pyodide


def _notes(database: Path) -> list[str]:
    """The notes committed in the object's database (what another connection sees)."""
    with sqlite3.connect(database) as c:
        if not c.execute("SELECT 1 FROM sqlite_master WHERE name = 'notes'").fetchone():
            return []
        return [r[0] for r in c.execute("SELECT v FROM notes")]


async def test_an_object_under_pyodide_streams_parks_survives_eviction_and_replays(
        tmp_path: Path) -> None:
    require_pyodide()
    database, runs = tmp_path / "object.sqlite", tmp_path / "runs"
    async with object_process(database, runs) as obj:
        turn = await obj.fetch("POST", "/agents/desk/sessions/s1/turn", {"text": "note apples"})
        assert turn.status == 200 and turn.headers["content-type"] == "text/event-stream"
        events = turn.events()
        assert events[0]["type"] == "turn.started" and events[-1]["type"] == "turn.completed"
        assert events[-1]["text"] == "note apples: {'noted': 'apples'}"
        assert _notes(database) == ["apples"] and runs.read_text() == "apples\n"

        again = await obj.fetch("GET", "/agents/desk/sessions/s1/events?until=turn",
                                **{"Last-Event-ID": events[1]["id"]})
        durable = [e for e in events if e["id"] is not None]
        assert again.events() == durable[2:]  # a replay by cursor: what came after it

        left = await obj.fetch("POST", "/agents/desk/sessions/s1/turn", {"text": "note plums"},
                               leave_after=1)  # the client leaves after the first chunk
        rest = await obj.fetch("GET", "/agents/desk/sessions/s1/events?until=turn",
                               **{"Last-Event-ID": durable[-1]["id"]})
        assert rest.events()[-1]["type"] == "turn.completed"
        assert rest.events()[-1]["turn_id"] == left.headers["x-turn-id"]
        assert _notes(database) == ["apples", "plums"]

        parked = (await obj.fetch("POST", "/agents/desk/sessions/s1/chat", {"text": "ask"}))
        assert parked.json()["status"] == "suspended"
        cancelled = await obj.fetch("POST", "/agents/desk/sessions/s1/cancel",
                                    {"turn_id": parked.json()["turn_id"]})
        assert cancelled.status == 200, cancelled.body
        parked = await obj.fetch("POST", "/agents/desk/sessions/s1/chat", {"text": "ask"})
        assert parked.json()["status"] == "suspended"
    # The block's end SIGKILLed the process: the object is evicted, its file stays.
    async with object_process(database, runs) as obj:
        wrong = await obj.fetch("POST", "/agents/desk/sessions/s1/resume",
                                {"turn_id": parked.json()["turn_id"], "input_id": "nope"})
        assert wrong.status == 409, wrong.body
        done = await obj.fetch("POST", "/agents/desk/sessions/s1/resume",
                               {"turn_id": parked.json()["turn_id"], "input_id": "ok",
                                "value": True})
        assert done.status == 200 and done.json()["text"] == "ask: True", done.body
        shown = (await obj.fetch("GET", "/agents/desk/sessions/s1")).json()
        said = [m.get("text") for m in shown["transcript"] if m["role"] == "assistant"]
        assert said[-1] == "ask: True"
        reset = await obj.fetch("POST", "/agents/desk/sessions/s1/reset", {})
        assert reset.json()["generation"] == 1
        assert (await obj.fetch("GET", "/agents/desk/sessions/s1")).json()["transcript"] == []
        # The core ran there on what Pyodide has: no orjson, no rpds-py, one thread.
        assert await obj.probe() == {"platform": "emscripten", "threads": 1,
                                     "modules": ["jsonschema"]}


async def test_a_local_tool_runs_exactly_once_across_a_sigkill_inside_its_step(
        tmp_path: Path) -> None:
    require_pyodide()
    database, runs = tmp_path / "object.sqlite", tmp_path / "runs"
    async with object_process(database, runs, die_in_tool=True) as obj:
        await obj.send_fetch("POST", "/agents/desk/sessions/s1/turn", {"text": "note pears"})
        assert await obj.heard() == {"ran": "pears"}
        assert await obj.ended() == -signal.SIGKILL
    assert runs.read_text() == "pears\n"
    assert _notes(database) == []  # the tool's row went with its step
    async with object_process(database, runs) as obj:
        assert await obj.alarm_at() is not None  # set before the step ran
        await obj.alarm()  # what workerd does when it comes due: the turn goes on
        follow = await obj.fetch("GET", "/agents/desk/sessions/s1/events?until=turn&after=0")
        assert follow.events()[-1]["type"] == "turn.completed"
        assert await obj.alarm_at() is None
    assert _notes(database) == ["pears"]  # exactly once, though the tool ran twice
    assert runs.read_text() == "pears\npears\n"


async def test_under_pyodide_a_steer_joins_the_running_turn_and_a_5_mb_result_commits(
        tmp_path: Path) -> None:
    require_pyodide()
    database, runs = tmp_path / "object.sqlite", tmp_path / "runs"
    base = "/agents/desk/sessions/s1"
    async with object_process(database, runs) as obj:
        first = await obj.started(f"{base}/turn", {"text": "hold"})
        bad = await obj.fetch("POST", f"{base}/turn?mode=steer&replace=1", {"text": "x"})
        assert bad.status == 422 and bad.json()["error"]["type"] == "InvalidMode", bad.body
        steer = await obj.started(f"{base}/turn?mode=steer", {"text": "also this"})
        await obj.open_gate()
        joined, ran = await steer, await first
        assert joined.status == 200 and joined.headers["x-turn-id"] == ran.headers["x-turn-id"]
        types = [e["type"] for e in joined.events()]
        assert types.count("message.steered") == 1 and types[-1] == "turn.completed"
        assert joined.events()[-1]["text"] == "hold|also this"

        size = 5_000_000  # over workerd's 4 MiB per value, which storage.mjs refuses too
        big = await obj.fetch("POST", f"{base}/chat", {"text": f"big {size}"})
        assert big.status == 200 and big.json()["text"] == f"big {size}: {size}", big.body[:300]
    async with object_process(database, runs) as obj:  # a new process reads it back whole
        shown = (await obj.fetch("GET", base)).json()
        results = [m.get("result") for m in shown["transcript"] if m["role"] == "tool"]
        assert results[-1] == "b" * size
    with sqlite3.connect(database) as c:  # the log holds a reference, the parts the text
        assert c.execute("SELECT max(length(body)) FROM log").fetchone()[0] < 100_000
        assert c.execute("SELECT sum(length(data)) FROM dt_parts").fetchone()[0] >= size
