"""Transcript records: the plain, versioned values the message log is made of.

Only these records (and the step/turn/event records built from plain JSON) are ever
persisted. No vendor SDK type and no live object reaches a store: adapters translate to and
from them. The codec is one pair of functions, :func:`encode_message` / :func:`decode_message`,
with a version field so the layout can move on without breaking stored sessions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Literal, SupportsIndex, overload

try:
    import orjson
except ImportError:  # no wheel of it for this platform (Pyodide): the standard library writes
    orjson = None  # type: ignore[assignment]

Role = Literal["user", "trigger", "assistant", "tool"]

MESSAGE_VERSION = 1
OUTPUT_RETRY_BY = "durable_turns:output"
"""``Message.by`` of the user message that hands a final answer's validation error back to
the model (structured output, F25): said inside a turn, it opens none."""

_std_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_PLAIN_ONLY = 0 if orjson is None else \
    orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def encode_json(value: Any) -> str:
    """The one compact JSON encoding of every stored record.

    orjson writes it (ten times faster than the standard library, and it is on every step);
    what orjson refuses (an integer beyond 64 bits, a non-string key, an object it does not
    know) goes to the standard library's encoder, which then writes it the standard way or
    raises its usual ``TypeError``/``ValueError``. One difference remains: a NaN or infinite
    float is written ``null`` (the standard library writes ``NaN``, which is not JSON). Where
    orjson is not installed (it has no wheel for Pyodide), the standard library writes all.
    """
    if orjson is None:
        return _std_encode(value)
    try:
        return orjson.dumps(value, option=_PLAIN_ONLY).decode()
    except TypeError:
        return _std_encode(value)


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


class _Joined:
    """Stored messages joined by newlines (which their JSON never holds raw), referenced
    by each of their places in a :class:`MessageLog` until one of them is read."""

    __slots__ = ("body",)

    def __init__(self, body: str) -> None:
        self.body = body


class MessageLog(list[Message]):
    """A session's log as stored: a ``list`` of messages whose items are decoded from their
    stored JSON when first read, so a turn redelivered on a long history does not decode
    thousands of messages before its next step (it reads the tail; a model adapter that
    converts the whole transcript decodes it then, once).

    It behaves as a ``list[Message]`` for reading (index, slice, iterate, ``reversed``,
    ``in``, ``==``) and appending; items still encoded are never handed out.
    """

    __slots__ = ()

    @classmethod
    def stored(cls, bodies: Iterable[str | bytes]) -> MessageLog:
        """A log of messages still in their stored form (:func:`encode_message`)."""
        log = cls()
        list.extend(log, bodies)  # type: ignore[misc]  # decoded when read
        return log

    @classmethod
    def joined(cls, rows: Iterable[tuple[str, int]]) -> MessageLog:
        """A log of messages stored many to a string: ``(bodies joined by newlines, k)``
        stands for the last ``k`` of them. A string is split when one of its messages is
        first read (a long history costs one reference per message until then)."""
        items: list[Any] = []
        for body, count in rows:
            if count == 1 and "\n" not in body:
                items.append(body)
            else:
                items.extend(repeat(_Joined(body), count))
        log = cls()
        list.extend(log, items)  # decoded when read
        return log

    def _decoded(self, i: int) -> Message:
        item: object = list.__getitem__(self, i)
        if isinstance(item, Message):
            return item
        if type(item) is _Joined:
            self._split(i, item)
            item = list.__getitem__(self, i)
        message = decode_message(item)  # type: ignore[arg-type]  # a stored body
        list.__setitem__(self, i, message)
        return message

    def _split(self, i: int, joined: _Joined) -> None:
        """Replace the run of references to ``joined`` around ``i`` (its last messages: a
        run is only ever made, moved and cleared whole) by their stored bodies."""
        raw: list[Any] = self  # read and written past the decoding methods
        start, end, size = i, i + 1, len(self)
        while start > 0 and list.__getitem__(raw, start - 1) is joined:
            start -= 1
        while end < size and list.__getitem__(raw, end) is joined:
            end += 1
        parts = joined.body.split("\n")
        if end - start > len(parts):
            raise ValueError(f"a stored row holds {len(parts)} messages, not the "
                             f"{end - start} the log has a place for")
        list.__setitem__(raw, slice(start, end), parts[len(parts) - (end - start):])

    @overload
    def __getitem__(self, i: SupportsIndex) -> Message: ...
    @overload
    def __getitem__(self, i: slice) -> list[Message]: ...

    def __getitem__(self, i: SupportsIndex | slice) -> Message | list[Message]:
        if type(i) is int:  # the common case, read on every step: one check
            item: object = list.__getitem__(self, i)
            return item if type(item) is Message else self._decoded(i)
        if isinstance(i, slice):
            return [self._decoded(j) for j in range(*i.indices(len(self)))]
        return self._decoded(int(i))

    def __iter__(self) -> Iterator[Message]:
        for i, item in enumerate(list.__iter__(self)):
            yield item if type(item) is Message else self._decoded(i)

    def __reversed__(self) -> Iterator[Message]:
        i = len(self)
        for item in list.__reversed__(self):
            i -= 1
            yield item if type(item) is Message else self._decoded(i)

    def __contains__(self, item: object) -> bool:
        return any(m == item for m in self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, list) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __repr__(self) -> str:
        return repr(list(self))

    def copy(self) -> list[Message]:
        return list(self)

    def extend(self, items: Iterable[Message]) -> None:
        # Another log's items are taken as they are (still encoded or not).
        list.extend(self, list.__iter__(items) if isinstance(items, MessageLog) else items)


def owed_calls(transcript: list[Message]) -> tuple[int, list[ToolCall]]:
    """The calls of the last assistant message that have no tool message yet.

    Read off the transcript, not the step cache, so a crash inside a batch resumes the
    remaining calls only. Returns the assistant message's index and the owed calls.
    """
    answered: set[str] = set()
    i = len(transcript)
    for m in reversed(transcript):
        i -= 1
        if m.role == "tool":
            if m.call_id is not None:
                answered.add(m.call_id)
            continue
        if m.role == "assistant":
            return i, [c for c in m.tool_calls if c.id not in answered]
        return i, []
    return -1, []


__all__ = [
    "MESSAGE_VERSION",
    "OUTPUT_RETRY_BY",
    "Message",
    "MessageLog",
    "Role",
    "ToolCall",
    "decode_message",
    "encode_json",
    "encode_message",
    "owed_calls",
]
