"""The bookkeeping of a parallel batch of tool calls (F15): outcomes, call order, and the
tool message that answers a call with its outcome.

With ``Agent(parallel_tools=True)`` the remote calls of one assistant message run at once and
each commits its own step as it finishes: the step's memo holds the call's result. The tool
messages, though, must reach the transcript in call order, so that a replay (and every
provider) sees one deterministic conversation. So a commit appends the tool messages of the
calls that are ready *in call order*: the first call not yet in the transcript and every
finished call right after it. A call that finished before an earlier one waits, committed,
in the steps table; a replay after a crash reads it from there and does not run it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..messages import Message, ToolCall
from ..records import CallOutcome


def tool_message(call: ToolCall, outcome: CallOutcome, turn_id: str) -> Message:
    """The tool message that answers ``call`` with ``outcome``."""
    return Message("tool", call_id=call.id, result=outcome.result,
                   is_error=outcome.error is not None, turn_id=turn_id)


class BatchState:
    """Which calls of a batch have an outcome, and how many the transcript shows.

    Args:
        calls: the owed calls of the assistant message, in call order.
        done: outcomes committed already (read from the steps on a replay).
    """

    def __init__(self, calls: Sequence[ToolCall], done: Mapping[str, CallOutcome]) -> None:
        self.calls = list(calls)
        self.done: dict[str, CallOutcome] = dict(done)
        self.listed = 0
        """How many of :attr:`calls` have their tool message in the transcript."""

    def ready(self) -> list[tuple[ToolCall, CallOutcome]]:
        """The calls whose tool messages may be appended now: from the first one not in the
        transcript, every call with an outcome, up to the first one without."""
        out: list[tuple[ToolCall, CallOutcome]] = []
        for call in self.calls[self.listed:]:
            outcome = self.done.get(call.id)
            if outcome is None:
                break
            out.append((call, outcome))
        return out


__all__ = ["BatchState", "tool_message"]
