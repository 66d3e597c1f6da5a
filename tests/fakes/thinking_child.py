"""A child process for the thinking-across-a-crash test: one delivery of a turn, for real.

    python tests/fakes/thinking_child.py DB BASE_URL TURN_ID (crash|replay)

It drives turn ``TURN_ID`` of session ``ops/s1`` on the SQLite file ``DB`` with the Anthropic
adapter (thinking on) pointed at ``BASE_URL``. The agent's one tool, ``probe``, SIGKILLs its
own process in ``crash`` mode: by then the model step that asked for it, thinking block and
signature included, has committed. In ``replay`` mode it answers, and the child prints the
turn's result as JSON on stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from durable_turns import Agent, Runtime, SqliteStore, Tool, ToolContext, ToolSpec
from durable_turns.models.anthropic_messages import anthropic


def build(db: str, base_url: str, mode: str) -> Runtime:
    async def probe(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        return {"path": args["path"], "free": "81%"}

    spec = ToolSpec("probe", "Report free space under a path.", {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})
    agent = Agent("ops", "You keep servers healthy.", tools=[Tool(spec, probe)])
    model = anthropic("claude-test", api_key="sk-test", base_url=base_url, thinking=True,
                      max_retries=0)
    return Runtime(agents=[agent], store=SqliteStore(db), model=model)


async def main(db: str, base_url: str, turn_id: str, mode: str) -> None:
    async with build(db, base_url, mode) as runtime:
        session = runtime.session("ops", "s1")
        await session.start(user_text="Is the disk fine?", turn_id=turn_id)
        result = await session.result(turn_id)
        print(json.dumps({"status": result.status, "text": result.text, "error": result.error}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
