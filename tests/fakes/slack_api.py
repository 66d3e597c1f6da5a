"""A local fake of Slack's Web API, and Slack's side of the inbound requests, for the tests.

The fake answers like Slack (per the Slack section of the project's protocol notes): HTTP 200 with
``{"ok": false, "error": …}`` for logical errors; ``ts`` strings (``"%.6f"``, strictly
increasing); messages stored with their ``thread_ts``; a streamed message is in streaming
state from ``chat.startStream`` until ``chat.stopStream``, or until no append came for
``stream_ttl`` seconds (then ``message_not_in_streaming_state``, as Slack ends a stream whose
appends stop); ``response_url`` hooks under ``/actions/<id>``; one-shot 429s with
``Retry-After``. Every call is logged, and a test waits on the log with :meth:`SlackFake.wait`
(woken by each call, bounded by a timeout).

The inbound helpers build requests the way Slack does: JSON event envelopes and
form-encoded ``payload=`` interactions, signed ``v0=HMAC_SHA256(secret, "v0:ts:body")``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

TOKEN = "xoxb-test-token"
SECRET = "test-signing-secret"
TEAM = "T0001"
BOT_USER = "UBOT"
BOT_ID = "B0001"
WAIT = 30.0


@dataclass
class Msg:
    """A message the fake holds."""

    channel: str
    ts: str
    text: str
    thread_ts: str | None = None
    blocks: list[Any] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    streaming: bool = False
    last_append: float = 0.0
    edited: bool = False
    ephemeral_for: str | None = None

    @property
    def markdown(self) -> str:
        """The text a streamed message shows: its markdown chunks, in order."""
        return "".join(c.get("text", "") for c in self.chunks if c["type"] == "markdown_text")

    def tasks(self) -> dict[str, str]:
        """Task id → its last status, from the message's task_update chunks."""
        out: dict[str, str] = {}
        for c in self.chunks:
            if c["type"] == "task_update":
                out[c["id"]] = c["status"]
        return out


class SlackFake:
    """The fake's state; ``app`` is its Starlette app."""

    def __init__(self, *, stream_ttl: float = 300.0) -> None:
        self.stream_ttl = stream_ttl
        self.messages: dict[tuple[str, str], Msg] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.call_times: list[float] = []
        """``time.perf_counter()`` at each call's arrival, in the order of ``calls``."""
        self.hooks: dict[str, dict[str, Any]] = {}
        self.hook_posts: list[tuple[str, dict[str, Any]]] = []
        self.rate_limits: dict[str, list[int]] = {}
        self.base = ""  # the URL it is served at, set by the test
        self._clock = itertools.count(1)
        self._changed: asyncio.Condition | None = None
        self.app = Starlette(routes=[
            Route("/api/{method}", self.api, methods=["POST", "GET"]),
            Route("/actions/{hook}", self.hook, methods=["POST"]),
        ])

    # -- for the tests ---------------------------------------------------------------------

    def rate_limit(self, method: str, retry_after: int = 0, times: int = 1) -> None:
        """Answer the next ``times`` calls of ``method`` with 429 and ``Retry-After``."""
        self.rate_limits.setdefault(method, []).extend([retry_after] * times)

    def expire_streams(self) -> int:
        """End every stream now, as Slack does when appends stop; returns how many."""
        live = [m for m in self.messages.values() if m.streaming]
        for m in live:
            m.streaming = False
        return len(live)

    def response_url(self, channel: str, ts: str) -> str:
        """A new ``response_url`` for the message ``(channel, ts)``."""
        hook = uuid.uuid4().hex
        self.hooks[hook] = {"channel": channel, "ts": ts}
        return f"{self.base}/actions/{hook}"

    def thread(self, channel: str, thread_ts: str) -> list[Msg]:
        """The bot's messages in a thread (ephemeral ones left out), oldest first."""
        return sorted((m for m in self.messages.values()
                       if m.channel == channel and m.thread_ts == thread_ts
                       and m.ephemeral_for is None), key=lambda m: float(m.ts))

    def ephemerals(self, user: str) -> list[Msg]:
        return [m for m in self.messages.values() if m.ephemeral_for == user]

    def called(self, method: str) -> list[dict[str, Any]]:
        return [body for m, body in self.calls if m == method]

    async def wait(self, cond: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        """Wait until ``cond()`` is truthy (checked after every call the fake answers)."""
        changed = self._condition()
        async with changed:
            try:
                async with asyncio.timeout(timeout):
                    while not (found := cond()):
                        await changed.wait()
            except TimeoutError:
                raise AssertionError(f"timed out waiting for {what}; calls: "
                                     f"{[m for m, _ in self.calls]}") from None
        return found

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        changed = self._condition()
        async with changed:
            changed.notify_all()

    # -- the Web API -----------------------------------------------------------------------

    def _ts(self) -> str:
        return f"{int(time.time()) + next(self._clock) / 1000:.6f}"

    async def api(self, request: Request) -> Response:
        method = request.path_params["method"]
        raw = await request.body()
        ctype = request.headers.get("content-type", "")
        if "json" in ctype:
            body = json.loads(raw or b"{}")
        else:
            body = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
        for name in ("blocks", "chunks", "attachments", "metadata"):
            if isinstance(body.get(name), str):
                try:
                    body[name] = json.loads(body[name])
                except ValueError:
                    return self._error("invalid_blocks" if name == "blocks" else
                                       "invalid_arguments")
        auth = request.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else body.get("token")
        self.calls.append((method, body))
        self.call_times.append(time.perf_counter())
        try:
            limits = self.rate_limits.get(method)
            if limits:
                after = limits.pop(0)
                return JSONResponse({"ok": False, "error": "ratelimited"}, status_code=429,
                                    headers={"Retry-After": str(after)})
            if not token:
                return self._error("not_authed")
            if token != TOKEN:
                return self._error("invalid_auth")
            handler = getattr(self, "m_" + method.replace(".", "_"), None)
            if handler is None:
                return self._error("unknown_method")
            out: Response = handler(body)
            return out
        finally:
            await self._notify()

    @staticmethod
    def _error(error: str) -> JSONResponse:
        return JSONResponse({"ok": False, "error": error})

    @staticmethod
    def _ok(**fields: Any) -> JSONResponse:
        return JSONResponse({"ok": True, **fields})

    def _message_json(self, m: Msg) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "message", "user": BOT_USER, "bot_id": BOT_ID,
                               "text": m.text, "ts": m.ts, "blocks": m.blocks}
        if m.thread_ts:
            out["thread_ts"] = m.thread_ts
        if m.edited:
            out["edited"] = {"user": BOT_USER, "ts": self._ts()}
        return out

    def _channel(self, body: dict[str, Any]) -> str | None:
        channel = body.get("channel")
        return channel if isinstance(channel, str) and channel[:1] in ("C", "D", "G") else None

    def m_auth_test(self, body: dict[str, Any]) -> Response:
        return self._ok(url="https://fake.slack.test/", team="Fake", user="bot", team_id=TEAM,
                        user_id=BOT_USER, bot_id=BOT_ID)

    def m_chat_postMessage(self, body: dict[str, Any]) -> Response:
        channel = self._channel(body)
        if channel is None:
            return self._error("channel_not_found")
        if not (body.get("text") or body.get("blocks") or body.get("attachments")):
            return self._error("no_text")
        if body.get("blocks") is not None and not isinstance(body["blocks"], list):
            return self._error("invalid_blocks")
        m = Msg(channel, self._ts(), body.get("text") or "", body.get("thread_ts"),
                list(body.get("blocks") or []))
        self.messages[(channel, m.ts)] = m
        return self._ok(channel=channel, ts=m.ts, message=self._message_json(m))

    def m_chat_postEphemeral(self, body: dict[str, Any]) -> Response:
        channel = self._channel(body)
        if channel is None:
            return self._error("channel_not_found")
        if not body.get("user"):
            return self._error("user_not_in_channel")
        if not (body.get("text") or body.get("blocks")):
            return self._error("no_text")
        m = Msg(channel, self._ts(), body.get("text") or "", body.get("thread_ts"),
                ephemeral_for=body["user"])
        self.messages[(channel, m.ts)] = m
        return self._ok(message_ts=m.ts)

    def m_chat_update(self, body: dict[str, Any]) -> Response:
        channel = self._channel(body)
        m = self.messages.get((channel or "", str(body.get("ts"))))
        if m is None:
            return self._error("message_not_found")
        if not (body.get("text") or body.get("blocks")):
            return self._error("no_text")
        m.text = body.get("text") or ""
        m.blocks = list(body.get("blocks") or [])
        m.edited, m.streaming = True, False
        return self._ok(channel=channel, ts=m.ts, text=m.text, message=self._message_json(m))

    def _streaming(self, body: dict[str, Any]) -> Msg | Response:
        channel = self._channel(body)
        m = self.messages.get((channel or "", str(body.get("ts"))))
        if m is None:
            return self._error("message_not_found")
        if m.streaming and time.monotonic() - m.last_append > self.stream_ttl:
            m.streaming = False  # appends stopped: Slack ended the stream
        if not m.streaming:
            return self._error("message_not_in_streaming_state")
        return m

    def _chunks(self, body: dict[str, Any]) -> list[dict[str, Any]] | None:
        chunks = list(body.get("chunks") or [])
        if body.get("markdown_text"):
            chunks.insert(0, {"type": "markdown_text", "text": body["markdown_text"]})
        for c in chunks:
            if not isinstance(c, dict) or c.get("type") not in (
                    "markdown_text", "task_update", "plan_update", "blocks"):
                return None
            if c["type"] == "task_update" and not (
                    c.get("id") and c.get("title")
                    and c.get("status") in ("pending", "in_progress", "complete", "error")):
                return None
        return chunks

    def m_chat_startStream(self, body: dict[str, Any]) -> Response:
        channel = self._channel(body)
        if channel is None:
            return self._error("channel_not_found")
        if not body.get("thread_ts"):
            return self._error("invalid_arguments")
        if channel.startswith("C") and not (body.get("recipient_user_id")
                                            and body.get("recipient_team_id")):
            return self._error("invalid_arguments")  # required when streaming to channels
        chunks = self._chunks(body)
        if chunks is None:
            return self._error("invalid_chunks")
        m = Msg(channel, self._ts(), "", body["thread_ts"], chunks=chunks, streaming=True,
                last_append=time.monotonic())
        self.messages[(channel, m.ts)] = m
        return self._ok(channel=channel, ts=m.ts)

    def m_chat_appendStream(self, body: dict[str, Any]) -> Response:
        m = self._streaming(body)
        if isinstance(m, Response):
            return m
        chunks = self._chunks(body)
        if not chunks:
            return self._error("invalid_chunks")
        m.chunks.extend(chunks)
        m.last_append = time.monotonic()
        return self._ok(channel=m.channel, ts=m.ts)

    def m_chat_stopStream(self, body: dict[str, Any]) -> Response:
        m = self._streaming(body)
        if isinstance(m, Response):
            return m
        chunks = self._chunks(body)
        if chunks is None:
            return self._error("invalid_chunks")
        m.chunks.extend(chunks)
        m.streaming = False
        m.text = m.markdown
        if body.get("blocks"):
            m.blocks = list(body["blocks"])
        return self._ok(channel=m.channel, ts=m.ts, message=self._message_json(m))

    # -- response_url ----------------------------------------------------------------------

    async def hook(self, request: Request) -> Response:
        hook = request.path_params["hook"]
        body = json.loads(await request.body() or b"{}")
        self.hook_posts.append((hook, body))
        try:
            target = self.hooks.get(hook)
            if target is None:
                return PlainTextResponse("no_service", status_code=404)
            if body.get("response_type") == "ephemeral" and not body.get("replace_original"):
                m = Msg(target["channel"], self._ts(), body.get("text") or "",
                        ephemeral_for=target.get("user", "?"))
                self.messages[(m.channel, m.ts)] = m
            elif body.get("replace_original"):
                m = self.messages[(target["channel"], target["ts"])]
                m.text = body.get("text") or ""
                m.blocks = list(body.get("blocks") or [])
                m.edited = True
            return PlainTextResponse("ok")
        finally:
            await self._notify()


# -- Slack's side of the inbound requests --------------------------------------------------

def sign(body: bytes, secret: str = SECRET, ts: int | None = None) -> dict[str, str]:
    """The headers Slack sends with ``body``: its timestamp and its v0 signature."""
    stamp = str(int(time.time()) if ts is None else ts)
    digest = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body,
                      hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}


def event_callback(text: str, *, user: str = "U1", channel: str = "C1", ts: str | None = None,
                   thread_ts: str | None = None, kind: str = "app_mention",
                   event_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """An ``event_callback`` envelope around an ``app_mention`` (or ``message``) event."""
    ts = ts or f"{time.time():.6f}"
    event: dict[str, Any] = {"type": kind, "user": user, "text": text, "ts": ts,
                             "channel": channel, "event_ts": ts, "team": TEAM,
                             "client_msg_id": uuid.uuid4().hex,
                             "blocks": [{"type": "rich_text", "block_id": "b",
                                         "elements": []}]}
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    if kind == "message":
        event["channel_type"] = "channel"
    event.update(extra)
    return {"token": "legacy", "team_id": TEAM, "api_app_id": "A0001", "event": event,
            "type": "event_callback", "event_id": event_id or f"Ev{uuid.uuid4().hex[:10]}",
            "event_time": int(time.time()),
            "authorizations": [{"enterprise_id": None, "team_id": TEAM, "user_id": BOT_USER,
                                "is_bot": True, "is_enterprise_install": False}],
            "is_ext_shared_channel": False, "event_context": "4-eyJ"}


def block_actions(fake: SlackFake, prompt: Msg, *, user: str, approve: bool) -> bytes:
    """The form body of a click on a posted prompt's Approve (or Deny) button."""
    button = next(e for b in prompt.blocks if b["type"] == "actions" for e in b["elements"]
                  if e["action_id"].endswith("approve" if approve else "deny"))
    url = fake.response_url(prompt.channel, prompt.ts)
    fake.hooks[url.rsplit("/", 1)[1]]["user"] = user
    payload: dict[str, Any] = {
        "type": "block_actions", "user": {"id": user, "username": user, "name": user,
                                          "team_id": TEAM},
        "api_app_id": "A0001", "token": "legacy",
        "container": {"type": "message", "message_ts": prompt.ts, "channel_id": prompt.channel,
                      "is_ephemeral": False, "thread_ts": prompt.thread_ts},
        "trigger_id": "1.2.3", "team": {"id": TEAM, "domain": "fake"}, "enterprise": None,
        "channel": {"id": prompt.channel, "name": "general"},
        "message": {"type": "message", "ts": prompt.ts, "thread_ts": prompt.thread_ts,
                    "text": prompt.text, "blocks": prompt.blocks, "user": BOT_USER,
                    "bot_id": BOT_ID},
        "state": {"values": {}}, "response_url": url,
        "actions": [{"action_id": button["action_id"], "block_id": "durable_turns.answer",
                     "text": button["text"], "value": button["value"],
                     "style": button.get("style"), "type": "button",
                     "action_ts": f"{time.time():.6f}"}],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def signed(body: dict[str, Any] | bytes, *, secret: str = SECRET, ts: int | None = None,
           retry: int | None = None) -> tuple[bytes, dict[str, str]]:
    """A body and its headers as Slack sends them (``retry``: a resend's
    ``X-Slack-Retry-Num``)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = sign(raw, secret, ts)
    headers["Content-Type"] = ("application/x-www-form-urlencoded" if isinstance(body, bytes)
                               else "application/json")
    if retry is not None:
        headers["X-Slack-Retry-Num"] = str(retry)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    return raw, headers
