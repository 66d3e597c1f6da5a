"""Slack's side of a thread reply (F16): the platform calls and the blocks they send.

:class:`SlackThreads` is the :class:`~durable_turns.channels.threads.ThreadPlatform` of
Slack: a stream is ``chat.startStream`` / ``appendStream`` / ``stopStream`` (text as
``markdown_text`` chunks, the tool timeline as ``task_update`` chunks), a message
``chat.postMessage`` / ``chat.update`` with one ``mrkdwn`` section, a prompt a message with
Approve and Deny buttons. What a reply is (and what it stores) is
:mod:`durable_turns.channels.threads`'; this module knows nothing of HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from ..records import InputRequest
from .threads import Chunk, StreamEnded, Task, Thread

APPROVE = "durable_turns.approve"
"""The ``action_id`` of a prompt's Approve button."""
DENY = "durable_turns.deny"
"""The ``action_id`` of a prompt's Deny button."""
TEXT_LIMIT = 3000
"""The most characters a ``mrkdwn`` section holds."""


class SlackThreads:
    """Thread replies' calls on Slack's Web API (``client``)."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client

    async def start_stream(self, thread: Thread, chunks: Sequence[Chunk]) -> str:
        kw: dict[str, Any] = {}
        if thread.user:
            kw.update(recipient_user_id=thread.user)
        if thread.route.get("team"):
            kw.update(recipient_team_id=str(thread.route["team"]))
        started = await self.client.chat_startStream(
            channel=_channel(thread), thread_ts=_thread_ts(thread),
            chunks=[_chunk(c) for c in chunks], task_display_mode="timeline", **kw)
        return str(started["ts"])

    async def append_stream(self, thread: Thread, message: str,
                            chunks: Sequence[Chunk]) -> None:
        try:
            await self.client.chat_appendStream(channel=_channel(thread), ts=message,
                                                chunks=[_chunk(c) for c in chunks])
        except SlackApiError as e:
            raise StreamEnded(str(e.response.get("error"))) from e

    async def stop_stream(self, thread: Thread, message: str,
                          chunks: Sequence[Chunk] = ()) -> None:
        try:
            await self.client.chat_stopStream(
                channel=_channel(thread), ts=message,
                chunks=[_chunk(c) for c in chunks] if chunks else None)
        except SlackApiError as e:
            raise StreamEnded(str(e.response.get("error"))) from e

    async def post(self, thread: Thread, text: str) -> str:
        posted = await self.client.chat_postMessage(
            channel=_channel(thread), thread_ts=_thread_ts(thread), text=text,
            blocks=text_blocks(text))
        return str(posted["ts"])

    async def update(self, thread: Thread, message: str, text: str) -> None:
        await self.client.chat_update(channel=_channel(thread), ts=message, text=text,
                                      blocks=text_blocks(text))

    async def post_prompt(self, thread: Thread, request: InputRequest) -> str:
        posted = await self.client.chat_postMessage(
            channel=_channel(thread), thread_ts=_thread_ts(thread), text=request.prompt,
            blocks=prompt_blocks(thread.session, thread.turn_id, request))
        return str(posted["ts"])


def _channel(thread: Thread) -> str:
    return str(thread.route.get("channel"))


def _thread_ts(thread: Thread) -> str:
    return str(thread.route.get("thread_ts"))


def _chunk(chunk: Chunk) -> dict[str, Any]:
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


__all__ = ["APPROVE", "DENY", "TEXT_LIMIT", "SlackThreads", "prompt_blocks", "text_blocks"]
