"""The routes of the HTTP host (F12): sessions, turns, commands and their event streams.

Each handler is a few calls to a :class:`~durable_turns.channels.ChannelContext` or an
:class:`~durable_turns.AgentSession`; the turn itself runs in the runtime, so it goes on
when the client that started it leaves. A command's route (cancel, reset, resume, retry,
and any the runtime's registry adds) is built from its declaration
(``commands.Route``): its path, body, authorization action and what it does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._input_limits import BODY_TIMEOUT, HttpError, cursor
from ..access import Authorize, default_authorize
from ..agent import check_surfaces
from ..channels import Channel, ChannelContext, TurnStream, mount_agent
from ..commands import Call, CommandSpec, Registry, Streamed
from ..engine._output import OUTPUT_RETRIES, output_data
from ..errors import ConfigurationError
from ..events import TurnEvent
from ..inbound import InboundEvent
from ..model import Model
from ..models.resolve import resolve_model
from ..records import ChainEntry
from ..runtime import Runtime
from ..sessions import MODES, AgentSession
from ._console import console_routes
from ._fanout import BACK, HEADERS, MAX_BACKLOG, OUTAGE, EventStream, FrameCache, Outbox, Streams
from ._guard import Guard
from ._http import (
    RETRY_AFTER,
    Authenticate,
    error_response,
    is_durable,
    read_body,
)
from ._idempotency import HEADER, idempotent, open_keyed
from ._lifespan import GRACE, host_lifespan
from ._mounts import ProtocolSeam
from ._openapi import openapi
from ._schedules import ScheduleBody, schedule_paths, schedule_routes
from ._timeline import last_activity
from ._timetravel import BODIES as TIME_TRAVEL_BODIES
from ._timetravel import timetravel_routes
from .headers import SecurityHeaders

PING = 15.0
"""Seconds between keep-alive comments on an idle event stream."""
SOURCE = "http"
"""The event source of the turns the API starts (it selects ``surfaces={"http": …}``)."""


NOT_BLANK = (r"[^\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f"
             r"\u3000\ufeff]")
"""A character that is not white space by any regex engine's reckoning (Python's, ECMAScript's,
Rust's differ): a turn's text has one (as the schema says, and as ``AgentSession.start``
needs)."""


class TurnBody(BaseModel):
    """``POST /turn`` and ``POST /chat``."""

    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types, not coerced
    text: str = Field(min_length=1, pattern=NOT_BLANK)
    """What the person says: not only white space."""
    turn_id: str | None = Field(default=None, pattern=r"^[!-~]{1,200}$")
    """A new turn's id travels back in the ``X-Turn-Id`` header: 1 to 200 printable ASCII
    characters, no spaces (the server makes one when it is left out)."""
    replace: bool = False
    by: str | None = None
    """Development mode only: who speaks (with ``authenticate``, the principal's id)."""
    output_schema: dict[str, Any] | None = None
    """A JSON schema the turn's final answer must match (structured output, F25): the turn's
    result carries the validated value as ``output``."""


def bodies(commands: Registry) -> dict[str, type[BaseModel]]:
    """Each POST route's body model, by its last path segment: the turn's, the commands'
    (from the registry), time travel's."""
    return {"turn": TurnBody, "chat": TurnBody,
            **{c.route.path: c.route.body for c in commands if c.route is not None},
            **TIME_TRAVEL_BODIES}


def create_app(runtime: Runtime, authenticate: Authenticate | None = None,
               channels: Sequence[Channel] = (), *, authorize: Authorize | None = None,
               origins: Collection[str] = (), api: bool = True,
               body_timeout: float = BODY_TIMEOUT, routes: Sequence[BaseRoute] = (),
               ping: float = PING, max_backlog: int = MAX_BACKLOG,
               grace: float = GRACE,
               replay_models: Mapping[str, Model | str] | None = None) -> Starlette:
    """The HTTP/SSE host of ``runtime``'s agents (F12), as a Starlette (ASGI) app.

    Its lifespan (run by uvicorn and any ASGI server that runs lifespans) opens the
    runtime, recovers its unfinished turns (when it drives), starts each channel and runs
    its ``recover()``; at shutdown it ends the open event streams, gives running turns
    ``grace`` seconds, stops the channels and closes the runtime. Without a lifespan (the
    app driven directly, ``httpx.ASGITransport``) it serves a runtime its caller opened
    (``async with runtime:``); requests to one nobody opened answer ``RuntimeNotOpenError``.

    Args:
        runtime: the runtime whose agents it serves.
        authenticate: ``authenticate(request)`` (sync or async) → the caller's principal,
            whose ``id`` (key or attribute) is the speaker and the resumer; ``None`` or an
            exception refuses (401). Without it the host is in development mode: ``by``
            comes from the body, and requests that did not arrive on loopback, or that name
            another host than this machine in their ``Host`` header, are refused.
        channels: the platforms it serves beside the API (:class:`~durable_turns.channels.
            Channel`; their ``mount(runtime)`` gives their routes). A channel checks its own
            requests (Slack: signatures), not ``authenticate``. A channel's ``name`` is the
            source of its turns (an agent's policy for a source neither it nor the API,
            ``"http"``, emits is logged as a warning) and its name space: the API makes no
            session named ``<name>:…`` (nor ``subagent:…``, a subagent's child), so nobody can
            make a session the channel will use first.
        authorize: ``authorize(principal, action, session)`` (sync or async) decides every
            route's action on a session (``read``, ``turn``, ``cancel``, ``reset``,
            ``resume``, ``fork``: ``history`` reads, ``fork`` and ``replay`` fork) and
            what ``list`` and ``inbox`` show (see :mod:`durable_turns.access`); by default
            (``access.default_authorize``) a principal sees and acts on its own sessions,
            answerers see and answer the requests they may answer, and a principal with
            ``admin`` set to ``True`` sees all. Needs ``authenticate``.
        origins: origins (``https://console.example``) besides the app's own whose pages may
            call the API from a browser (a proxy in front that changes the ``Host``, a console
            served elsewhere); every other page's requests that would change something are
            refused (CSRF).
        api: serve the API and the console; ``False`` serves the channels' routes (and
            ``routes``) only, such as ``/slack/*`` behind a tunnel.
        body_timeout: seconds a request's body may take to arrive (408 past it); the
            headers' own deadline is the server's (``serve`` runs uvicorn with
            ``deadlines.HttpProtocol``).
        routes: more Starlette routes to serve beside the API.
        ping: seconds between keep-alive comments on an idle event stream.
        max_backlog: bytes of events a ``GET …/events`` client may leave unread before it
            is cut off (it reconnects with ``Last-Event-ID`` and loses nothing durable).
        grace: seconds the lifespan's shutdown waits for running turns.
        replay_models: the models ``POST …/replay`` may ask by name (``{"haiku": "anthropic:
            claude-haiku-4-5"}``: a :class:`~durable_turns.Model` or a provider string); a
            replay runs on the host's credentials, so the operator chooses. Without it, a
            replay asks the agent's own model.

    Returns:
        The app. ``app.state.end_streams()`` ends every open ``GET …/events`` stream (the
        lifespan's shutdown and ``serve``'s SIGTERM call it); ``app.state.channel_routes``
        maps each channel's name to its routes (``"POST /slack/events"``, …); with the API,
        ``app.state.protocols`` is what ``mount_ai_sdk`` and ``mount_ag_ui`` mount through.

    Raises:
        ConfigurationError: a channel that is no :class:`~durable_turns.channels.Channel`,
            two with one name, or one that cannot serve this runtime; ``authorize`` without
            ``authenticate``.
    """
    if authorize is not None and authenticate is None:
        raise ConfigurationError("authorize decides what an authenticated principal may do: "
                                 "pass authenticate=… too")
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
    models = {name: resolve_model(m) for name, m in (replay_models or {}).items()}
    host = _Host(runtime, authenticate, ping, max_backlog, models,
                 Guard(runtime, authenticate, authorize or default_authorize, origins,
                       body_timeout=body_timeout, reserved=sources - {SOURCE}))
    lifespan = host_lifespan(runtime, list(channels), host.streams.end_all, grace=grace)
    app = host.app([*mounted, *routes], lifespan, api=api)
    app.state.channel_routes = served
    return app


def _paths(routes: Sequence[BaseRoute]) -> list[str]:
    """``METHOD PATH`` of each route (what a banner shows of a channel's routes)."""
    return [f"{'/'.join(sorted((getattr(r, 'methods', None) or set()) - {'HEAD'}))} "
            f"{getattr(r, 'path', '?')}".strip() for r in routes]


class _Host:
    def __init__(self, runtime: Runtime, authenticate: Authenticate | None,
                 ping: float, max_backlog: int, replay_models: dict[str, Model],
                 guard: Guard) -> None:
        self.rt = runtime
        self.replay_models = replay_models
        self.authenticate = authenticate
        self.guard = guard
        # Every subscriber of a session is handed the same event object: its frame is
        # encoded once (bench/sse.py: encoding per subscriber was a fifth of the fan-out).
        self.frames = FrameCache()
        # Every event stream of the host, the API's and the protocols' (fanout.py).
        self.streams = Streams(ping, max_backlog)
        self.mounted: dict[str, ChannelContext] = {
            name: mount_agent(agent, runtime) for name, agent in runtime.agents.items()}
        # What mount_ai_sdk and mount_ag_ui add their routes through (server/_mounts.py).
        self.protocols = ProtocolSeam(runtime, guard, self.mounted, self.streams)

    def app(self, extra: Sequence[BaseRoute], lifespan: Any, *, api: bool) -> Starlette:
        base = "/agents/{agent}/sessions/{session}"
        g = self.guard
        routes: list[BaseRoute] = [] if not api else [
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/agents/{agent}/sessions", g(self.list_sessions, "list"), methods=["GET"]),
            Route("/agents/{agent}/pending", g(self.inbox, "inbox"), methods=["GET"]),
            Route(base, g(self.show, "read"), methods=["GET"]),
            Route(f"{base}/turn", g(self.turn, "turn", body=TurnBody), methods=["POST"]),
            Route(f"{base}/chat", g(self.chat, "turn", body=TurnBody), methods=["POST"]),
            *(Route(f"{base}/{c.route.path}", g(self.command(c), c.action, body=c.route.body,
                                                 claim=c.route.claims), methods=["POST"])
              for c in self.rt.commands if c.route is not None),
            Route(f"{base}/events", g(self.events, "read"), methods=["GET"]),
            *schedule_routes(self.rt, g),
            *timetravel_routes(self.rt, g, self.replay_models, self.by),
            *console_routes(self.rt, g, self.authenticate is None, list(self.replay_models)),
        ]
        routes += extra
        app = Starlette(routes=routes, lifespan=lifespan,
                        middleware=[Middleware(SecurityHeaders)],
                        exception_handlers={404: self.not_found, 405: self.not_allowed})
        # A path with a slash too many is not found, rather than redirected to a Location
        # built from the request's own Host header.
        app.router.redirect_slashes = False
        app.state.end_streams = self.streams.end_all
        if api:
            app.state.protocols = self.protocols
        return app

    # -- plumbing --------------------------------------------------------------------------

    async def not_found(self, request: Request, exc: Exception) -> Response:
        return error_response(HttpError(404, "NotFound", f"no route {request.url.path}"))

    async def not_allowed(self, request: Request, exc: Exception) -> Response:
        response = error_response(HttpError(405, "MethodNotAllowed",
                                            f"{request.method} is not allowed here"))
        response.headers.update(getattr(exc, "headers", None) or {})  # Allow: the methods
        return response

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

    def sse(self, stream: TurnStream, headers: dict[str, str] | None = None) -> EventStream:
        async def frames() -> AsyncIterator[bytes]:
            async for e in stream:
                yield self.frames.frame(e)

        return self.streams.of(frames(), stream.close, headers)

    # -- routes ----------------------------------------------------------------------------

    async def openapi(self, request: Request) -> Response:
        doc = openapi(bodies(self.rt.commands), sorted(self.rt.agents),
                      sorted(self.replay_models), self.rt.commands)
        doc["paths"].update(self.protocols.paths)  # the mounted protocols' routes
        doc["paths"].update(schedule_paths(sorted(self.rt.agents)))
        doc["components"]["schemas"]["ScheduleBody"] = ScheduleBody.model_json_schema()
        doc["components"]["schemas"].update(self.protocols.schemas)
        return JSONResponse(doc)

    async def list_sessions(self, request: Request) -> Response:
        agent = request.path_params["agent"]
        self.rt.key(agent, "_")
        out = []
        visible = getattr(request.state, "visible", None)  # set by the guard's authorize
        for found in await self.rt.queries.sessions(agent, visible=visible):
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
            for found in await self.rt.queries.inbox(
                agent, visible=getattr(request.state, "visible", None))
            if found.pending is not None]})

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
        mode = request.query_params.get("mode", "queue")
        if mode not in MODES:
            raise HttpError(400, "InvalidMode", f"mode is one of {', '.join(MODES)}")
        if mode == "steer" and body.replace:  # (each is valid alone: 422, as the fuzzer wants)
            raise HttpError(422, "InvalidMode", "mode=steer does not go with replace: true")
        data = None
        if body.output_schema is not None:
            try:
                data = output_data(body.output_schema, OUTPUT_RETRIES)
            except ValueError as e:
                # (422: the body has the document's shape, its schema is not one)
                raise HttpError(422, "InvalidOutputSchema", str(e)) from None
        # (a steer's key is not a queued turn's; a queued one's print is as it always was)
        printed = body.model_dump() | ({} if mode == "queue" else {"mode": mode})
        if body.output_schema is None:
            del printed["output_schema"]  # (a turn without one prints as it always did)
        idem = idempotent(request.headers.get(HEADER), printed, by)
        return await open_keyed(ch, body.text, idem, session=request.path_params["session"],
                                event=event, replace=body.replace, turn_id=body.turn_id,
                                mode=mode, data=data)

    async def turn(self, request: Request) -> Response:
        stream = await self._start(request)
        return self.sse(stream, {"X-Turn-Id": stream.turn_id})

    async def chat(self, request: Request) -> Response:
        stream = await self._start(request)
        if "text/event-stream" in request.headers.get("accept", ""):
            return self.sse(stream, {"X-Turn-Id": stream.turn_id})
        stream.close()
        result = await stream.session.result(stream.turn_id)
        return JSONResponse(result.to_dict())

    def command(self, spec: CommandSpec) -> Any:
        """The handler of a command's route: its body, the session, who asks, then the
        command's own ``run``; a turn it sets going answers with the turn's events (``Accept:
        text/event-stream``) or its result."""
        route = spec.route
        assert route is not None

        async def handle(request: Request) -> Response:
            body = await read_body(request, route.body)
            ch = self.channel(request)
            s = await self.known_session(request) if route.known_session \
                else self.session(request)
            by, principal = self.by(request, getattr(body, "by", None))
            answer = await route.run(Call(s, body, by, principal, ch))
            if not isinstance(answer, Streamed):
                return JSONResponse(dict(answer))
            stream = answer.stream
            if "text/event-stream" in request.headers.get("accept", ""):
                return self.sse(stream)
            stream.close()
            return JSONResponse((await s.result(answer.turn_id)).to_dict())

        return handle

    async def events(self, request: Request) -> Response:
        s = self.session(request)
        # Both are checked; the header (what EventSource sends on a reconnect) wins.
        after = 0
        if "after" in request.query_params:
            after = cursor(request.query_params["after"], "after")
        header = request.headers.get("last-event-id")
        if header is not None:
            after = cursor(header, "Last-Event-ID")
        until = request.query_params.get("until")
        if until not in (None, "turn"):
            raise HttpError(400, "MalformedQuery", "until takes one value: turn")
        if request.method == "HEAD":  # the headers only: a stream would never end
            return Response(media_type="text/event-stream", headers=HEADERS)
        sub = self.rt.subscribe(s.key, after)
        await sub.ready()
        if self.authenticate is not None:
            try:
                await self.guard.check_follow(request, await s.summary())
            except BaseException:
                sub.close()
                raise
        # The fan-out path (fanout.py): the feed hands each event to this client's outbox
        # as it is published; the response writes whatever has queued meanwhile at once.
        outbox = self.streams.outbox()
        frame = self.frames.frame

        def take(e: TurnEvent) -> None:
            outbox.put(frame(e), urgent=is_durable(e))
            if outbox.ended or (until == "turn" and e.ends_turn):
                outbox.end()
                sub.close()

        sub.on_close(outbox.end)
        sub.on_outage(self.outage_notice(outbox))
        sub.deliver_to(take)
        return self.streams.response(outbox, sub.close)

    @staticmethod
    def outage_notice(outbox: Outbox) -> Any:
        """What tells an open stream's client that the store is away (a retry hint) and back
        (its events then follow from its cursor, with no gap)."""
        hint = OUTAGE % (RETRY_AFTER * 1000)

        def notice(error: BaseException | None) -> None:
            outbox.put(hint if error is not None else BACK)

        return notice


def _message(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "text": m.text, "turn_id": m.turn_id}
    if m.tool_calls:
        out["tool_calls"] = [c.to_dict() for c in m.tool_calls]
    if m.call_id is not None:
        out.update(call_id=m.call_id, result=m.result, is_error=m.is_error)
    if m.by is not None:
        out["by"] = m.by
    return out


def _turn(t: ChainEntry) -> dict[str, Any]:
    return {**t.result.to_dict(), "opening": t.opening.text if t.opening else None}


__all__ = ["PING", "create_app"]
