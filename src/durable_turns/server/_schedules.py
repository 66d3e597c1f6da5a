"""``GET/POST /agents/{agent}/schedules`` and ``DELETE /agents/{agent}/schedules/{name}``
(F24): an agent's schedules over HTTP, behind the guard every route has.

Authorization: a schedule acts on its session, so ``POST`` and ``DELETE`` are the action
``schedule`` on the schedule's session (``access.default_authorize``: its owner, an
administrator, or anyone for a session the store does not have yet, which the caller then
owns); ``GET`` lists the schedules whose session the caller may ``read``.
"""

from __future__ import annotations

from typing import Any, Literal
from zoneinfo import available_timezones

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._input_limits import HttpError
from ..access import decide
from ..runtime import Runtime
from ..schedules import MAX_EVERY, Schedule, ScheduleError, UnknownScheduleError
from ._guard import SESSION_NAME, Guard
from ._http import read_body

__all__ = ["ZONES", "ScheduleBody", "schedule_paths", "schedule_routes"]


def _one_of_when() -> list[JsonValue]:
    kinds: dict[str, JsonValue] = {"cron": {"type": "string"}, "every": {"type": "number"},
                                   "at": {"type": "string", "format": "date-time"}}
    return [{"required": [k], "properties": {o: kinds[o] if o == k else {"type": "null"}
                                             for o in kinds}} for k in kinds]


ZONES: list[JsonValue] = [*sorted(available_timezones() | {"UTC"})]
"""The time zones the body's ``tz`` may name (as its schema says)."""


class ScheduleBody(BaseModel):
    """``POST /agents/{agent}/schedules``: ``Runtime.schedule``'s arguments (exactly one of
    ``cron``, ``every``, ``at``)."""

    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"oneOf": _one_of_when()})
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
    seed: str = Field(min_length=1, max_length=100_000)
    cron: str | None = Field(default=None, max_length=200)
    every: float | None = Field(default=None, ge=1, le=MAX_EVERY)
    at: str | None = Field(default=None, max_length=64,
                           description="an ISO 8601 time (with its zone)",
                           json_schema_extra={"format": "date-time"})
    tz: str = Field(default="UTC", max_length=64, description="an IANA time zone",
                    json_schema_extra={"enum": ZONES})
    session: str | None = Field(default=None, min_length=1, max_length=200,
                                json_schema_extra={"pattern": SESSION_NAME})
    channel: str | None = Field(default=None, min_length=1, max_length=64)
    target: dict[str, Any] | None = None
    by: str | None = Field(default=None, min_length=1, max_length=200)
    overlap: Literal["skip", "queue", "replace"] = "skip"
    missed: Literal["skip", "run_once"] = "skip"


def _session(body: ScheduleBody) -> str:
    return body.session or f"schedule:{body.name}"


def schedule_routes(rt: Runtime, guard: Guard) -> list[BaseRoute]:
    """The routes, each behind ``guard``."""

    async def shown(request: Request, s: Schedule) -> dict[str, Any]:
        return {**s.to_dict(), "turns": await rt.fires.turns(s)}

    async def may(request: Request, s: Schedule, action: str) -> bool:
        if guard.authenticate is None:
            return True
        found = await rt.session(s.agent, s.session).summary()
        return await decide(guard.authorize, request.state.principal, action, found) is True

    async def listing(request: Request) -> Response:
        agent = request.path_params["agent"]
        rt.key(agent, "_")  # raises UnknownAgentError
        return JSONResponse({"schedules": [
            await shown(request, s) for s in await rt.schedules(agent)
            if await may(request, s, "read")]})

    async def create(request: Request) -> Response:
        agent = request.path_params["agent"]
        body = await read_body(request, ScheduleBody)
        try:
            s = await rt.schedule(body.name, agent=agent, **body.model_dump(exclude={"name"}))
        except ScheduleError as e:  # well-formed, but no schedule: as an answer that misfits
            raise HttpError(422, "InvalidSchedule", str(e)) from None
        return JSONResponse(await shown(request, s), status_code=201)

    async def delete(request: Request) -> Response:
        agent, name = request.path_params["agent"], request.path_params["name"]
        rt.key(agent, "_")
        found = [s for s in await rt.schedules(agent) if s.name == name]
        if not found or not await may(request, found[0], "read"):
            raise UnknownScheduleError(name)  # 404: none the caller may see
        if guard.authenticate is not None:
            await guard.decided(request.state.principal, "schedule",
                                await rt.session(agent, found[0].session).summary())
        await rt.unschedule(name)
        return Response(status_code=204)

    listed = guard(listing)
    created = guard(create, "schedule", body=ScheduleBody, claim=True, session=_session)

    async def schedules(request: Request) -> Response:  # one route: its Allow names both
        return await (created if request.method == "POST" else listed)(request)

    return [
        Route("/agents/{agent}/schedules", schedules, methods=["GET", "POST"]),
        Route("/agents/{agent}/schedules/{name}", guard(delete), methods=["DELETE"]),
    ]


_ERROR = {"description": "refused: {\"error\": {\"type\", \"message\"}}",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def schedule_paths(agents: list[str]) -> dict[str, Any]:
    """The routes' OpenAPI paths (``agents``: the served ones)."""
    agent_param = {"name": "agent", "in": "path", "required": True,
                   "schema": {"type": "string", "enum": agents}}

    def errors(*codes: int) -> dict[str, Any]:
        return {str(c): _ERROR for c in sorted({401, 403, 503, *codes})}

    item = {"allOf": [{"type": "object"}, {"type": "object", "required": ["name", "turns"],
                                           "properties": {
                                               "name": {"type": "string"},
                                               "next_fire": {"type": ["string", "null"]},
                                               "turns": {"type": "array",
                                                         "items": {"type": "string"}}}}]}
    body = {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ScheduleBody"}}}}
    name = {"name": "name", "in": "path", "required": True,
            "schema": {"type": "string", "minLength": 1}}
    return {
        "/agents/{agent}/schedules": {
            "get": {"summary": "the agent's schedules the caller may see, each with its next "
                               "fire time and the turns it started",
                    "parameters": [agent_param], "responses": {
                        "200": {"description": "OK", "content": {"application/json": {
                            "schema": {"type": "object", "required": ["schedules"],
                                       "properties": {"schedules": {
                                           "type": "array", "items": item}}}}}},
                        **errors(404)}},
            "post": {"summary": "add (or replace) a schedule: cron (with tz) | every | at",
                     "parameters": [agent_param], "requestBody": body, "responses": {
                         "201": {"description": "the schedule", "content": {
                             "application/json": {"schema": item}}},
                         **errors(400, 404, 408, 409, 413, 415, 422)}}},
        "/agents/{agent}/schedules/{name}": {
            "delete": {"summary": "remove a schedule (its turns stay)",
                       "parameters": [agent_param, name], "responses": {
                           "204": {"description": "removed"}, **errors(404)}}},
    }
