"""What the Teams channel's calls send: a reply's text as it grows, and Adaptive Cards.

Teams streams (and updates in place) a message whole: each streaming activity carries the
text so far, not the new piece; before the first text, informative updates carry a status
line (the tool that runs). :class:`Growing` keeps a reply's text and its tool timeline
and renders them as one markdown text. A prompt is an Adaptive Card with ``Action.Execute``
buttons (Universal Actions: the click comes back as an ``adaptiveCard/action`` invoke
signed like any activity) whose ``data`` carries the routing of the answer, never who
answers; a request whose schema is not a boolean gets an input for its value and Submit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import InputRequest
from .threads import Chunk, Task

APPROVE = "durable_turns.approve"
"""The ``verb`` of a prompt's Approve button."""
DENY = "durable_turns.deny"
"""The ``verb`` of a prompt's Deny button."""
SUBMIT = "durable_turns.submit"
"""The ``verb`` of the Submit button of a prompt that asks for a value."""
VALUE = "durable_turns.value"
"""The id of a prompt's input (its value arrives in the action's ``data``)."""
CARD = "application/vnd.microsoft.card.adaptive"
"""An Adaptive Card's content type (an attachment's, an invoke response's)."""
MESSAGE = "application/vnd.microsoft.activity.message"
"""An invoke response's type that shows its text to the clicker only."""
MARKS = {"in_progress": "⏳", "complete": "✓", "error": "✗"}


@dataclass
class Growing:
    """A reply's message as it is streamed: its text and tool lines so far."""

    text: str = ""
    tasks: dict[str, Task] = field(default_factory=dict)
    sequence: int = 0
    """The streaming activities sent (Teams numbers them from 1)."""
    sent: float = 0.0
    """When the last one was sent (``time.monotonic()``)."""
    streams: bool = True
    """Whether it goes by Teams' streaming protocol (a 1:1 chat), else updated in place."""
    streaming: bool = False
    """Whether text was streamed yet (before it, Teams takes informative updates: a status
    line, the tool running)."""

    def add(self, chunks: Sequence[Chunk]) -> None:
        for c in chunks:
            if isinstance(c, Task):
                self.tasks[c.id] = c
            else:
                self.text += c.text

    def status(self) -> str:
        """The informative update before any text: the last tool's line."""
        return next((_line(t) for t in reversed(self.tasks.values())), "…")

    def render(self) -> str:
        lines = [_line(t) for t in self.tasks.values()]
        return "\n\n".join(p for p in ("\n\n".join(lines), self.text.strip()) if p) or "…"


def _line(t: Task) -> str:
    return f"{MARKS[t.status]} {t.title}" + (f": {t.output}" if t.output else "")


def _card(body: list[dict[str, Any]], actions: list[dict[str, Any]] | None = None
          ) -> dict[str, Any]:
    card: dict[str, Any] = {"type": "AdaptiveCard", "version": "1.5", "body": body,
                            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json"}
    if actions:
        card["actions"] = actions
    return card


def _input(schema: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(schema.get("enum"), list):
        return {"type": "Input.ChoiceSet", "id": VALUE, "isRequired": True,
                "choices": [{"title": str(v), "value": json.dumps(v)} for v in schema["enum"]]}
    kind = schema.get("type")
    if kind in ("integer", "number"):
        return {"type": "Input.Number", "id": VALUE, "isRequired": True}
    if kind == "string":
        return {"type": "Input.Text", "id": VALUE, "isRequired": True}
    return {"type": "Input.Text", "id": VALUE, "isRequired": True, "isMultiline": True,
            "placeholder": "JSON"}


def prompt_card(session: str, turn_id: str, request: InputRequest) -> dict[str, Any]:
    """An input request as a card: its prompt, then Approve and Deny (a boolean, or no
    schema) or an input for its value and Submit."""
    # Routing, and the prompt to show once answered: never who answers (the signed
    # activity's sender is).
    route = {"s": session, "t": turn_id, "i": request.id, "p": request.prompt}
    body: list[dict[str, Any]] = [{"type": "TextBlock", "text": request.prompt, "wrap": True}]
    schema = request.schema or {"type": "boolean"}
    if schema.get("type") == "boolean":
        return _card(body, [
            {"type": "Action.Execute", "title": "Approve", "verb": APPROVE, "data": route,
             "style": "positive"},
            {"type": "Action.Execute", "title": "Deny", "verb": DENY, "data": route,
             "style": "destructive"}])
    body.append(_input(schema))
    return _card(body, [{"type": "Action.Execute", "title": "Submit", "verb": SUBMIT,
                         "data": route, "style": "positive"}])


def answer_of(verb: str, data: Mapping[str, Any], schema: Mapping[str, Any] | None) -> Any:
    """The answer a click carries: Approve ``True``, Deny ``False``, Submit its input's value
    read by the request's schema (the schema's own check comes after).

    Raises:
        ValueError: an unknown verb, or a value that is not of the schema's kind.
    """
    if verb in (APPROVE, DENY):
        return verb == APPROVE
    if verb != SUBMIT:
        raise ValueError(f"not a durable_turns button: {verb!r}")
    raw = data.get(VALUE)
    if not isinstance(raw, str):
        raise ValueError("no value was given")
    schema = schema or {}
    if isinstance(schema.get("enum"), list):
        return json.loads(raw)
    kind = schema.get("type")
    if kind == "string":
        return raw
    if kind == "integer":
        return int(raw)
    if kind == "number":
        number = float(raw)
        return int(number) if number.is_integer() else number
    return json.loads(raw)


def verdict(value: Any, by: str) -> str:
    """Who answered a prompt, and how."""
    how = {True: "Approved", False: "Denied"}.get(value) if isinstance(value, bool) else None
    return f"{how or f'Answered {json.dumps(value)}'} by {by}"


def answered_card(prompt: str, verdict: str) -> dict[str, Any]:
    """A prompt once answered: its text and who answered how, no buttons."""
    return _card([{"type": "TextBlock", "text": prompt, "wrap": True},
                  {"type": "TextBlock", "text": verdict, "wrap": True, "isSubtle": True}])


__all__ = ["APPROVE", "CARD", "DENY", "MESSAGE", "SUBMIT", "VALUE", "Growing", "answer_of",
           "answered_card", "prompt_card", "verdict"]
