"""``--model scripted``: an offline model for any app, with no key and no network.

It understands no prose. It calls one of the agent's tools when the turn's opening message
is that tool's name followed by its JSON input (``order_status {"order_id": "A-12"}``, or a
tool's name alone when it takes no input), then reports what the tool answered. Anything
else is answered with a line that says how to call the tools, and names them. So an app
folder whose ``agent.py`` names no model can be served, chatted with and approved from a
shell before any provider is set up; a tool that asks a person (F6) parks as it would with
a real model.

It is a :class:`~durable_turns.models.scripted.ScriptedModel`, so a turn it drives replays
in another process exactly as it ran: each reply is computed from the transcript alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..messages import Message, ToolCall
from ..model import ModelRequest
from ..tools import ToolSpec
from .scripted import ModelReply, ScriptedModel, calls_this_turn

SPEC = "scripted"
"""The name of this model wherever a model is named (``--model scripted``,
``resolve_model("scripted")``)."""
CALL_ID = "offline-1"
"""The id of the one call the model makes in a turn."""
_CALL = re.compile(r"\s*/?([A-Za-z_][\w.-]*)\s*(\{.*\})?\s*", re.DOTALL)


def offline_model() -> ScriptedModel:
    """The offline model (see the module's docstring).

    Returns:
        A :class:`~durable_turns.models.scripted.ScriptedModel` that calls the agent's tools
        by name.
    """
    return ScriptedModel(_reply)


def _reply(request: ModelRequest) -> ModelReply:
    tools = {t.name: t for t in request.tools}
    if calls_this_turn(request) == 0:
        opening = _opening(request.messages)
        call = _call(opening, tools)
        if call is None:
            return ModelReply(_help(opening, list(tools.values())))
        return ModelReply(f"Calling {call.name}.", [call])
    answer = request.messages[-1]
    if answer.role != "tool":  # asked again after its own reply: nothing more to say
        return ModelReply("Done.")
    verb = "failed" if answer.is_error else "answered"
    return ModelReply(f"{_name_of(request.messages, answer.call_id)} {verb}: "
                      f"{json.dumps(answer.result, ensure_ascii=False)}")


def _opening(messages: list[Message]) -> str:
    return next((m.text for m in reversed(messages) if m.is_opening), "")


def _call(text: str, tools: Mapping[str, ToolSpec]) -> ToolCall | None:
    found = _CALL.fullmatch(text)
    if found is None or found.group(1) not in tools:
        return None
    raw = found.group(2)
    try:
        given: Any = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return None
    if not isinstance(given, dict):
        return None
    return ToolCall(CALL_ID, found.group(1), given)


def _name_of(messages: list[Message], call_id: str | None) -> str:
    for m in reversed(messages):
        for c in m.tool_calls:
            if c.id == call_id:
                return c.name
    return "the tool"


def _example(spec: ToolSpec) -> str:
    """``name {"arg": …}`` with a placeholder for each required argument."""
    props: Mapping[str, Any] = spec.input.get("properties") or {}
    required = [p for p in spec.input.get("required") or () if p in props]
    placeholder = {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}
    values = {p: placeholder.get(str(props[p].get("type")), "…") for p in required}
    return f"{spec.name} {json.dumps(values, ensure_ascii=False)}" if values else spec.name


def _help(opening: str, tools: list[ToolSpec]) -> str:
    heard = f'You said "{opening.strip()[:200]}". ' if opening.strip() else ""
    if not tools:
        return (f"{heard}This is the offline model (--model scripted): it reads no prose, and "
                "this agent has no tools to call. Name a real model (--model PROVIDER:NAME) "
                "to talk to it.")
    names = ", ".join(t.name for t in tools)
    return (f"{heard}This is the offline model (--model scripted): it reads no prose, but it "
            f"calls a tool when you write the tool's name and its JSON input, e.g. "
            f"{_example(tools[0])}. This agent's tools: {names}.")


__all__ = ["CALL_ID", "SPEC", "offline_model"]
