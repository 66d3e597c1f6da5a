"""What the Slack channel's calls send (F16): stream chunks and blocks.

Text goes as ``markdown_text`` chunks and the tool timeline as ``task_update`` chunks; a
message is one ``mrkdwn`` section; a prompt is a message with Approve and Deny buttons that
carry the routing of the answer (never who answers).
"""

from __future__ import annotations

import json
from typing import Any

from ..records import InputRequest
from .threads import Chunk, Task

APPROVE = "durable_turns.approve"
"""The ``action_id`` of a prompt's Approve button."""
DENY = "durable_turns.deny"
"""The ``action_id`` of a prompt's Deny button."""
TEXT_LIMIT = 3000
"""The most characters a ``mrkdwn`` section holds."""


def chunk_json(chunk: Chunk) -> dict[str, Any]:
    """A stream chunk as Slack's: ``markdown_text``, or ``task_update`` for a tool's line."""
    if not isinstance(chunk, Task):
        return {"type": "markdown_text", "text": chunk.text}
    out: dict[str, Any] = {"type": "task_update", "id": chunk.id, "title": chunk.title,
                           "status": chunk.status}
    if chunk.output:
        out["output"] = chunk.output[:500]
    return out


def text_blocks(text: str) -> list[dict[str, Any]]:
    """One ``mrkdwn`` section holding ``text`` (cut to Slack's 3,000 characters)."""
    return [{"type": "section", "text": {"type": "mrkdwn", "text": text[:TEXT_LIMIT]}}]


def prompt_blocks(session: str, turn_id: str, request: InputRequest) -> list[dict[str, Any]]:
    """An input request as blocks: its prompt, then Approve and Deny buttons."""
    # Routing only: who answers is the signed payload's user, never anything in the value.
    value = json.dumps({"s": session, "t": turn_id, "i": request.id}, separators=(",", ":"))
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": request.prompt}},
        {"type": "actions", "block_id": "durable_turns.answer", "elements": [
            {"type": "button", "action_id": APPROVE, "style": "primary", "value": value,
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": DENY, "style": "danger", "value": value,
             "text": {"type": "plain_text", "text": "Deny"}},
        ]},
    ]


__all__ = ["APPROVE", "DENY", "TEXT_LIMIT", "chunk_json", "prompt_blocks", "text_blocks"]
