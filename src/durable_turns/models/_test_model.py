"""``TestModel``: a model for an app's tests and its first runs, with no key and no network.

Its first reply in a turn calls each of the agent's tools once (or the ones named), in one
reply, with an input generated from the tool's JSON schema (:func:`example_input`); once
they have answered, it ends the turn with a summary of what each returned. It reads no
prose, so any opening message will do.

It is a :class:`~durable_turns.models.scripted.ScriptedModel` whose replies are computed
from the transcript alone: a turn it drives replays in another process (after a crash, or
when ``durable-turns approve`` answers a park) exactly as it ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..messages import Message, ToolCall
from ..model import ModelRequest
from .scripted import ModelReply, ScriptedModel, calls_this_turn

SPEC = "test"
"""Its name wherever a model is named (``--model test``, ``resolve_model("test")``)."""
_FORMATS = {"date": "2024-01-01", "date-time": "2024-01-01T00:00:00Z", "time": "00:00:00Z",
            "email": "user@example.com", "uri": "https://example.com/",
            "uuid": "00000000-0000-4000-8000-000000000000"}
_DEPTH = 8
"""How deep a schema is followed (a recursive ``$ref`` stops there)."""


def example_input(schema: Mapping[str, Any]) -> Any:
    """A value that fits the JSON schema ``schema``, the same one every time.

    What it follows: ``const``, ``enum`` and ``default`` first, then ``examples``; ``$ref``
    into the schema's ``$defs``; the first branch of ``anyOf``/``oneOf``; every schema of
    ``allOf``; ``type`` (the first non-null one of a list), with ``minimum``/``maximum`` (and
    their exclusive forms), ``minLength``/``maxLength``, ``format`` (date, date-time, email,
    uri, uuid) and ``minItems``; an object gets its required properties. A string is named
    after its property (``"order_id"``), so a summary shows what went where. It follows no
    ``pattern``: a tool whose input has one answers the generated value with its validation
    error, as it would answer a model.
    """
    return _value(schema, schema, "value", 0)


def _value(schema: Mapping[str, Any], root: Mapping[str, Any], name: str, depth: int) -> Any:
    if depth > _DEPTH:
        return None
    if "$ref" in schema:
        return _value(_resolve(str(schema["$ref"]), root), root, name, depth + 1)
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    if schema.get("enum"):
        return schema["enum"][0]
    if schema.get("examples"):
        return schema["examples"][0]
    for key in ("anyOf", "oneOf"):
        branches = [b for b in schema.get(key) or () if b.get("type") != "null"]
        if branches:
            return _value(branches[0], root, name, depth + 1)
    if schema.get("allOf"):
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            part = _resolve(str(part["$ref"]), root) if "$ref" in part else part
            merged = {**merged, **part,
                      "properties": {**merged.get("properties", {}),
                                     **part.get("properties", {})},
                      "required": [*merged.get("required", ()), *part.get("required", ())]}
        return _value(merged, root, name, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    return _typed(str(kind), schema, root, name, depth)


def _typed(kind: str, schema: Mapping[str, Any], root: Mapping[str, Any], name: str,
           depth: int) -> Any:
    if kind == "object":
        props: Mapping[str, Any] = schema.get("properties") or {}
        return {p: _value(props.get(p, {}), root, p, depth + 1)
                for p in dict.fromkeys(schema.get("required") or ())}
    if kind == "array":
        items = schema.get("items") or {}
        count = int(schema.get("minItems", 1))
        return [_value(items, root, name, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return _number(schema, integer=kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = _FORMATS.get(str(schema.get("format")), name)
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    text = text.ljust(low, "x")
    return text[:int(high)] if high is not None else text


def _number(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    """1, moved into the bounds (just inside an exclusive one)."""
    step = 1 if integer else 0.5
    value: float = 1
    if "minimum" in schema:
        value = max(value, schema["minimum"])
    if "exclusiveMinimum" in schema:
        value = max(value, schema["exclusiveMinimum"] + step)
    if "maximum" in schema:
        value = min(value, schema["maximum"])
    if "exclusiveMaximum" in schema:
        value = min(value, schema["exclusiveMaximum"] - step)
    return int(value) if integer else float(value)


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    """A local ``#/…`` reference; anything else resolves to "any value" (a string)."""
    if not ref.startswith("#/"):
        return {}
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return {}
        node = node[part]
    return node if isinstance(node, Mapping) else {}


class TestModel(ScriptedModel):
    """The test model (see the module's docstring).

    Args:
        call_tools: the names of the tools to call, in order (default: every tool the agent
            offers, in the order it offers them). A name the agent does not offer is skipped.
        text: the summary's first words.
    """

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, call_tools: Iterable[str] | None = None, *,
                 text: str = "Called each tool once.") -> None:
        self.call_tools = None if call_tools is None else tuple(call_tools)
        self.text = text
        super().__init__(self._answer)

    def _answer(self, request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            offered = {t.name: t for t in request.tools}
            names = list(offered) if self.call_tools is None else [
                n for n in self.call_tools if n in offered]
            calls = [_call(i, offered[n].name, example_input(offered[n].input))
                     for i, n in enumerate(names, 1)]
            if calls:
                return ModelReply(f"Calling {', '.join(names)}.", calls)
            return ModelReply(f"{self.text} (this agent has no tools)")
        return ModelReply(_summary(self.text, request.messages))


def _call(i: int, name: str, given: Any) -> ToolCall:
    return ToolCall(f"test-{i}", name, given if isinstance(given, dict) else {})


def _summary(text: str, messages: list[Message]) -> str:
    """``text``, then a line per call of this turn: its tool and what it answered."""
    names: dict[str, str] = {}
    lines: list[str] = []
    for m in _this_turn(messages):
        for c in m.tool_calls:
            names[c.id] = c.name
        if m.role == "tool":
            verb = "failed" if m.is_error else "returned"
            lines.append(f"- {names.get(m.call_id or '', 'a tool')} {verb} "
                         f"{json.dumps(m.result, ensure_ascii=False, default=str)}")
    return "\n".join([text, *lines])


def _this_turn(messages: list[Message]) -> list[Message]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].is_opening:
            return messages[i:]
    return messages


__all__ = ["SPEC", "TestModel", "example_input"]
