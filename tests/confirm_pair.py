"""An agent whose one reply makes two calls that run at once (F15) and both park for a
person's answer: the hosts' tests of a multi-park (the console's inbox, Slack's prompts)."""

from __future__ import annotations

from durable_turns import Agent, ModelReply, ToolCall, ToolContext, scripted, tool
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn


@tool
async def confirm(item: str, ctx: ToolContext) -> str:
    """Ask a person to confirm ``item``."""
    ok = await ctx.request_input(f"ok-{item}", f"Confirm {item}?", schema={"type": "boolean"})
    return f"{item}: {'yes' if ok else 'no'}"


def _reply(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("Asking for both.", [ToolCall("ca", "confirm", {"item": "a"}),
                                               ToolCall("cb", "confirm", {"item": "b"})])
    return ModelReply("Both answered: " + ", ".join(
        str(m.result) for m in request.messages if m.role == "tool") + ".")


def confirm_pair(name: str) -> Agent:
    """The agent, named ``name``: "Confirm a?" and "Confirm b?" at once, then its answer
    ("Both answered: a: yes, b: no.")."""
    return Agent(name, "You confirm.", [confirm], model=scripted(_reply), parallel_tools=True)
