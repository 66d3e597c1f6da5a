"""What opens a turn: a person's message from a channel, or a trigger with no person."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class User:
    """Who spoke. ``attested`` is true only when the channel verified the id (e.g. Slack)."""

    id: str
    attested: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "attested": self.attested}


@dataclass(frozen=True, slots=True, init=False)
class InboundEvent:
    """A message that arrived from a channel.

    Attributes:
        source: the channel it came from (``"slack"``, ``"http"``, …); it selects the
            per-source policy (F10) and cannot be set by the speaker.
        user: the speaker, a :class:`User` or a mapping ``{"id", "attested"}``.
        text: what they said.
        raw: the channel's original payload; never persisted.
        meta: small routing data the channel needs later (thread ids, …); persisted.
    """

    source: str
    user: User | None
    text: str
    raw: Any
    meta: Mapping[str, Any]

    def __init__(
        self,
        source: str,
        user: User | Mapping[str, Any] | None = None,
        text: str = "",
        raw: Any = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if not source or not isinstance(source, str):
            raise ValueError("an inbound event needs its source (the channel's name)")
        if isinstance(user, Mapping):
            user = User(str(user["id"]), bool(user.get("attested", False)))
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "user", user)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "raw", raw)
        object.__setattr__(self, "meta", dict(meta or {}))

    def to_dict(self) -> dict[str, Any]:
        """The event as stored: everything but ``raw``."""
        return {
            "source": self.source,
            "user": self.user.to_dict() if self.user else None,
            "text": self.text,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InboundEvent:
        return cls(
            source=data["source"],
            user=data.get("user"),
            text=data.get("text", ""),
            meta=data.get("meta") or {},
        )


@dataclass(frozen=True, slots=True)
class Trigger:
    """A turn nobody typed: a schedule, a webhook, another agent (F9)."""

    kind: str = "proactive"
    by: str = "system"


__all__ = ["InboundEvent", "Trigger", "User"]
