"""A local fake of "ToyChat", a made-up chat platform with threads, for the outsider channel
test (``tests/channels/toychat.py`` is its channel, written as a third party would).

Its Web API is JSON over HTTP with a bearer token: ``POST /api/messages`` (a message in a
thread, maybe with buttons, maybe private to one user), ``PUT /api/messages/{id}`` (rewrite
it), ``POST /api/streams`` / ``…/{id}/append`` / ``…/{id}/stop`` (a message written as it
streams; 409 ``stream_ended`` once stopped). While :attr:`ToyChatFake.down` is set every call
is answered 503, as a platform that is away. Its users' side sends what the platform sends
an app: :meth:`ToyChatFake.say` and :meth:`ToyChatFake.click` post a signed webhook
(``X-Toy-Signature: hex HMAC-SHA256(secret, body)``) to the app. A test waits on what it
holds with :meth:`ToyChatFake.wait` (woken by every call, bounded by a timeout).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TOKEN = "toy-token"
SECRET = "toy-secret"
WAIT = 30.0
T = TypeVar("T")


def sign(secret: str, body: bytes) -> str:
    """What ToyChat puts in ``X-Toy-Signature``."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass
class Post:
    """A message the fake holds."""

    id: str
    room: str
    thread: str
    text: str
    buttons: list[dict[str, str]] = field(default_factory=list)
    private_to: str | None = None
    streaming: bool = False
    streamed: bool = False
    edited: bool = False


class ToyChatFake:
    """The fake's state; :attr:`app` is its Starlette app."""

    def __init__(self) -> None:
        self.posts: dict[str, Post] = {}
        self.calls: list[str] = []
        self.down = False
        self.app_url = ""  # where it sends webhooks, set by the test
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self.app = Starlette(routes=[
            Route("/api/messages", self.create, methods=["POST"]),
            Route("/api/messages/{id}", self.rewrite, methods=["PUT"]),
            Route("/api/streams", self.stream, methods=["POST"]),
            Route("/api/streams/{id}/{verb}", self.stream_more, methods=["POST"]),
        ])

    # -- for the tests ---------------------------------------------------------------------

    def thread(self, room: str, thread: str) -> list[Post]:
        """The thread's public messages, oldest first."""
        return [p for p in self.posts.values()
                if p.room == room and p.thread == thread and p.private_to is None]

    def private(self, user: str) -> list[Post]:
        return [p for p in self.posts.values() if p.private_to == user]

    async def wait(self, found: Callable[[], T | None], what: str) -> T:
        """Wait until ``found()`` is something (re-checked at each call the fake takes)."""
        try:
            async with asyncio.timeout(WAIT):
                while (got := found()) is None:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"no {what} within {WAIT}s; calls: {self.calls}") from None
        return got

    async def say(self, user: str, room: str, thread: str, text: str,
                  message_id: str) -> httpx.Response:
        """``user`` writes ``text`` in the thread: the webhook ToyChat sends the app."""
        return await self._send("/toychat/events", {
            "type": "message", "id": message_id, "user": user, "room": room,
            "thread": thread, "text": text})

    async def click(self, user: str, post: Post, label: str) -> httpx.Response:
        """``user`` clicks the button ``label`` of ``post``."""
        value = next(b["value"] for b in post.buttons if b["label"] == label)
        return await self._send("/toychat/clicks", {
            "type": "click", "user": user, "message": post.id, "value": value})

    async def _send(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        body = json.dumps(payload).encode()
        async with httpx.AsyncClient(timeout=WAIT) as client:
            return await client.post(f"{self.app_url}{path}", content=body, headers={
                "Content-Type": "application/json", "X-Toy-Signature": sign(SECRET, body)})

    # -- the Web API ------------------------------------------------------------------------

    async def _take(self, request: Request, call: str) -> dict[str, Any] | Response:
        self.calls.append(call)
        self._changed.set()
        if self.down:
            return JSONResponse({"error": "unavailable"}, status_code=503)
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"error": "not_authed"}, status_code=401)
        body = await request.json()
        assert isinstance(body, dict)
        return body

    def _new(self, body: dict[str, Any], **kw: Any) -> JSONResponse:
        post = Post(f"p{next(self._ids)}", str(body["room"]), str(body["thread"]),
                    str(body.get("text") or ""), **kw)
        self.posts[post.id] = post
        self._changed.set()
        return JSONResponse({"id": post.id})

    async def create(self, request: Request) -> Response:
        body = await self._take(request, "post")
        if isinstance(body, Response):
            return body
        return self._new(body, buttons=list(body.get("buttons") or []),
                         private_to=body.get("private_to"))

    async def rewrite(self, request: Request) -> Response:
        body = await self._take(request, "update")
        if isinstance(body, Response):
            return body
        post = self.posts[request.path_params["id"]]
        post.text, post.buttons, post.edited = str(body["text"]), [], True
        self._changed.set()
        return JSONResponse({})

    async def stream(self, request: Request) -> Response:
        body = await self._take(request, "stream")
        if isinstance(body, Response):
            return body
        return self._new(body, streaming=True, streamed=True)

    async def stream_more(self, request: Request) -> Response:
        verb = request.path_params["verb"]
        body = await self._take(request, verb)
        if isinstance(body, Response):
            return body
        post = self.posts[request.path_params["id"]]
        if not post.streaming:
            return JSONResponse({"error": "stream_ended"}, status_code=409)
        post.text += str(body.get("text") or "")
        post.streaming = verb != "stop"
        self._changed.set()
        return JSONResponse({})
