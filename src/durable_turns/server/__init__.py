"""The HTTP/SSE host of a runtime's agents (F12): ``create_app(runtime)`` → an ASGI app.

Needs the ``server`` extra (``pip install 'durable-turns[server]'``: Starlette, uvicorn,
sse-starlette). Routes, status codes and the SSE framing are in the README's
"HTTP/SSE host (F12)" section and at ``/openapi.json``. ``mount_ai_sdk(app)`` and
``mount_ag_ui(app)`` serve the AI SDK's ``useChat`` and AG-UI clients on the same sessions
(README: "Frontend protocols"; AG-UI needs the ``ag-ui`` extra).
"""

from __future__ import annotations

try:
    import sse_starlette  # noqa: F401
    import starlette  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        "durable_turns.server needs the server extra: pip install 'durable-turns[server]'"
    ) from e

from typing import Any

from ._ai_sdk import mount_ai_sdk
from ._app import PING, create_app
from ._fanout import MAX_BACKLOG
from ._http import MAX_BODY, Authenticate, is_loopback

__all__ = ["MAX_BACKLOG", "MAX_BODY", "PING", "Authenticate", "create_app", "is_loopback",
           "mount_ag_ui", "mount_ai_sdk"]


def __getattr__(name: str) -> Any:
    # AG-UI's types come with the ag-ui extra: imported when mount_ag_ui is first asked for.
    if name == "mount_ag_ui":
        from ._ag_ui import mount_ag_ui

        return mount_ag_ui
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
