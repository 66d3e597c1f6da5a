"""Every frontend protocol this package speaks, mounted at once (what ``durable-turns serve``
does): the AI SDK's UI message stream always, AG-UI when its extra is installed."""

from __future__ import annotations

import importlib.util

from starlette.applications import Starlette

from ._ai_sdk import mount_ai_sdk


def mount_frontends(app: Starlette) -> list[str]:
    """Mount the AI SDK's protocol and, with the ``ag-ui`` extra, AG-UI on ``app`` (an app of
    ``create_app`` serving the API), at their default paths.

    Returns:
        The protocols mounted (``["ai-sdk", "ag-ui"]``).

    Raises:
        ConfigurationError: ``app`` is no such app, or one of them is mounted already.
    """
    mount_ai_sdk(app)
    if importlib.util.find_spec("ag_ui") is None:
        return ["ai-sdk"]
    from ._ag_ui import mount_ag_ui

    mount_ag_ui(app)
    return ["ai-sdk", "ag-ui"]


__all__ = ["mount_frontends"]
