"""The bookkeeping of a parallel batch of tool calls (F15): outcomes and call order.

With ``Agent(parallel_tools=True)`` the remote calls of one assistant message run at once and
each commits its own step as it finishes: the step's memo holds the call's result. The tool
messages, though, must reach the transcript in call order, so that a replay (and every
provider) sees one deterministic conversation. So a commit appends the tool messages of the
calls that are ready *in call order*: the first call not yet in the transcript and every
finished call right after it. A call that finished before an earlier one waits, committed,
in the steps table; a replay after a crash reads it from there and does not run it again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .messages import ToolCall, encode_json


@dataclass(frozen=True, slots=True)
class Outcome:
    """A call's result, as its step memo keeps it until its tool message is written."""

    result: Any
    error: str | None = None

    def memo(self) -> str:
        return encode_json({"r": self.result, "e": self.error})

    @classmethod
    def from_memo(cls, memo: str) -> Outcome | None:
        """The outcome a batch step's memo holds (``None`` for a memo of another shape)."""
        data = json.loads(memo)
        if not isinstance(data, dict) or "r" not in data:
            return None
        return cls(data["r"], data.get("e"))


class BatchState:
    """Which calls of a batch have an outcome, and how many the transcript shows.

    Args:
        calls: the owed calls of the assistant message, in call order.
        done: outcomes committed already (read from the steps on a replay).
    """

    def __init__(self, calls: Sequence[ToolCall], done: Mapping[str, Outcome]) -> None:
        self.calls = list(calls)
        self.done: dict[str, Outcome] = dict(done)
        self.listed = 0
        """How many of :attr:`calls` have their tool message in the transcript."""

    def ready(self) -> list[tuple[ToolCall, Outcome]]:
        """The calls whose tool messages may be appended now: from the first one not in the
        transcript, every call with an outcome, up to the first one without."""
        out: list[tuple[ToolCall, Outcome]] = []
        for call in self.calls[self.listed:]:
            outcome = self.done.get(call.id)
            if outcome is None:
                break
            out.append((call, outcome))
        return out
