"""Local fakes of the providers' HTTP APIs, speaking their real wire protocols.

- :mod:`fakes.anthropic_api`: ``POST /v1/messages`` (Anthropic Messages, SSE);
- :mod:`fakes.openai_api`: ``POST /v1/chat/completions`` (``chat.completion.chunk`` lines);
- :mod:`fakes.serving`: run one on loopback uvicorn in the test's loop, or in-process.
"""

from __future__ import annotations

import os
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from durable_turns.models import ModelEvent, ModelRequest


def clear_provider_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """Remove every ``ANTHROPIC_*`` / ``OPENAI_*`` variable so the SDKs read nothing ambient.

    ``HOME`` moves to the empty ``home``: the Anthropic SDK also looks for a credentials
    profile under ``~/.config/anthropic``.
    """
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))


async def collect(model: Any, request: ModelRequest) -> list[ModelEvent]:
    """Every event of one ``model.stream(request)``, the stream closed afterwards."""
    async with aclosing(model.stream(request)) as stream:
        return [ev async for ev in stream]
