"""The ToyChat channel, written as a third party would: its routes and its platform calls on
``durable_turns.channels.thread_channel.ThreadChannel``, and nothing else.

Inbound, ToyChat signs its webhooks (``X-Toy-Signature``); a message becomes a turn of
session ``toychat:<room>:<thread>``, a button click an answer by the clicker. Outbound, every
call is JSON over HTTP to ToyChat's Web API with the bot's token.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from durable_turns.channels.thread_channel import Click, Said, ThreadChannel
from durable_turns.channels.threads import Chunk, StreamEnded, Text, Thread, outcome
from durable_turns.events import InputRequested, TurnEvent
from durable_turns.records import InputRequest


class ToyChat(ThreadChannel):
    """An agent in ToyChat's threads."""

    name = "toychat"

    def __init__(self, api: str, token: str, secret: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.api, self.token, self.secret = api.rstrip("/"), token, secret

    # -- routes -------------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        return [Route("/toychat/events", self.events, methods=["POST"]),
                Route("/toychat/clicks", self.clicks, methods=["POST"])]

    async def _verified(self, request: Request) -> dict[str, Any] | None:
        body = await request.body()
        mac = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac, request.headers.get("x-toy-signature", "")):
            return None
        found = json.loads(body)
        return found if isinstance(found, dict) else None

    async def events(self, request: Request) -> Response:
        m = await self._verified(request)
        if m is None:
            return JSONResponse({"error": "bad signature"}, status_code=401)
        room, thread = str(m["room"]), str(m["thread"])
        await self.message(Said(f"toychat:{room}:{thread}", f"toychat:{m['id']}",
                                str(m["user"]), str(m["text"]),
                                route={"room": room, "thread": thread}))
        return Response(status_code=200)

    async def clicks(self, request: Request) -> Response:
        c = await self._verified(request)
        if c is None:
            return JSONResponse({"error": "bad signature"}, status_code=401)
        value = json.loads(c["value"])
        self.click(Click(value["s"], value["t"], value["i"], value["a"], str(c["user"]),
                         reply={"message": str(c["message"]), "prompt": value["p"],
                                "room": value["r"], "thread": value["h"]}))
        return Response(status_code=200)

    # -- platform calls -------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: Mapping[str, Any]) -> Any:
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.request(method, f"{self.api}{path}", json=dict(body),
                                     headers={"Authorization": f"Bearer {self.token}"})
        if r.status_code == 409:
            raise StreamEnded(r.json()["error"])
        r.raise_for_status()
        return r.json()

    async def _post(self, room: str, thread: str, text: str, **more: Any) -> str:
        posted = await self._call("POST", "/api/messages",
                                  {"room": room, "thread": thread, "text": text, **more})
        return str(posted["id"])

    async def start_stream(self, thread: Thread, chunks: Sequence[Chunk]) -> str:
        started = await self._call("POST", "/api/streams", {**thread.route,
                                                             "text": _text(chunks)})
        return str(started["id"])

    async def append_stream(self, thread: Thread, message: str,
                            chunks: Sequence[Chunk]) -> None:
        await self._call("POST", f"/api/streams/{message}/append", {"text": _text(chunks)})

    async def stop_stream(self, thread: Thread, message: str,
                          chunks: Sequence[Chunk] = ()) -> None:
        await self._call("POST", f"/api/streams/{message}/stop", {"text": _text(chunks)})

    async def post(self, thread: Thread, text: str) -> str:
        return await self._post(thread.route["room"], thread.route["thread"], text)

    async def update(self, thread: Thread, message: str, text: str) -> None:
        await self._call("PUT", f"/api/messages/{message}", {"text": text})

    async def post_prompt(self, thread: Thread, request: InputRequest) -> str:
        return await self._prompt(thread.route["room"], thread.route["thread"],
                                  thread.session, thread.turn_id, request)

    async def _prompt(self, room: str, thread: str, session: str, turn_id: str,
                      request: InputRequest) -> str:
        def button(label: str, answer: bool) -> dict[str, str]:
            # Routing only: who answers is the signed click's user.
            return {"label": label, "value": json.dumps({
                "s": session, "t": turn_id, "i": request.id, "a": answer,
                "p": request.prompt, "r": room, "h": thread})}

        return await self._post(room, thread, request.prompt,
                                buttons=[button("Approve", True), button("Deny", False)])

    async def note(self, said: Said, text: str) -> None:
        await self._post(said.route["room"], said.route["thread"], text, private_to=said.user)

    async def refuse_click(self, click: Click, text: str) -> None:
        await self._post(click.reply["room"], click.reply["thread"], text,
                         private_to=click.by)

    async def answered(self, click: Click) -> None:
        verdict = "approved" if click.value else "denied"
        await self._call("PUT", f"/api/messages/{click.reply['message']}",
                         {"text": f"{click.reply['prompt']} ({verdict} by {click.by})"})

    async def post_outcome(self, target: Mapping[str, Any], end: TurnEvent) -> Any:
        room, thread = str(target["room"]), str(target.get("thread") or "main")
        if isinstance(end, InputRequested):
            return {"id": await self._prompt(room, thread, end.session, end.turn_id,
                                             end.request)}
        return {"id": await self._post(room, thread, outcome(end))}


def _text(chunks: Sequence[Chunk]) -> str:
    """ToyChat streams text only: a tool's line in the timeline is left out."""
    return "".join(c.text for c in chunks if isinstance(c, Text))


def toychat_from_env(env: Mapping[str, str]) -> ToyChat:
    """The channel's factory (``channels = {"toychat": toychat_from_env}`` in an app's
    ``agent.py``): ``TOYCHAT_API``, ``TOYCHAT_TOKEN``, ``TOYCHAT_SECRET``."""
    return ToyChat(env["TOYCHAT_API"], env["TOYCHAT_TOKEN"], env["TOYCHAT_SECRET"])
