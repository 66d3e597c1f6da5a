"""What a frontend protocol mounted on the HTTP host builds on (``mount_ai_sdk``,
``mount_ag_ui``): the app's guard, its agents' channel contexts, the speaker of a request,
SSE framing, and a place in ``/openapi.json``.

``create_app`` leaves a :class:`ProtocolSeam` on ``app.state.protocols``; a mount adds its
routes ahead of the app's own (so no catch-all shadows them) and its paths to the OpenAPI
document, and every route it adds goes through the same :class:`~.guard.Guard` as the API's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from sse_starlette import ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import BaseRoute

from .._input_limits import HttpError
from ..channels import ChannelContext, TurnStream
from ..commands import Resume
from ..errors import ConfigurationError, error_kind
from ..inbound import InboundEvent
from ..runtime import Runtime
from ._fanout import EventStream, Streams
from ._guard import Guard
from ._turnparts import request_id

SEP = "\n"
"""The line separator of a protocol's streams: AG-UI's client splits events on a blank line
of ``"\n\n"`` only."""


@dataclass(slots=True)
class ProtocolSeam:
    """The host's parts a protocol's routes use (``app.state.protocols``)."""

    runtime: Runtime
    guard: Guard
    """Every route a protocol adds is wrapped in it: ``guard(handler, action, body=…)``."""
    contexts: Mapping[str, ChannelContext]
    """Each agent mounted (``mount_agent``), by name."""
    streams: Streams
    """The host's event streams: every stream a protocol sends is one of them."""
    paths: dict[str, Any] = field(default_factory=dict)
    """OpenAPI paths the mounts added (``/openapi.json`` shows them beside the API's)."""
    schemas: dict[str, Any] = field(default_factory=dict)
    """OpenAPI component schemas the mounts added."""
    mounted: set[str] = field(default_factory=set)
    """The protocols mounted (each once)."""

    def add(self, app: Starlette, name: str, routes: list[BaseRoute],
            paths: Mapping[str, Any], schemas: Mapping[str, Any] | None = None) -> None:
        """Serve ``routes`` on ``app`` (ahead of its own) and show ``paths`` at
        ``/openapi.json``.

        Raises:
            ConfigurationError: ``name`` is mounted already.
        """
        if name in self.mounted:
            raise ConfigurationError(f"{name} is mounted on this app already")
        self.mounted.add(name)
        app.router.routes[0:0] = routes
        self.paths.update(paths)
        self.schemas.update(schemas or {})

    def channel(self, request: Request) -> ChannelContext:
        """The agent the request's path names.

        Raises:
            UnknownAgentError: not one of the runtime's (404).
        """
        agent = request.path_params["agent"]
        self.runtime.key(agent, "_")  # raises UnknownAgentError
        return self.contexts[agent]

    def speaker(self, request: Request, body_by: str | None) -> tuple[str | None, Any]:
        """Who speaks or answers: ``(by, principal)``: the authenticated principal's id, or in
        development mode (no ``authenticate``) what the body says (that mode serves loopback
        only), with no principal."""
        if self.guard.authenticate is None:
            return body_by, None
        return request.state.by, request.state.principal

    @staticmethod
    def inbound(by: str | None, text: str, source: str) -> InboundEvent | None:
        """The attested inbound event of a turn ``by`` starts (``None`` for nobody)."""
        return None if by is None else InboundEvent(source, {"id": by, "attested": True}, text)

    def sse(self, frames: AsyncIterator[str], stream: TurnStream | None = None,
            headers: Mapping[str, str] | None = None) -> EventStream:
        """An event stream of ``frames`` (each one event's ``data``); closing it stops reading
        ``stream``, never its turn."""

        async def body() -> AsyncIterator[bytes]:
            async for data in frames:
                yield ServerSentEvent(data=data, sep=SEP).encode()

        return self.streams.of(body(), None if stream is None else stream.close,
                               dict(headers or {}), sep=SEP)


def protocol_seam(app: Starlette) -> ProtocolSeam:
    """The seam ``create_app`` left on ``app``.

    Raises:
        ConfigurationError: ``app`` is no ``create_app`` app serving the API.
    """
    seam = getattr(app.state, "protocols", None)
    if not isinstance(seam, ProtocolSeam):
        raise ConfigurationError("mount a protocol on an app of create_app(runtime, …) that "
                                 "serves the API (api=True)")
    return seam


def refusal(exc: Exception) -> tuple[str, str] | None:
    """``(type, message)`` of a refusal a protocol shows in its own error shape (a 4xx of
    ``errors.ERRORS``: a wrong answerer, an answer of another request, a busy session); ``None``
    for anything else, which the guard answers as it answers every route (a 503 when the
    store is away, with ``Retry-After``)."""
    if isinstance(exc, HttpError):
        return (exc.type, exc.message) if exc.status < 500 else None
    kind = error_kind(exc)
    if kind is None or kind.status >= 500:
        return None
    return type(exc).__name__, str(exc)


def component_schemas(model: type[BaseModel], name: str,
                      **properties: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI component schemas of a body model: its own as ``name`` (each of
    ``properties`` merged into the property of that name: what the route checks beyond the
    model), and those it refers to, each under its own name."""
    schema = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    out: dict[str, Any] = schema.pop("$defs", {})
    for field_name, more in properties.items():
        schema["properties"][field_name] = {**schema["properties"][field_name], **more}
    out[name] = schema
    return out


async def answer_all(ch: ChannelContext, session: str, answers: list[tuple[str, Any]], *,
                     by: str | None, principal: Any) -> TurnStream:
    """Answer the requests a protocol names by :func:`~.turnparts.request_id`, under the rules
    of ``POST …/resume`` (``authorize_answer`` included), and stream what follows the last.

    An id the session waits for is answered; one whose answer is stored already is that
    answer again (the same one by the same person is a redelivery, another is refused).

    Raises:
        HttpError: 409 an id neither waited for nor answered.
        ResumeAuthorizationError: ``by`` may not answer.
        ResumeConflictError: another answer was given already.
        InvalidInputError: an answer that does not fit its request's schema.
    """
    s = ch.session(session)
    pending = await s.pending()
    waiting = {request_id(r): (r.turn_id, r.id) for r in (pending.all if pending else ())}
    named: list[tuple[str, str, Any]] = []
    for rid, value in answers:
        found = waiting.get(rid)
        if found is None:
            given = await s.entry(rid)
            if given is None or given.kind != "resume":
                raise HttpError(409, "NoSuchRequest",
                                f"nothing waits for {rid!r} in session {session!r}")
            earlier = Resume.from_entry(given)
            found = (earlier.turn_id, earlier.input_id)
        named.append((*found, value))
    for turn_id, input_id, value in named[:-1]:
        await s.resume(turn_id, input_id, value, by=by, authorize=True, principal=principal)
    turn_id, input_id, value = named[-1]
    return await ch.open_resume(turn_id, input_id, value, session=session, by=by,
                                authorize=True, principal=principal)


def jsonable(value: Any) -> Any:
    """``value`` as JSON values (a tool's result may hold what ``json`` cannot write)."""
    return json.loads(json.dumps(value, default=str))


__all__ = ["ProtocolSeam", "answer_all", "component_schemas", "jsonable", "protocol_seam",
           "refusal"]

