"""The compaction step's id and memo (F23), beside ``records``' other step kinds; what a
compaction decides and how a request is built from it is ``durable_turns.compaction``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .messages import encode_json

__all__ = ["CompactStepId", "CompactionMemo"]


@dataclass(frozen=True, slots=True)
class CompactStepId:
    """``compact:<n>``: the compaction run before model step ``model:<n>`` (F23)."""

    n: int
    kind: ClassVar[Literal["compact"]] = "compact"

    def __str__(self) -> str:
        return f"compact:{self.n}"


@dataclass(frozen=True, slots=True)
class CompactionMemo:
    """What a compaction step keeps (F23): what later model requests send instead of the
    transcript's head. The store keeps every message; only the requests change."""

    covered: int
    """Messages ``[0, covered)`` are replaced by :attr:`summary` in a request."""
    cleared: int
    """Tool results of messages ``[covered, cleared)`` are sent as ``{"cleared": true,
    "bytes": N}``."""
    summary: str | None
    """The summary of messages ``[0, covered)``; ``None`` while nothing is summarised."""
    before: int
    """The request's estimated tokens before the compaction."""
    after: int
    """… and after it."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompactionMemo:
        return cls(int(d["covered"]), int(d["cleared"]), d.get("summary"), int(d["before"]),
                   int(d["after"]))

    def to_json(self) -> str:
        return encode_json({"covered": self.covered, "cleared": self.cleared,
                            "summary": self.summary, "before": self.before,
                            "after": self.after})
