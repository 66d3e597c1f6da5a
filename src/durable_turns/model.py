"""The ``Model`` seam (F11): what the engine asks a model, and what a model streams back.

The engine asks a model for one reply at a time::

    async for event in model.stream(request):
        ...  # TextDelta* , ToolCall*, then exactly one Stop

A stream that ends without a :class:`Stop` is a failed call, never a finished step. The
adapters that implement the seam live in the ``models`` package, one module per vendor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .messages import Message, ToolCall
from .tools import ToolSpec

__all__ = [
    "ABNORMAL_STOPS",
    "Model",
    "ModelEvent",
    "ModelRequest",
    "Stop",
    "TextDelta",
    "ThinkingDelta",
    "TokenCounter",
]


ABNORMAL_STOPS: frozenset[str] = frozenset(
    {
        "max_tokens",
        "length",
        "content_filter",
        "refusal",
        "model_context_window_exceeded",
    }
)
"""Stop reasons that, with an empty reply, fail the model step before it commits (F2)."""


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """What the engine asks a model: the system prompt, the transcript and the tools."""

    system: str
    messages: list[Message]
    """The session's transcript, oldest first (under ``Agent(context=…)``, its compacted
    view: F23). Do not mutate it."""
    tools: list[ToolSpec]
    turn_id: str = ""
    output: dict[str, Any] | None = None
    """The turn's output schema (F25, ``turn(output=…)``), given only to a model whose
    ``structured_output`` attribute is true: it asks its provider for a final answer that
    matches it (OpenAI's ``response_format``, Anthropic's ``output_config``), and the answer's
    text is the JSON value. For any other model it is ``None`` and the schema is asked for in
    ``system``. Either way the engine validates the answer."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the reply's text, streamed live and never persisted."""

    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    """A piece of the model's reasoning, streamed live; never shown as answer text."""

    text: str


@dataclass(frozen=True, slots=True)
class Stop:
    """The end of a reply.

    Attributes:
        reason: the provider's stop reason (``end_turn``, ``tool_use``, ``max_tokens``, …).
        usage: token counts (``input_tokens``, ``output_tokens``, cache counts).
        content: provider-native blocks to store verbatim with the assistant message
            (for example Anthropic thinking blocks with their signatures).
    """

    reason: str
    usage: dict[str, int] = field(default_factory=dict)
    content: tuple[dict[str, Any], ...] = ()


ModelEvent = TextDelta | ThinkingDelta | ToolCall | Stop


class Model(Protocol):
    """Anything that streams one reply for a :class:`ModelRequest`.

    Called by the engine once per model step, never concurrently for one session. It must
    yield its events in order and end with exactly one :class:`Stop`; it raises
    :class:`~durable_turns.errors.ModelError` (translated from its SDK's exceptions) when the
    call fails. It must not persist anything: the engine commits the reply.

    A model that can ask its provider for structured output natively says so with a true
    ``structured_output`` attribute (optional: without it the engine asks in the system
    prompt); it is then handed :attr:`ModelRequest.output`.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...


@runtime_checkable
class TokenCounter(Protocol):
    """A :class:`Model` that can also count a request's input tokens (optional, F23).

    Called by the engine before a model step of an agent with ``Agent(context=Compaction(…))``
    (one count per model step), and on the request a compaction would send; it returns the
    number of input tokens ``request`` would take (system prompt, messages and tools). It must
    not create a reply nor persist anything; it raises
    :class:`~durable_turns.errors.ModelError` when the count fails, and the engine then falls
    back to its estimate. ``AnthropicModel`` implements it with the Messages API's
    ``count_tokens`` endpoint.
    """

    async def count_tokens(self, request: ModelRequest) -> int: ...
