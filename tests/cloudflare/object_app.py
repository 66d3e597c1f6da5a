"""The agent object the Durable Object tests serve, in CPython and under Pyodide alike: one
agent (``desk``) whose scripted model calls a local tool (``note``: a row in the object's
SQLite, through the step's transaction), asks a person (``ask``: the turn parks), or waits
for a gate the test opens (``hang``; ``hold``: in a tool, then it answers with the user
texts of its turn it was shown, joined by ``|``: what a steer adds shows), or returns a long text
(``big <n>``: ``n`` characters, one tool result over a row's limit), as the turn's text says.

``env`` (the Worker's bindings) may carry ``authenticate`` (the object's hook), ``gate`` (an
``asyncio.Event`` a ``hang`` turn waits on) and ``ran`` (called each time ``note`` runs, with
its value: the test counts runs outside the object's storage).
"""

from __future__ import annotations

from typing import Any

from durable_turns import Agent, ModelReply, ToolCall, ToolContext, scripted, tool
from durable_turns.cloudflare import AgentObject, ObjectSetup
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn


@tool
async def ask(ctx: ToolContext) -> Any:
    """Ask whether to go on."""
    return await ctx.request_input("ok", "Proceed?")


def _said(request: ModelRequest) -> str:
    return [m.text for m in request.messages if m.is_opening][-1] or ""


class DeskObject(AgentObject):
    """The object of the tests' ``desk`` sessions."""

    def setup(self, env: Any) -> ObjectSetup:
        gate = getattr(env, "gate", None)
        ran = getattr(env, "ran", None)

        @tool
        async def hold() -> str:
            """Wait for the test's gate (a remote tool: no transaction held)."""
            if gate is not None:
                await gate.wait()
            return "held"

        @tool
        def big(size: int) -> str:
            """A result of ``size`` characters."""
            return "b" * size

        @tool(name="note")
        def noted(value: str, ctx: ToolContext) -> dict[str, str]:
            """Write a note (a row of the object's storage, committed with the step)."""
            sql = ctx.store.unwrap()
            sql.exec("CREATE TABLE IF NOT EXISTS notes (v TEXT)")
            sql.exec("INSERT INTO notes (v) VALUES (?)", value)
            if ran is not None:
                ran(value)
            return {"noted": value}

        async def reply(request: ModelRequest) -> ModelReply:
            said = _said(request)
            first = calls_this_turn(request) == 0
            if said.startswith("note ") and first:
                return ModelReply("", [ToolCall("n1", "note", {"value": said[5:]})])
            if said.startswith("big ") and first:
                return ModelReply("", [ToolCall("b1", "big", {"size": int(said[4:])})])
            if said == "ask" and first:
                return ModelReply("", [ToolCall("a1", "ask", {})])
            turn = request.messages[-1].turn_id  # a steer's message is its turn's
            users = [m.text or "" for m in request.messages
                     if m.role == "user" and m.turn_id == turn]
            if users[:1] == ["hold"]:
                if first:
                    return ModelReply("", [ToolCall("h1", "hold", {})])
                return ModelReply("|".join(users))
            if said == "hang" and gate is not None:
                await gate.wait()
            last = request.messages[-1]
            if said.startswith("big "):
                return ModelReply(f"{said}: {len(str(last.result))}")
            return ModelReply(f"{said}: {last.result if last.role == 'tool' else 'done'}")

        # (results up to 16 MiB: the ``big`` tool's are over a Durable Object's 4 MiB a value)
        desk = Agent("desk", "You help.", [noted, ask, hold, big], max_result_bytes=16 << 20)
        return ObjectSetup([desk], scripted(reply),
                           authenticate=getattr(env, "authenticate", None))
