"""The adapters that implement the :class:`~durable_turns.model.Model` seam, one per vendor.

The seam itself lives in ``durable_turns/model.py``; this package re-exports it, so
``from durable_turns.models import Model`` works too. Adapters live in their own modules and
import their SDK lazily, so ``import durable_turns`` never imports ``anthropic`` or ``openai``:

- :func:`scripted` (``models/scripted.py``): offline and deterministic, for tests and demos;
- ``anthropic(...)`` (``models/anthropic_messages.py``, extra ``[anthropic]``);
- ``openai_compatible(...)`` (``models/openai_compat.py``, extra ``[openai]``).
"""

from __future__ import annotations

from typing import Any

from ..messages import ToolCall
from ..model import (
    ABNORMAL_STOPS,
    Model,
    ModelEvent,
    ModelRequest,
    Stop,
    TextDelta,
    ThinkingDelta,
)


def __getattr__(name: str) -> Any:
    # Adapters import their SDK; resolve them only when asked for.
    if name == "anthropic":
        from .anthropic_messages import anthropic

        return anthropic
    if name == "openai_compatible":
        from .openai_compat import openai_compatible

        return openai_compatible
    if name in ("scripted", "ModelReply", "ScriptedModel"):
        from . import scripted as _scripted

        return getattr(_scripted, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ABNORMAL_STOPS",
    "Model",
    "ModelEvent",
    "ModelReply",
    "ModelRequest",
    "Stop",
    "TextDelta",
    "ThinkingDelta",
    "ToolCall",
]
