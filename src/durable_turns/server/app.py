"""The routes of the HTTP host (F12): sessions, turns, answers and their event streams.

Each handler is a few calls to a :class:`~durable_turns.channels.ChannelContext` or an
:class:`~durable_turns.AgentSession`; the turn itself runs in the runtime, so it goes on
when the client that started it leaves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..agent import check_surfaces
from ..channels import Channel, ChannelContext, TurnStream, mount_agent
from ..errors import ConfigurationError
from ..events import TurnEvent
from ..inbound import InboundEvent
from ..records import TurnRecord
from ..runtime import Runtime
from ..sessions import AgentSession
from ._http import (
    Authenticate,
    HttpError,
    error_response,
    is_durable,
    is_loopback,
    principal_of,
    read_body,
)
from .console import console_routes
from .fanout import HEADERS, MAX_BACKLOG, EventStreamApp, FrameCache, Outbox, Pacer, Streams
from .lifespan import GRACE, host_lifespan
from .openapi import openapi
from .timeline import last_activity

PING = 15.0
"""Seconds between keep-alive comments on an idle event stream."""
SOURCE = "http"
"""The event source of the turns the API starts (it selects ``surfaces={"http": …}``)."""


class TurnBody(BaseModel):
    """``POST /turn`` and ``POST /chat``."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1)
    turn_id: str | None = Field(default=None, pattern=r"^[!-~]{1,200}$")
    """A new turn's id travels back in the ``X-Turn-Id`` header: 1 to 200 printable ASCII
    characters, no spaces (the server makes one when it is left out)."""
    replace: bool = False
    by: str | None = None
    """Development mode only: who speaks (with ``authenticate``, the principal's id)."""


class ResumeBody(BaseModel):
    """``POST /resume``."""

    model_config = ConfigDict(extra="forbid")
    turn_id: str = Field(min_length=1)
    input_id: str = Field(min_length=1)
    value: Any = None
    by: str | None = None


class CancelBody(BaseModel):
    """``POST /cancel``."""

    model_config = ConfigDict(extra="forbid")
    turn_id: str | None = Field(default=None, min_length=1)
    reason: str = "cancelled by request"


class ResetBody(BaseModel):
    """``POST /reset`` (no fields)."""

    model_config = ConfigDict(extra="forbid")


class RetryBody(BaseModel):
    """``POST /retry``: the failed turn to re-open where it failed (F2)."""

    model_config = ConfigDict(extra="forbid")
    turn_id: str = Field(min_length=1)


BODIES: dict[str, type[BaseModel]] = {
    "turn": TurnBody, "chat": TurnBody, "resume": ResumeBody, "cancel": CancelBody,
    "reset": ResetBody, "retry": RetryBody,
}


def create_app(runtime: Runtime, authenticate: Authenticate | None = None,
               channels: Sequence[Channel] = (), *, routes: Sequence[BaseRoute] = (),
               ping: float = PING, max_backlog: int = MAX_BACKLOG,
               grace: float = GRACE) -> Starlette:
    """The HTTP/SSE host of ``runtime``'s agents (F12), as a Starlette (ASGI) app.

    Its lifespan (run by uvicorn and any ASGI server that runs lifespans) opens the
    runtime, recovers its unfinished turns (when it drives), starts each channel and runs
    its ``recover()``; at shutdown it ends the open event streams, gives running turns
    ``grace`` seconds, stops the channels and closes the runtime. Without a lifespan (the
    app driven directly, ``httpx.ASGITransport``) the first request opens the runtime, and
    closing it is the caller's.

    Args:
        runtime: the runtime whose agents it serves.
        authenticate: ``authenticate(request)`` (sync or async) → the caller's principal,
            whose ``id`` (key or attribute) is the speaker and the resumer; ``None`` or an
            exception refuses (401). Without it the host is in development mode: ``by``
            comes from the body, and requests that did not arrive on loopback are refused.
        channels: the platforms it serves beside the API (:class:`~durable_turns.channels.
            Channel`; their ``mount(runtime)`` gives their routes). A channel checks its own
            requests (Slack: signatures), not ``authenticate``. A channel's ``name`` is the
            source of its turns: an agent's policy for a source neither it nor the API
            (``"http"``) emits is logged as a warning.
        routes: more Starlette routes to serve beside the API.
        ping: seconds between keep-alive comments on an idle event stream.
        max_backlog: bytes of events a ``GET …/events`` client may leave unread before it
            is cut off (it reconnects with ``Last-Event-ID`` and loses nothing durable).
        grace: seconds the lifespan's shutdown waits for running turns.

    Returns:
        The app. ``app.state.end_streams()`` ends every open ``GET …/events`` stream (the
        lifespan's shutdown and ``serve``'s SIGTERM call it); ``app.state.channel_routes``
        maps each channel's name to its routes (``"POST /slack/events"``, …).

    Raises:
        ConfigurationError: a channel that is no :class:`~durable_turns.channels.Channel`,
            two with one name, or one that cannot serve this runtime.
    """
    mounted: list[BaseRoute] = []
    served: dict[str, list[str]] = {}
    sources = {SOURCE}
    for ch in channels:
        if not isinstance(ch, Channel):
            raise ConfigurationError(
                f"{type(ch).__name__} is not a Channel (name, mount, start, recover, stop, "
                "deliver); pass plain routes as routes=[…]")
        if ch.name in sources:
            raise ConfigurationError(f"two channels (or a channel and the API) named "
                                     f"{ch.name!r}")
        its = ch.mount(runtime)
        mounted.extend(its)
        served[ch.name] = _paths(its)
        sources.add(ch.name)
    for agent in runtime.agents.values():
        check_surfaces(agent, sources)
    host = _Host(runtime, authenticate, ping, max_backlog)
    lifespan = host_lifespan(runtime, list(channels), host.streams.end_all, grace=grace)
    app = host.app([*mounted, *routes], lifespan)
    app.state.channel_routes = served
    return app


def _paths(routes: Sequence[BaseRoute]) -> list[str]:
    """``METHOD PATH`` of each route (what a banner shows of a channel's routes)."""
    return [f"{'/'.join(sorted((getattr(r, 'methods', None) or set()) - {'HEAD'}))} "
            f"{getattr(r, 'path', '?')}".strip() for r in routes]


class _Host:
    def __init__(self, runtime: Runtime, authenticate: Authenticate | None,
                 ping: float, max_backlog: int) -> None:
        self.rt = runtime
        self.authenticate = authenticate
        self.ping = ping
        self.max_backlog = max_backlog
        # Every subscriber of a session is handed the same event object: its frame is
        # encoded once (bench/sse.py: encoding per subscriber was a fifth of the fan-out).
        self.frames = FrameCache()
        self.streams = Streams()
        self.pacer = Pacer()
        self.mounted: dict[str, ChannelContext] = {
            name: mount_agent(agent, runtime) for name, agent in runtime.agents.items()}

    def app(self, extra: Sequence[BaseRoute], lifespan: Any) -> Starlette:
        base = "/agents/{agent}/sessions/{session}"
        routes: list[BaseRoute] = [
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/agents/{agent}/sessions", self.guard(self.list_sessions), methods=["GET"]),
            Route("/agents/{agent}/pending", self.guard(self.inbox), methods=["GET"]),
            Route(base, self.guard(self.show), methods=["GET"]),
            Route(f"{base}/turn", self.guard(self.turn), methods=["POST"]),
            Route(f"{base}/chat", self.guard(self.chat), methods=["POST"]),
            Route(f"{base}/resume", self.guard(self.resume), methods=["POST"]),
            Route(f"{base}/cancel", self.guard(self.cancel), methods=["POST"]),
            Route(f"{base}/reset", self.guard(self.reset), methods=["POST"]),
            Route(f"{base}/retry", self.guard(self.retry), methods=["POST"]),
            Route(f"{base}/events", self.guard(self.events), methods=["GET"]),
            *console_routes(self.rt, self.guard, self.authenticate is None),
            *extra,
        ]
        app = EventStreamApp(routes=routes, lifespan=lifespan, exception_handlers={
            404: self.not_found, 405: self.not_allowed})
        app.state.end_streams = self.streams.end_all
        return app

    # -- plumbing --------------------------------------------------------------------------

    def guard(self, handler: Any) -> Any:
        async def guarded(request: Request) -> Response:
            try:
                if self.authenticate is None:
                    server = request.scope.get("server") or ("127.0.0.1", 0)
                    if not is_loopback(str(server[0])):
                        raise HttpError(403, "DevelopmentMode",
                                        "no authenticate: serving loopback only")
                else:
                    request.state.by, request.state.principal = await principal_of(
                        request, self.authenticate, None)
                await self.rt.open()
                response: Response = await handler(request)
                return response
            except Exception as e:
                return error_response(e)

        return guarded

    async def not_found(self, request: Request, exc: Exception) -> Response:
        return error_response(HttpError(404, "NotFound", f"no route {request.url.path}"))

    async def not_allowed(self, request: Request, exc: Exception) -> Response:
        return error_response(HttpError(405, "MethodNotAllowed",
                                        f"{request.method} is not allowed here"))

    def by(self, request: Request, body_by: str | None) -> tuple[str | None, Any]:
        if self.authenticate is None:
            return body_by, None
        return request.state.by, request.state.principal

    def channel(self, request: Request) -> ChannelContext:
        agent = request.path_params["agent"]
        self.rt.key(agent, "_")  # raises UnknownAgentError
        return self.mounted[agent]

    def session(self, request: Request) -> AgentSession:
        return self.rt.session(request.path_params["agent"], request.path_params["session"])

    async def known_session(self, request: Request) -> AgentSession:
        s = self.session(request)
        if not (await s.summary()).exists:
            raise HttpError(404, "UnknownSession", f"no session {s.key}")
        return s

    def sse(self, events: AsyncIterator[TurnEvent], close: Any = None,
            headers: dict[str, str] | None = None) -> EventSourceResponse:
        async def frames() -> AsyncIterator[bytes]:
            try:
                async for e in events:
                    yield self.frames.frame(e)
            finally:
                if close is not None:
                    close()

        return EventSourceResponse(frames(), ping=self.ping, headers=headers)

    # -- routes ----------------------------------------------------------------------------

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi(BODIES, sorted(self.rt.agents)))

    async def list_sessions(self, request: Request) -> Response:
        agent = request.path_params["agent"]
        self.rt.key(agent, "_")
        out = []
        for found in await self.rt.queries.sessions(agent):
            s = self.rt.session(agent, found.key.session)
            out.append({"session": found.key.session, "status": found.status,
                        "generation": found.generation,
                        "last_activity": await last_activity(s)})
        return JSONResponse({"sessions": out})

    async def inbox(self, request: Request) -> Response:
        agent = request.path_params["agent"]
        self.rt.key(agent, "_")
        return JSONResponse({"pending": [
            {"session": found.key.session, "request": found.pending.to_dict()}
            for found in await self.rt.queries.inbox(agent) if found.pending is not None]})

    async def show(self, request: Request) -> Response:
        s = self.session(request)
        found = await s.summary()
        if not found.exists:
            raise HttpError(404, "UnknownSession", f"no session {s.key}")
        return JSONResponse({
            **found.to_dict(),
            "transcript": [_message(m) for m in await s.transcript()],
            "turns": [_turn(t) for t in await s.turns()],
        })

    async def _start(self, request: Request) -> TurnStream:
        body = await read_body(request, TurnBody)
        ch = self.channel(request)
        by, _principal = self.by(request, body.by)
        event = None
        if by is not None:
            # Attested: the principal's id, or (development mode) what the body says, which
            # that mode trusts by design (it serves loopback only).
            event = InboundEvent(SOURCE, {"id": by, "attested": True}, body.text)
        return await ch.open_turn(body.text, session=request.path_params["session"],
                                  replace=body.replace, event=event, turn_id=body.turn_id)

    async def turn(self, request: Request) -> Response:
        stream = await self._start(request)
        return self.sse(aiter(stream), stream.close, {"X-Turn-Id": stream.turn_id})

    async def chat(self, request: Request) -> Response:
        stream = await self._start(request)
        if "text/event-stream" in request.headers.get("accept", ""):
            return self.sse(aiter(stream), stream.close, {"X-Turn-Id": stream.turn_id})
        stream.close()
        result = await stream.session.result(stream.turn_id)
        return JSONResponse(result.to_dict())

    async def resume(self, request: Request) -> Response:
        body = await read_body(request, ResumeBody)
        ch = self.channel(request)
        s = self.session(request)
        by, principal = self.by(request, body.by)
        # A policy-restricted request is decided by the agent's authorize_answer, with the
        # principal, inside resume(): one check of a resume, wherever it comes from.
        stream = await ch.open_resume(body.turn_id, body.input_id, body.value,
                                      session=s.key.session, by=by, authorize=True,
                                      principal=principal)
        if "text/event-stream" in request.headers.get("accept", ""):
            return self.sse(aiter(stream), stream.close)
        stream.close()
        result = await s.result(body.turn_id)
        return JSONResponse(result.to_dict())

    async def cancel(self, request: Request) -> Response:
        body = await read_body(request, CancelBody)
        s = await self.known_session(request)
        ids = await s.cancel(body.turn_id, reason=body.reason)
        return JSONResponse({"cancelled": ids})

    async def reset(self, request: Request) -> Response:
        await read_body(request, ResetBody)
        ch = self.channel(request)
        done = await ch.reset_session(session=request.path_params["session"])
        return JSONResponse({"previous_session": done.previous_session,
                             "generation": done.generation})

    async def retry(self, request: Request) -> Response:
        body = await read_body(request, RetryBody)
        s = self.session(request)
        # Accepted once the retry has re-opened the turn; the turn then runs on, and its
        # events follow on the session's stream.
        await s.retry(body.turn_id)
        return JSONResponse({"turn_id": body.turn_id, "retried": True})

    async def events(self, request: Request) -> Response:
        s = self.session(request)
        cursor = request.headers.get("last-event-id") or request.query_params.get("after")
        after = 0
        if cursor:
            if not cursor.isdigit():
                raise HttpError(400, "MalformedCursor",
                                f"an event cursor is a sequence number, not {cursor!r}")
            after = int(cursor)
        until = request.query_params.get("until")
        if until not in (None, "turn"):
            raise HttpError(400, "MalformedQuery", "until takes one value: turn")
        if request.method == "HEAD":  # the headers only: a stream would never end
            return Response(media_type="text/event-stream", headers=HEADERS)
        sub = self.rt.subscribe(s.key, after)
        await sub.ready()
        # The fan-out path (fanout.py): the feed hands each event to this client's outbox
        # as it is published; the response writes whatever has queued meanwhile at once.
        outbox = Outbox(self.max_backlog, self.ping, self.pacer)
        frame = self.frames.frame

        def take(e: TurnEvent) -> None:
            outbox.put(frame(e), urgent=is_durable(e))
            if outbox.ended or (until == "turn" and e.ends_turn):
                outbox.end()
                sub.close()

        sub.on_close(outbox.end)
        sub.deliver_to(take)
        return self.streams.response(outbox, sub.close)


def _message(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "text": m.text, "turn_id": m.turn_id}
    if m.tool_calls:
        out["tool_calls"] = [c.to_dict() for c in m.tool_calls]
    if m.call_id is not None:
        out.update(call_id=m.call_id, result=m.result, is_error=m.is_error)
    if m.by is not None:
        out["by"] = m.by
    return out


def _turn(t: TurnRecord) -> dict[str, Any]:
    return {**t.result.to_dict(), "opening": t.opening.text if t.opening else None}


__all__ = ["PING", "create_app"]
