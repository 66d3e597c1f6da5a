"""Long sessions and the context window (F23): what a model request sends of a transcript
that outgrew the window.

The store keeps every message. Before a model step whose request would be over
:attr:`Compaction.trigger_tokens`, the engine runs a **compaction step** (``compact:<n>``): it
clears older tool results in the request (``{"cleared": true, "bytes": N}``) and, if that is
not enough, asks a model to summarise the messages before the kept tail. What it decided — the
summary, the index it covers, where tool results stop being cleared — commits as one step
(:class:`CompactionMemo`), so a replay sends exactly what the first run
sent and never summarises again. Every later request is the system prompt, the summary (a
``user`` message), then the rest of the transcript.

:func:`request_view` builds a request's messages from a transcript and the last memo; it is
the one place both the engine and ``session.context()`` read it from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ._compact_memo import CompactionMemo, CompactStepId
from .errors import ConfigurationError
from .messages import Message, encode_json, encode_message
from .records import StepRecord
from .tools import ToolSpec

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "SUMMARY_PREFIX",
    "CompactStepId",
    "Compaction",
    "CompactionMemo",
    "estimate_tokens",
    "latest_compaction",
    "request_view",
]

SUMMARY_PREFIX = "[Summary of the conversation so far]\n"
"""How the summary message of a compacted request begins."""

DEFAULT_INSTRUCTIONS = (
    "Summarise the conversation above for your own later use: the user's goals, the facts "
    "and decisions established, what the tools returned that still matters, and what is "
    "still open. Write only the summary."
)


@dataclass(frozen=True, slots=True)
class Compaction:
    """How an agent keeps its model requests under a size (``Agent(context=…)``).

    Args:
        trigger_tokens: compact before a model request estimated over this many tokens.
        keep_recent: at least this many of the newest messages are sent as they are (the
            kept tail; it starts at a ``user`` or ``trigger`` message, so a tool call is
            never cut from its result).
        clear_tool_results: first try clearing the results of older tool calls.
        model: the model that writes summaries; else the agent's.
        instructions: what the summary model is told; else a default.
    """

    trigger_tokens: int
    keep_recent: int = 8
    clear_tool_results: bool = True
    model: Any = None
    instructions: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.trigger_tokens, int) or self.trigger_tokens <= 0:
            raise ConfigurationError(f"Compaction: trigger_tokens must be an int > 0, got "
                                     f"{self.trigger_tokens!r}")
        if not isinstance(self.keep_recent, int) or self.keep_recent < 1:
            raise ConfigurationError(f"Compaction: keep_recent must be an int >= 1, got "
                                     f"{self.keep_recent!r}")


def _cleared(m: Message) -> Message:
    if m.role != "tool" or (isinstance(m.result, dict) and m.result.get("cleared") is True):
        return m
    size = len(encode_json(m.result).encode())
    return replace(m, result={"cleared": True, "bytes": size})


def request_view(transcript: list[Message], memo: CompactionMemo | None) -> list[Message]:
    """The messages a model request sends of ``transcript`` under compaction ``memo``."""
    if memo is None:
        return transcript
    head = [Message("user", SUMMARY_PREFIX + memo.summary)] if memo.summary else []
    cleared = [_cleared(m) for m in transcript[memo.covered:memo.cleared]]
    return head + cleared + transcript[max(memo.covered, memo.cleared):]


def estimate_tokens(system: str, messages: list[Message], tools: list[ToolSpec]) -> int:
    """A request's size in tokens, estimated as its JSON's length over four."""
    size = len(system) + sum(len(encode_message(m)) for m in messages)
    size += sum(len(encode_json(t.to_dict())) for t in tools)
    return size // 4


def latest_compaction(steps: dict[str, StepRecord],
                      transcript: list[Message]) -> tuple[int, CompactionMemo | None]:
    """The newest compaction among ``steps`` that fits ``transcript``: ``(n, memo)``."""
    best: tuple[int, CompactionMemo | None] = (-1, None)
    for record in steps.values():
        if record.kind != "compact":
            continue
        step, memo = record.step, record.result
        if isinstance(step, CompactStepId) and isinstance(memo, CompactionMemo) \
                and best[0] < step.n <= len(transcript):
            best = (step.n, memo)
    return best
