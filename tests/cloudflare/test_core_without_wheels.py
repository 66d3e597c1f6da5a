"""F27: the engine's core where Pyodide has no wheel for orjson: ``messages.encode_json`` writes
the same JSON with the standard library, and a turn with a local tool runs on the Durable
Object store with no thread started (CPython, orjson made unimportable in a child process;
``test_pyodide.py`` runs the same under Pyodide itself)."""

from __future__ import annotations

import subprocess
import sys

CHILD = r'''
import sys
sys.modules["orjson"] = None  # what an interpreter without its wheel has
import asyncio, json, threading
from durable_turns import Agent, ModelReply, Runtime, ToolCall, ToolContext, scripted, tool
from durable_turns.cloudflare import DurableObjectStore
from durable_turns.cloudflare.testing import DurableObjectStorage
from durable_turns.messages import encode_json
from durable_turns.models.scripted import calls_this_turn

assert "orjson" not in {m for m, v in sys.modules.items() if v is not None}
record = {"a": [1, 2.5, None, True], "é": "ü\n", "n": 2 ** 70}
assert json.loads(encode_json(record)) == record
print(encode_json(record))

started = []
threading.Thread.start = lambda self: started.append(self.name)  # none may start

@tool
def note(value: str, ctx: ToolContext) -> str:
    """Write a note."""
    sql = ctx.store.unwrap()
    sql.exec("CREATE TABLE IF NOT EXISTS notes (v TEXT)")
    sql.exec("INSERT INTO notes (v) VALUES (?)", value)
    return value

def reply(request):
    if calls_this_turn(request) == 0:
        return ModelReply("", [ToolCall("c1", "note", {"value": "x"})])
    return ModelReply("done")

async def main():
    storage = DurableObjectStorage()
    async with Runtime([Agent("a", "", [note])], DurableObjectStore(storage),
                       scripted(reply)) as rt:
        result = await rt.session("a", "s").turn("go")
    assert result.text == "done", result
    assert storage.sql.exec("SELECT v FROM notes").raw().toArray() == [["x"]]

asyncio.run(main())
assert started == [], started
'''


def test_the_core_runs_without_orjson_and_starts_no_thread() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ('{"a":[1,2.5,null,true],"é":"ü\\n","n":'
                                   '1180591620717411303424}')
