"""Transcript records: the plain, versioned values the message log is made of.

Only these records (and the step/turn/event records built from plain JSON) are ever
persisted. No vendor SDK type and no live object reaches a store: adapters translate to and
from them. The codec is one pair of functions, :func:`encode_message` / :func:`decode_message`,
with a version field so the layout can move on without breaking stored sessions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["user", "trigger", "assistant", "tool"]

MESSAGE_VERSION = 1

encode_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
"""The one compact JSON encoding of every stored record (one encoder, built once)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model asked for."""

    id: str
    """The provider's call id; it keys the tool step ``tool:<n>:<id>``."""
    name: str
    input: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "input": self.input}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(id=data["id"], name=data["name"], input=data.get("input") or {})


@dataclass(frozen=True, slots=True)
class Message:
    """One entry of the message log."""

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    """Calls an assistant message made."""
    call_id: str | None = None
    """For a ``tool`` message: the call it answers."""
    result: Any = None
    """For a ``tool`` message: the JSON value the tool returned (or ``{"error": …}``)."""
    is_error: bool = False
    turn_id: str | None = None
    by: str | None = None
    """Who sent it: the user id of a ``user`` message, the trigger's ``by`` for ``trigger``."""
    content: tuple[dict[str, Any], ...] = ()
    """Provider-native blocks stored verbatim (e.g. Anthropic thinking with signatures)."""
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def is_opening(self) -> bool:
        """True for the message that opens a turn."""
        return self.role in ("user", "trigger")


def encode_message(m: Message) -> str:
    """Serialise a message to its stored JSON form (empty fields left out)."""
    data: dict[str, Any] = {"v": MESSAGE_VERSION, "role": m.role}
    if m.text:
        data["text"] = m.text
    if m.tool_calls:
        data["calls"] = [c.to_dict() for c in m.tool_calls]
    if m.call_id is not None:
        data["call_id"] = m.call_id
        data["result"] = m.result
    if m.is_error:
        data["is_error"] = True
    if m.turn_id is not None:
        data["turn"] = m.turn_id
    if m.by is not None:
        data["by"] = m.by
    if m.content:
        data["content"] = list(m.content)
    if m.usage:
        data["usage"] = m.usage
    return encode_json(data)


def decode_message(raw: str | bytes) -> Message:
    """Read a message back from its stored JSON form."""
    data = json.loads(raw)
    version = data.get("v")
    if version != MESSAGE_VERSION:
        raise ValueError(f"unsupported message record version {version!r}")
    return Message(
        role=data["role"],
        text=data.get("text", ""),
        tool_calls=tuple(ToolCall.from_dict(c) for c in data.get("calls", ())),
        call_id=data.get("call_id"),
        result=data.get("result"),
        is_error=data.get("is_error", False),
        turn_id=data.get("turn"),
        by=data.get("by"),
        content=tuple(data.get("content", ())),
        usage=data.get("usage", {}),
    )


def owed_calls(transcript: list[Message]) -> tuple[int, list[ToolCall]]:
    """The calls of the last assistant message that have no tool message yet.

    Read off the transcript, not the step cache, so a crash inside a batch resumes the
    remaining calls only. Returns the assistant message's index and the owed calls.
    """
    answered: set[str] = set()
    for i in range(len(transcript) - 1, -1, -1):
        m = transcript[i]
        if m.role == "tool":
            if m.call_id is not None:
                answered.add(m.call_id)
            continue
        if m.role == "assistant":
            return i, [c for c in m.tool_calls if c.id not in answered]
        return i, []
    return -1, []
