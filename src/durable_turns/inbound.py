"""What opens a turn: a person's message from a channel, or a trigger with no person."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class User:
    """Who spoke. ``attested`` is true only when the channel verified the id (e.g. Slack)."""

    id: str
    attested: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "attested": self.attested}


@dataclass(frozen=True, slots=True)
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
    user: User | None = None
    text: str = ""
    raw: Any = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.user, Mapping):
            object.__setattr__(
                self, "user", User(str(self.user["id"]), bool(self.user.get("attested", False)))
            )

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
