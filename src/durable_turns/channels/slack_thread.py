"""A Slack turn's reply in its thread (F16): streaming it, pausing it, finishing it after a
restart, and rendering what it shows.

:class:`ThreadReply` turns one turn's events into Slack calls — ``chat.startStream`` /
``appendStream`` / ``stopStream`` with ``task_update`` chunks for the tool timeline, the
approval prompt with its buttons, ``chat.update`` for a stream it cannot append to any more —
and keeps what it delivered on the turn's chain entry (``SessionStore.set_turn_data``, name
:data:`STATE`). ``durable_turns.channels.slack`` drives it; this module knows nothing of HTTP.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from ..events import TurnEvent
from ..records import SessionKey, TurnRecord
from ..stores import SessionStore

log = logging.getLogger("durable_turns.slack")

APPROVE = "durable_turns.approve"
"""The ``action_id`` of a prompt's Approve button."""
DENY = "durable_turns.deny"
"""The ``action_id`` of a prompt's Deny button."""
SUPERSEDED = "superseded by a newer message"
"""How a reply superseded by a newer message in its thread ends."""
STATE = "slack"
"""The name the channel keeps its delivery state under, on a turn's chain entry."""
ENDS = frozenset({"turn.completed", "turn.failed", "turn.cancelled"})
"""Event types a turn ends on (``input.requested`` only parks it)."""
LIVE = frozenset({"message.delta", "message.retry"})
"""Event types that are never stored (their ``seq`` is the last stored event's)."""


class ThreadReply:
    """One turn's reply in its thread: what is on Slack, and how to go on after a restart.

    A *segment* runs from the turn's start (or from an answered park) to its end or its next
    park; it is streamed into one message (or, after a pause for a long tool, more). The
    stored state: ``seq`` (the last event delivered in full), ``stream`` (the open stream's
    ``ts`` and the seq its content starts after), ``prompts`` (input id → ts), ``done``.
    """

    def __init__(self, client: AsyncWebClient, store: SessionStore, key: SessionKey,
                 rec: TurnRecord) -> None:
        self.client = client
        self.store = store
        self.key = key
        self.turn_id = rec.turn_id
        meta = turn_meta(rec)
        self.channel = str(meta.get("channel"))
        self.thread = str(meta.get("thread_ts"))
        self.team = str(meta.get("team") or "")
        user = (rec.event or {}).get("user") or {}
        self.user = str(user.get("id") or "")
        state = reply_state(rec)
        self.seq = int(state.get("seq", 0))
        self.prompts: dict[str, str] = dict(state.get("prompts") or {})
        stream = state.get("stream")
        # A stream this process did not open is past repair by appends (it may have
        # expired): its message is rewritten whole with chat.update at the segment's end.
        self.stale: dict[str, Any] | None = stream if stream else None
        self.ts: str | None = None
        self.live = False
        self.segment: list[TurnEvent] = []
        self.streamed = ""

    async def _save(self, **changes: Any) -> None:
        state = {"seq": self.seq, "prompts": self.prompts,
                 "stream": ({"ts": self.ts, "after": self._after} if self.ts else self.stale),
                 **changes}
        await self.store.set_turn_data(self.key, self.turn_id, STATE, state)

    _after = 0

    async def on(self, e: TurnEvent) -> bool:
        """Render one event; True when this delivery is over (the turn ended or parked)."""
        if e.child is not None:
            # A subagent's work forwarded into this turn (F13): its text, ends and questions
            # are not this reply's (a child that asks parks the parent, which asks itself).
            self.seq = max(self.seq, e.seq)
            return False
        if e.type == "turn.started":
            self.seq = max(self.seq, e.seq)
            return False
        if e.type == "message.retry":
            # The failed attempt's text is void and the next attempt streams from the start:
            # what was appended cannot be taken back, so the message is rewritten at the end.
            if self.streamed and self.ts is not None and self.live:
                with contextlib.suppress(SlackApiError):
                    await self.client.chat_stopStream(channel=self.channel, ts=self.ts)
                self.live = False
            self.streamed = ""
            return False
        if e.type not in LIVE:
            self.segment.append(e)
        if e.type == "message.delta":
            text = str(e.to_dict()["text"])
            self.streamed += text
            await self._append([{"type": "markdown_text", "text": text}])
        elif e.type == "message.completed":
            text = str(e.to_dict()["text"])
            rest = text[len(self.streamed):] if text.startswith(self.streamed) else text
            self.streamed = ""
            if rest:
                await self._append([{"type": "markdown_text", "text": rest}])
        elif e.type == "action.requested":
            call = e.to_dict()["call"]
            await self._append([_task(call, "in_progress")])
        elif e.type == "action.completed":
            d = e.to_dict()
            await self._append([_task(d["call"], "error" if d.get("error") else "complete",
                                      d.get("error"))])
        elif e.type == "input.requested":
            await self._finish(e)
            first = e.to_dict()["request"]
            # Calls of a parallel batch that park at once (F15): a prompt for each.
            for req in [first, *first.get("more", ())]:
                if req["id"] not in self.prompts:
                    posted = await self.client.chat_postMessage(
                        channel=self.channel, thread_ts=self.thread, text=req["prompt"],
                        blocks=prompt_blocks(self.key.session, self.turn_id, req))
                    self.prompts[req["id"]] = str(posted["ts"])
            self.seq = e.seq
            await self._save()
            return True
        elif e.type in ENDS:
            await self._finish(e)
            self.seq = e.seq
            await self._save(done=True)
            return True
        return False

    async def _append(self, chunks: list[dict[str, Any]]) -> None:
        if self.stale is not None:
            return  # collected in self.segment; rewritten at the end
        try:
            if self.ts is None:
                self._after = self.segment[0].seq - 1 if self.segment else self.seq
                kw: dict[str, Any] = {}
                if self.user:
                    kw.update(recipient_user_id=self.user)
                if self.team:
                    kw.update(recipient_team_id=self.team)
                started = await self.client.chat_startStream(
                    channel=self.channel, thread_ts=self.thread, chunks=chunks,
                    task_display_mode="timeline", **kw)
                self.ts, self.live = str(started["ts"]), True
                await self._save()
            elif self.live:
                await self.client.chat_appendStream(channel=self.channel, ts=self.ts,
                                                    chunks=chunks)
        except SlackApiError as err:
            if self.ts is None:
                raise
            # The stream ended under us (it expired): the message is rewritten at the end.
            log.warning("slack: stream %s ended (%s); finishing it with chat.update",
                        self.ts, err.response.get("error"))
            self.live = False

    async def pause(self) -> None:
        """Nothing to append for a while (a long tool): stop the stream before Slack
        expires it; the segment goes on in a new message."""
        if self.ts is not None and self.live:
            with contextlib.suppress(SlackApiError):
                await self.client.chat_stopStream(channel=self.channel, ts=self.ts)
            self.seq = self.segment[-1].seq if self.segment else self.seq
            self.ts, self.live, self.segment = None, False, []
            await self._save()

    async def _finish(self, end: TurnEvent) -> None:
        note = closing(end)
        if self.stale is not None:
            events = [e for e in await self.store.read_events(
                self.key, after_seq=int(self.stale.get("after", 0)), turn_id=self.turn_id)
                if e.seq <= end.seq]
            text = render(events) or note or "(no reply)"
            await self.client.chat_update(channel=self.channel, ts=str(self.stale["ts"]),
                                          text=text, blocks=text_blocks(text))
            self.stale = None
            return
        if self.ts is None:
            text = render(self.segment)
            if text:
                await self.client.chat_postMessage(
                    channel=self.channel, thread_ts=self.thread,
                    text=text, blocks=text_blocks(text))
            return
        ts = self.ts
        if self.live:
            try:
                await self.client.chat_stopStream(
                    channel=self.channel, ts=ts,
                    chunks=[{"type": "markdown_text", "text": f"\n\n{note}"}] if note else None)
                self.ts = None
                return
            except SlackApiError as err:
                log.warning("slack: stopping stream %s failed (%s); finishing it with "
                            "chat.update", self.ts, err.response.get("error"))
        text = render(self.segment) or "(no reply)"  # the end's note included
        await self.client.chat_update(channel=self.channel, ts=ts, text=text,
                                      blocks=text_blocks(text))
        self.ts = None


# -- rendering -----------------------------------------------------------------------------

def _task(call: Mapping[str, Any], status: str, error: str | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {"type": "task_update", "id": str(call["id"]),
                             "title": str(call["name"]), "status": status}
    if error:
        chunk["output"] = error[:500]
    return chunk


def render(events: list[TurnEvent]) -> str:
    """A segment as one message's markdown: the tool timeline, then the text."""
    lines: list[str] = []
    texts: list[str] = []
    for e in events:
        if e.child is not None:  # a subagent's own work, not this reply's
            continue
        d = e.to_dict()
        if e.type == "action.completed":
            mark = "✗" if d.get("error") else "✓"
            lines.append(f"{mark} {d['call']['name']}" + (f": {d['error']}"
                                                          if d.get("error") else ""))
        elif e.type == "message.completed" and d["text"]:
            texts.append(str(d["text"]))
        elif e.type in ENDS or e.type == "input.requested":
            note = closing(e)
            if note:
                texts.append(note)
    return "\n".join([*lines, *([""] if lines and texts else []), *texts]).strip()


def closing(e: TurnEvent) -> str:
    """The line a reply ends with: why the turn failed or was cancelled (else empty)."""
    d = e.to_dict()
    if e.type == "turn.failed":
        return f"⚠️ Sorry, this failed: {d['error']}"
    if e.type == "turn.cancelled":
        reason = str(d["reason"])
        return f"_{SUPERSEDED}_" if reason.startswith("superseded") else f"_cancelled: {reason}_"
    return ""


def outcome(e: TurnEvent) -> str:
    """A turn's end as one message: its text, or why it failed or was cancelled."""
    d = e.to_dict()
    if e.type == "turn.completed":
        return str(d["text"]) or "(no reply)"
    return closing(e)


def text_blocks(text: str) -> list[dict[str, Any]]:
    """One ``mrkdwn`` section holding ``text`` (cut to Slack's 3,000 characters)."""
    return [{"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}}]


def prompt_blocks(session: str, turn_id: str,
                  request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An input request as blocks: its prompt, then Approve and Deny buttons."""
    # Routing only: who answers is the signed payload's user, never anything in the value.
    value = json.dumps({"s": session, "t": turn_id, "i": request["id"]}, separators=(",", ":"))
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": str(request["prompt"])}},
        {"type": "actions", "block_id": "durable_turns.answer", "elements": [
            {"type": "button", "action_id": APPROVE, "style": "primary", "value": value,
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": DENY, "style": "danger", "value": value,
             "text": {"type": "plain_text", "text": "Deny"}},
        ]},
    ]


def turn_meta(rec: TurnRecord) -> dict[str, Any]:
    """The routing the channel stored with the turn's inbound event (team, channel, …)."""
    return dict((rec.event or {}).get("meta") or {})


def reply_state(rec: TurnRecord) -> dict[str, Any]:
    """What the channel delivered of the turn so far (``data["slack"]``)."""
    return dict((rec.data or {}).get(STATE) or {})


__all__ = ["APPROVE", "DENY", "ENDS", "LIVE", "STATE", "SUPERSEDED", "ThreadReply", "closing",
           "outcome", "prompt_blocks", "render", "reply_state", "text_blocks", "turn_meta"]
