"""An offline, deterministic model: replies written in advance or computed by a function."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from ..errors import ModelError
from ..messages import OUTPUT_RETRY_BY, ToolCall
from ..model import ModelEvent, ModelRequest, Stop, TextDelta


@dataclass(frozen=True, slots=True)
class ModelReply:
    """One scripted reply."""

    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    stop_reason: str | None = None
    """Defaults to ``tool_use`` when there are calls, else ``end_turn``."""
    usage: dict[str, int] = field(default_factory=dict)


ReplyFn = Callable[[ModelRequest], ModelReply | Awaitable[ModelReply]]


def calls_this_turn(request: ModelRequest) -> int:
    """How many model calls the current turn has made: the assistant messages since its opening.

    Counted from the transcript, so it is the same in a new process replaying the turn.
    """
    n = 0
    for m in reversed(request.messages):
        if m.is_opening and m.by != OUTPUT_RETRY_BY:  # (a validation error opens nothing)
            break
        if m.role == "assistant":
            n += 1
    return n


class ScriptedModel:
    """A :class:`~durable_turns.model.Model` that plays back :class:`ModelReply` values.

    Args:
        replies: a list (the i-th model call of a turn gets ``replies[i]``) or a function
            ``fn(request) -> ModelReply`` (may be async).
        delay: seconds to wait before each streamed delta (for tests of slow models).
        chunks: how many deltas the text is streamed in.
    """

    def __init__(
        self,
        replies: Sequence[ModelReply] | ReplyFn,
        *,
        delay: float = 0.0,
        chunks: int = 3,
    ) -> None:
        self._replies = replies
        self._delay = delay
        self._chunks = max(1, chunks)

    async def _reply(self, request: ModelRequest) -> ModelReply:
        if callable(self._replies):
            reply = self._replies(request)
            if isinstance(reply, Awaitable):
                reply = await reply
            return reply
        i = calls_this_turn(request)
        if i >= len(self._replies):
            raise ModelError(
                f"the scripted model has no reply #{i + 1} for this turn "
                f"(it was given {len(self._replies)})",
                provider="scripted",
            )
        return self._replies[i]

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        reply = await self._reply(request)
        text = reply.text
        if text:
            size = -(-len(text) // self._chunks)
            for start in range(0, len(text), size):
                if self._delay:
                    await asyncio.sleep(self._delay)
                yield TextDelta(text[start : start + size])
        for call in reply.tool_calls:
            yield call
        reason = reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn")
        yield Stop(reason=reason, usage=dict(reply.usage))


def scripted(
    replies: Sequence[ModelReply] | ReplyFn, *, delay: float = 0.0, chunks: int = 3
) -> ScriptedModel:
    """Build a :class:`ScriptedModel` (see there)."""
    return ScriptedModel(replies, delay=delay, chunks=chunks)


__all__ = ["ModelReply", "ReplyFn", "ScriptedModel", "calls_this_turn", "scripted"]
