"""A session's past over HTTP: its history, a fork at any checkpoint, a replay against another
model (issue 30). Each route goes through the host's guard: ``history`` is a ``read`` of the
session, ``fork`` and ``replay`` a ``fork`` of it (by default, what its owner may do); the new
session belongs to the caller."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._input_limits import MAX_CURSOR, HttpError
from ..history import Checkpoint
from ..inbound import InboundEvent
from ..model import Model
from ..replay import fork_recorded, replay, replay_id
from ..runtime import Runtime
from ..sessions import AgentSession
from ._guard import Guard
from ._http import read_body

Handler = Callable[[Request], Awaitable[Response]]
Speaker = Callable[[Request, "str | None"], "tuple[str | None, Any]"]
"""Who speaks: ``(by, principal)`` of a request (the principal's id, or in development mode
the body's ``by``), as the app's other routes read it."""
SESSION_ID = r"^[!-~]{1,200}$"
"""A new session's id: 1 to 200 printable ASCII characters, no spaces."""



def _whole(value: Any) -> Any:
    """A JSON number with no fraction is an integer (``3.0`` as JSON Schema reads it)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Count = Annotated[int, Field(ge=0, le=MAX_CURSOR), BeforeValidator(_whole)]
"""A place's number: what a store's integer holds."""


class CheckpointPlace(BaseModel):
    """A checkpoint, by where it stands (``history``'s ``generation``, ``seq``, ``sub``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    generation: Count
    seq: Count
    sub: Count


class ForkBody(BaseModel):
    """``POST …/fork``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    to: str = Field(pattern=SESSION_ID)
    """The fork's session id."""
    at: CheckpointPlace | None = None
    """The checkpoint (default: the last committed one)."""
    then: str | None = Field(default=None, min_length=1)
    """A turn to start in the fork at once (at a checkpoint where no turn is under way)."""
    turn_id: str | None = Field(default=None, pattern=SESSION_ID)
    by: str | None = Field(default=None, min_length=1, max_length=200)
    """Development mode only: who speaks ``then`` (with ``authenticate``, the principal)."""
    tools: Literal["live", "recorded"] | None = None
    """How a turn under way at ``at`` runs its owed local tool calls: ``recorded`` answered
    from the source's recording, ``live`` for real; without it such a fork is a 409."""


class ReplayBody(BaseModel):
    """``POST …/replay``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    """One of the models the host offers for replays (``create_app(replay_models=…)``), by
    name; default: the agent's own."""
    tools: Literal["recorded", "live"] = "recorded"
    to: str | None = Field(default=None, pattern=SESSION_ID)


BODIES: dict[str, type[BaseModel]] = {"fork": ForkBody, "replay": ReplayBody}
"""The routes' bodies, for the OpenAPI document."""


def timetravel_routes(runtime: Runtime, guard: Guard,
                      models: Mapping[str, Model], speaker: Speaker) -> list[BaseRoute]:
    """``GET …/history``, ``POST …/fork`` and ``POST …/replay`` of a session; a replay may
    ask one of ``models`` by name (which the operator chose: they spend its credentials);
    ``speaker`` says who speaks a fork's ``then``."""

    def source(request: Request) -> AgentSession:
        return runtime.session(request.path_params["agent"], request.path_params["session"])

    async def known(request: Request) -> AgentSession:
        s = source(request)
        if not (await s.summary()).exists:
            raise HttpError(404, "UnknownSession", f"no session {s.key}")
        return s

    async def history(request: Request) -> Response:
        s = await known(request)
        return JSONResponse({"checkpoints": [cp.to_dict() for cp in await s.history()]})

    async def fork(request: Request) -> Response:
        body = await read_body(request, ForkBody)
        s = await known(request)
        guard.check_new(body.to)
        at = await _checkpoint(s, body.at)
        by, _principal = speaker(request, body.by)
        event = None if by is None or body.then is None else \
            InboundEvent("http", {"id": by, "attested": True}, body.then)
        try:  # the caller owns the fork, written with it (a refused fork writes nothing)
            if body.tools == "recorded" and body.then is None:
                forked = await fork_recorded(s, body.to, at, owner=caller(request))
            else:  # a local call owed and no ``tools``: ForkRerunsToolsError, a 409
                forked = await s.fork(body.to, at, then=body.then, turn_id=body.turn_id,
                                      event=event, owner=caller(request),
                                      tools="live" if body.tools else None)
        except ValueError as e:  # ``then`` where a turn is under way: the fork's state says no
            raise HttpError(409, "TurnUnderWay", str(e)) from None
        return JSONResponse({**(await forked.summary()).to_dict(),
                             "history": len(await forked.history())}, status_code=201)

    async def replayed(request: Request) -> Response:
        body = await read_body(request, ReplayBody)
        s = await known(request)
        model = None
        if body.model is not None:
            model = models.get(body.model)
            if model is None:
                raise HttpError(400, "UnknownModel",
                                f"no replay model {body.model!r}; this host offers "
                                f"{sorted(models) or 'none (create_app(replay_models=…))'}")
        # A replay of another surface's session is the API's (``slack~T1:C9:17~replay-…``).
        to = body.to or replay_id(s.key.session.replace(":", "~", 1) if guard.space(
            s.key.session) else s.key.session)
        guard.check_new(to)
        report = await replay(s, model=model, tools=body.tools, to=to, owner=caller(request))
        return JSONResponse(report.to_dict(), status_code=201)

    base = "/agents/{agent}/sessions/{session}"
    return [
        Route(f"{base}/history", guard(history, "read"), methods=["GET"]),
        Route(f"{base}/fork", guard(fork, "fork", body=ForkBody), methods=["POST"]),
        Route(f"{base}/replay", guard(replayed, "fork", body=ReplayBody), methods=["POST"]),
    ]


def caller(request: Request) -> str | None:
    """Who asks (the guard's principal id; ``None`` in development mode): a fork's owner."""
    return getattr(request.state, "by", None)


async def _checkpoint(s: AgentSession, place: CheckpointPlace | None) -> Checkpoint | None:
    if place is None:
        return None
    found = next((cp for cp in await s.history(generation=place.generation)
                  if (cp.seq, cp.sub) == (place.seq, place.sub)), None)
    if found is None:
        raise HttpError(404, "UnknownCheckpoint",
                        f"session {s.key} has no checkpoint {place.seq}.{place.sub} of "
                        f"generation {place.generation}")
    return found


__all__ = [
    "BODIES",
    "SESSION_ID",
    "CheckpointPlace",
    "Count",
    "ForkBody",
    "Handler",
    "ReplayBody",
    "caller",
    "timetravel_routes",
]
