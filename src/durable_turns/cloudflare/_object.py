"""The agent's Durable Object: one object per session, serving the session's routes.

``POST …/turn`` (the turn's events as SSE), ``POST …/chat`` (``{text}``, or SSE by
``Accept``), every command of the runtime's registry with a route (``/resume``, ``/cancel``,
``/reset``, ``/retry``: their bodies, actions and answers as the HTTP host serves them),
``GET …/events`` (the session's events after ``Last-Event-ID`` or ``?after=``, then live
ones) and ``GET`` of the session itself, under ``/agents/{agent}/sessions/{session}``.

Every request passes the HTTP host's checks, in its order: its origin (a browser's request
from a page of another origin changes nothing), who calls (``authenticate``; without it,
development mode: the request's URL must name this machine, as under ``wrangler dev``), its
body, then ``authorize(principal, action, session)`` with the host's actions, a session
nobody has yet taken by the principal that starts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from .._input_limits import HttpError, cursor
from ..access import Authorize, authorized, default_authorize, principal_id
from ..agent import Agent
from ..channels import ChannelContext, TurnStream, mount_agent
from ..commands import Call, CommandSpec, Streamed
from ..errors import ConfigurationError
from ..inbound import InboundEvent
from ..messages import encode_message
from ..model import Model
from ..runtime import Runtime
from ..sessions import MODES, AgentSession
from ._alarm import BACKSTOP, AlarmScheduler
from ._http import SSE_HEADERS, Reply, Url, error_reply, frame, is_loopback, json_reply, read_body
from ._store import DurableObjectStore
from ._values import ON_PYODIDE, callback
from ._workers import to_response

if TYPE_CHECKING:
    _Base = object
else:
    # In workerd, a Durable Object class is one of its Python SDK's DurableObject (which
    # wraps the class for workerd's values); in CPython, or Pyodide elsewhere, none is.
    _Base = object
    if ON_PYODIDE:
        with contextlib.suppress(ImportError):  # Pyodide outside workerd (Node, the tests)
            from workers import DurableObject as _Base

__all__ = ["AgentObject", "ObjectSetup", "TurnBody"]

SOURCE = "http"
"""The source of the turns an object starts: its routes are the HTTP API's (an agent's
``surfaces={"http": …}`` apply)."""
PREFIX = ("agents", "sessions")


@dataclass(frozen=True, slots=True)
class ObjectSetup:
    """What an agent object serves, and how it checks its callers."""

    agents: Sequence[Agent]
    """The agents whose sessions it holds (one session per object)."""
    model: Model | None = None
    """The runtime's model (an agent's own wins)."""
    authenticate: Callable[[Any], Any] | None = None
    """``authenticate(request)`` (sync or async) → the caller's principal (its ``id`` is
    ``by``), or ``None``/an exception to refuse (401); ``None``: development mode."""
    authorize: Authorize | None = None
    """``authorize(principal, action, session)``, as the HTTP host's
    (``access.default_authorize`` by default)."""
    origins: Collection[str] = ()
    """Other origins whose pages may call the object from a browser."""
    backstop: float = BACKSTOP
    """Seconds ahead of a wake the object's alarm is set (how long an evicted turn waits)."""


class TurnBody(BaseModel):
    """``POST …/turn`` and ``POST …/chat``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: str = Field(min_length=1, pattern=r"\S")
    turn_id: str | None = Field(default=None, pattern=r"^[!-~]{1,200}$")
    replace: bool = False
    by: str | None = None
    """Development mode only: who speaks."""


class AgentObject(_Base):
    """A Durable Object class serving one agent session (subclass it and give
    :meth:`setup`); workerd makes it with ``(ctx, env)`` and calls :meth:`fetch` and
    :meth:`alarm`.

    Its store is :class:`~durable_turns.cloudflare.DurableObjectStore` on ``ctx.storage``,
    its scheduler the object's alarm: a turn is stepped here as it arrives, and one an
    eviction cut off goes on when the alarm fires on the next instance. The runtime opens
    under ``ctx.blockConcurrencyWhile``, so no request is served before it is.

    Args:
        ctx: the object's state (``storage``, ``blockConcurrencyWhile``, ``waitUntil``).
        env: the Worker's bindings, handed to :meth:`setup`.
        clock: the time in seconds since the epoch (tests inject theirs).

    Raises:
        ConfigurationError: ``setup`` gave ``authorize`` without ``authenticate``.
    """

    def __init__(self, ctx: Any, env: Any, *, clock: Callable[[], float] = time.time) -> None:
        if _Base is not object:
            super().__init__(ctx, env)  # type: ignore[call-arg]
        # The SDK wraps ctx and its storage to convert values at each call; the object works
        # on workerd's own objects beneath (what the tests under Pyodide run), converting
        # its values itself (_values).
        ctx = _raw(ctx, "_ctx")
        self.ctx = ctx
        self.env = env
        setup = self.setup(env)
        if setup.authorize is not None and setup.authenticate is None:
            raise ConfigurationError("authorize decides what an authenticated principal may "
                                     "do: give authenticate too")
        self._setup = setup
        self._authorize = setup.authorize or default_authorize
        self._origins = frozenset(o.rstrip("/").lower() for o in setup.origins)
        storage = _raw(ctx.storage, "_binding")
        self.scheduler = AlarmScheduler(storage, backstop=setup.backstop, clock=clock)
        self.runtime = Runtime(setup.agents, DurableObjectStore(storage), setup.model,
                               scheduler=self.scheduler)
        self._channels: dict[str, ChannelContext] = {
            name: mount_agent(agent, self.runtime)
            for name, agent in self.runtime.agents.items()}
        self._ready: asyncio.Future[None] = asyncio.get_event_loop().create_future()
        opening = callback(self._open)
        ctx.blockConcurrencyWhile(opening)

    def setup(self, env: Any) -> ObjectSetup:
        """The agents, model and checks this object serves (called once per instance).

        Raises:
            NotImplementedError: the subclass gave none.
        """
        raise NotImplementedError("subclass AgentObject and return an ObjectSetup from setup()")

    async def _open(self) -> None:
        try:
            await self.runtime.open()
        except BaseException as e:
            if not self._ready.done():
                self._ready.set_exception(e)
            raise
        if not self._ready.done():
            self._ready.set_result(None)

    async def fetch(self, request: Any) -> Any:
        """Serve one request of the session (see the module): a JSON answer, or an event
        stream (a JavaScript ``Response`` under Pyodide, a :class:`Reply` elsewhere)."""
        try:
            await asyncio.shield(self._ready)
            reply = await self._serve(Url(_raw(request, "js_object")))
        except Exception as e:
            reply = error_reply(e)
        return to_response(reply, self.ctx)

    async def alarm(self, info: Any = None) -> None:
        """The object's alarm: step every unfinished turn to its end or its park (a turn an
        eviction cut off replays from its first unfinished step). A raise has workerd retry
        it."""
        await asyncio.shield(self._ready)
        await self.scheduler.fire()

    # -- routing ---------------------------------------------------------------------------

    async def _serve(self, req: Url) -> Reply:
        parts = req.path.strip("/").split("/")
        if len(parts) < 4 or (parts[0], parts[2]) != PREFIX or len(parts) > 5:
            raise HttpError(404, "NotFound", f"no route {req.path}")
        agent, session, verb = parts[1], parts[3], (parts[4] if len(parts) == 5 else "")
        s = self.runtime.session(agent, session)  # raises UnknownAgentError (404)
        self._check_origin(req)
        by, principal = await self._caller(req)
        if req.method == "GET" and verb in ("", "events"):
            await self._allow(req, principal, by, s, "read", claim=verb == "events")
            return await (self._show(s) if verb == "" else self._events(req, s))
        if req.method != "POST":
            raise HttpError(405, "MethodNotAllowed", f"{req.method} is not allowed here")
        if verb in ("turn", "chat"):
            body = await read_body(req, TurnBody)
            await self._allow(req, principal, by, s, "turn", claim=True)
            return await self._turn(req, s, body, by if principal is not None else body.by,
                                    chat=verb == "chat")
        spec = next((c for c in self.runtime.commands
                     if c.route is not None and c.route.path == verb), None)
        if spec is None:
            raise HttpError(404, "NotFound", f"no route {req.path}")
        return await self._command(req, s, spec, by, principal)

    def _check_origin(self, req: Url) -> None:
        origin = req.header("origin")
        site = req.header("sec-fetch-site")
        if origin is not None:
            origin = origin.rstrip("/").lower()
            if origin == req.origin or origin in self._origins:
                return
        if req.method == "GET":
            if site in ("cross-site", "same-site") and req.header("sec-fetch-mode") != "navigate":
                raise HttpError(403, "CrossOrigin",
                                f"a page of another site ({origin or 'unnamed'}) may not read "
                                "this")
            return
        if origin is not None or site not in (None, "same-origin", "none"):
            raise HttpError(403, "CrossOrigin",
                            f"a request from {origin or site!r} (another origin than "
                            f"{req.origin!r}) may not change anything here")

    async def _caller(self, req: Url) -> tuple[str | None, Any]:
        authenticate = self._setup.authenticate
        if authenticate is None:
            if not is_loopback(req.host):
                raise HttpError(403, "DevelopmentMode",
                                "no authenticate: serving requests for this machine only "
                                f"(wrangler dev), not for {req.host!r}")
            return None, None
        try:
            found = authenticate(req.request)
            if asyncio.iscoroutine(found) or isinstance(found, asyncio.Future):
                found = await found
        except Exception:
            raise HttpError(401, "Unauthorized", "authentication refused") from None
        who = None if found is None else principal_id(found)
        if who is None:
            raise HttpError(401, "Unauthorized", "authentication refused")
        return who, found

    async def _allow(self, req: Url, principal: Any, by: str | None, s: AgentSession,
                     action: str, *, claim: bool) -> None:
        if self._setup.authenticate is None:
            return
        found = await s.summary()
        await authorized(self._authorize, principal, action, found)
        # Taken atomically: of two principals starting one session, one owns it.
        if claim and not found.exists and by is not None and \
                await self.runtime.queries.own(s.key, by) != by:
            await authorized(self._authorize, principal, action, await s.summary())

    # -- routes ----------------------------------------------------------------------------

    async def _show(self, s: AgentSession) -> Reply:
        found = await s.summary()
        if not found.exists:
            raise HttpError(404, "UnknownSession", f"no session {s.key}")
        return json_reply({**found.to_dict(),
                           "transcript": [json.loads(encode_message(m))
                                          for m in await s.transcript()]})

    async def _turn(self, req: Url, s: AgentSession, body: TurnBody, by: str | None, *,
                    chat: bool) -> Reply:
        event = None if by is None else InboundEvent(SOURCE, {"id": by, "attested": True},
                                                     body.text)
        replace = body.replace or req.query.get("replace") in ("1", "true")
        asked = req.query.get("mode", "queue")
        mode = next((m for m in MODES if m == asked), None)
        if mode is None:
            raise HttpError(400, "InvalidMode", f"mode is one of {', '.join(MODES)}")
        if mode == "steer" and replace:  # (each is valid alone: 422, as the HTTP host's)
            raise HttpError(422, "InvalidMode", "mode=steer does not go with replace")
        stream = await self._channels[s.key.agent].open_turn(
            body.text, session=s.key.session, replace=replace, event=event,
            turn_id=body.turn_id, mode=mode)
        headers = {"X-Turn-Id": stream.turn_id}
        if not chat or "text/event-stream" in (req.header("accept") or ""):
            return Reply(200, {**SSE_HEADERS, **headers}, _frames(stream))
        stream.close()
        return json_reply((await s.result(stream.turn_id)).to_dict(), headers=headers)

    async def _command(self, req: Url, s: AgentSession, spec: CommandSpec, by: str | None,
                       principal: Any) -> Reply:
        route = spec.route
        assert route is not None
        body = await read_body(req, route.body)
        await self._allow(req, principal, by, s, spec.action, claim=route.claims)
        if route.known_session and not (await s.summary()).exists:
            raise HttpError(404, "UnknownSession", f"no session {s.key}")
        if principal is None:
            by = getattr(body, "by", None)
        answer = await route.run(Call(s, body, by, principal, self._channels[s.key.agent]))
        if not isinstance(answer, Streamed):
            return json_reply(dict(answer))
        if "text/event-stream" in (req.header("accept") or ""):
            return Reply(200, dict(SSE_HEADERS), _frames(answer.stream))
        answer.stream.close()
        return json_reply((await s.result(answer.turn_id)).to_dict())

    async def _events(self, req: Url, s: AgentSession) -> Reply:
        after = 0
        if "after" in req.query:
            after = cursor(req.query["after"], "after")
        header = req.header("last-event-id")
        if header is not None:
            after = cursor(header, "Last-Event-ID")
        until = req.query.get("until")
        if until not in (None, "turn"):
            raise HttpError(400, "MalformedQuery", "until takes one value: turn")
        sub = self.runtime.subscribe(s.key, after)
        await sub.ready()

        async def frames() -> AsyncIterator[bytes]:
            try:
                async for e in sub:
                    yield frame(e)
                    if until == "turn" and e.ends_turn:
                        return
            finally:
                sub.close()

        return Reply(200, dict(SSE_HEADERS), frames())


def _raw(wrapped: Any, name: str) -> Any:
    """What a wrapper of the Workers SDK wraps (``name`` holds it there), or the object."""
    return getattr(wrapped, name, wrapped) if ON_PYODIDE else wrapped


async def _frames(stream: TurnStream) -> AsyncIterator[bytes]:
    try:
        async for e in stream:
            yield frame(e)
    finally:
        stream.close()
