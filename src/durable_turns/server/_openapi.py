"""``/openapi.json``: the HTTP host's routes, bodies and answers as an OpenAPI 3.2 document.

It says what the server does, so that a client generated from it (or schemathesis, which
``tests/server/test_server_fuzz.py`` runs with every check) meets no surprise: the statuses each
route answers, the bodies it takes (required where the route needs one), its cursors as the
integers the server takes, each event of an event stream (``itemSchema``, OpenAPI 3.2's way
to describe a stream item by item).
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel

from .._input_limits import MAX_CURSOR
from ..commands import Registry
from ..events import EventType
from ..sessions import MODES
from ._guard import SESSION_NAME

_ERROR = {"description": "refused: {\"error\": {\"type\", \"message\"}}",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_EVENT = {
    "type": "object", "required": ["event", "data"],
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$",
               "description": "the event's durable seq (live-only events have none)"},
        "event": {"type": "string", "enum": sorted(get_args(EventType))},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"$ref": "#/components/schemas/Event"}},
        "retry": {"type": "integer"},
    },
}
_SSE_CONTENT = {"text/event-stream": {"itemSchema": _EVENT}}
_TURN_ID = {"X-Turn-Id": {"description": "the turn's id", "required": True,
                          "schema": {"type": "string", "pattern": "^[!-~]{1,200}$"}}}
_CURSOR = {"type": "integer", "minimum": 0, "maximum": MAX_CURSOR}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["type", "message"],
                                 "properties": {"type": {"type": "string"},
                                                "message": {"type": "string"}}}}},
    "Event": {
        "type": "object", "required": ["type", "agent", "session", "turn_id", "seq"],
        "properties": {"type": {"type": "string"}, "agent": {"type": "string"},
                       "session": {"type": "string"}, "turn_id": {"type": "string"},
                       "seq": {"type": "integer"}}},
    "Result": {
        "type": "object", "required": ["turn_id", "status", "text", "request", "error", "reason"],
        "properties": {"turn_id": {"type": "string"},
                       "status": {"enum": ["completed", "failed", "cancelled", "suspended",
                                           "queued", "running"]},
                       "text": {"type": ["string", "null"]},
                       "request": {"type": ["object", "null"]},
                       "error": {"type": ["string", "null"]},
                       "reason": {"type": ["string", "null"]},
                       "output": {"description": "the validated final answer of a turn "
                                  "posted with an output_schema (F25); absent otherwise"}}},
    "Summary": {
        "type": "object",
        "required": ["agent", "session", "status", "generation", "pending", "owner"],
        "properties": {"agent": {"type": "string"}, "session": {"type": "string"},
                       "status": {"enum": ["new", "idle", "running", "suspended"]},
                       "generation": {"type": "integer"},
                       "pending": {"type": ["object", "null"]},
                       "owner": {"type": ["string", "null"]}}},
    "Checkpoint": {
        "type": "object",
        "required": ["generation", "seq", "sub", "kind", "turn_id", "messages", "at", "steps",
                     "events"],
        "properties": {"generation": {"type": "integer"}, "seq": {"type": "integer"},
                       "sub": {"type": "integer"}, "kind": {"type": "string"},
                       "turn_id": {"type": ["string", "null"]},
                       "messages": {"type": "integer"}, "at": {"type": ["number", "null"]},
                       "steps": {"type": "array", "items": {"type": "object"}},
                       "events": {"type": "array", "items": {"type": "object"}}}},
}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": sorted(properties), "properties": properties}


def openapi(bodies: dict[str, type[BaseModel]], agents: list[str],
            replay_models: list[str], commands: Registry) -> dict[str, Any]:
    """The document, with each request body's JSON schema taken from its pydantic model, the
    ``agent`` path parameter listing the served agents, a replay's ``model`` the models the
    host offers, and a path for each command of ``commands`` that declares a route."""
    params = [
        {"name": "agent", "in": "path", "required": True,
         "schema": {"type": "string", "enum": agents}},
        {"name": "session", "in": "path", "required": True,
         "schema": {"type": "string", "minLength": 1, "pattern": SESSION_NAME}}]
    schemas: dict[str, Any] = dict(_SCHEMAS)
    for model in bodies.values():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))  # the models it nests, beside it
        schemas[model.__name__] = schema
    offered: list[dict[str, Any]] = [{"type": "null"}]
    if replay_models:
        offered.insert(0, {"enum": replay_models})
    schemas["ReplayBody"]["properties"]["model"] = {"anyOf": offered, "default": None}

    def errors(*codes: int) -> dict[str, Any]:
        # 503 (with Retry-After) on every route: the store may be away; 400 a path or a
        # session name that is not what the parameters say (guard.check_name).
        return {str(c): _ERROR for c in sorted({400, 401, 403, 503, *codes})}

    def post(name: str, summary: str, ok: dict[str, Any], *codes: int,
             required: bool = True, status: int = 200) -> dict[str, Any]:
        return {"post": {
            "summary": summary, "parameters": params,
            "requestBody": {"required": required, "content": {"application/json": {
                "schema": _ref(bodies[name].__name__)}}},
            "responses": {str(status): ok, **errors(400, 404, 408, 413, 415, *codes)}}}

    result = {"description": "the turn's result (JSON), or its events with "
                             "Accept: text/event-stream",
              "headers": {}, "content": {"application/json": {"schema": _ref("Result")},
                                         **_SSE_CONTENT}}
    turn = {"description": "the turn's events, to its end or its park", "headers": _TURN_ID,
            "content": _SSE_CONTENT}
    chat = {**result, "headers": {"X-Turn-Id": {**_TURN_ID["X-Turn-Id"], "required": False,
                                                "description": "the turn's id (its events)"}}}
    base = "/agents/{agent}/sessions/{session}"
    agent_only = params[:1]
    return {
        "openapi": "3.2.0",
        "info": {"title": "durable_turns HTTP host", "version": "1"},
        "paths": {
            "/": {"get": {"summary": "the web console (HTML)", "responses": {
                "200": {"description": "the console's page",
                        "content": {"text/html": {"schema": {"type": "string"}}}},
                **{str(c): _ERROR for c in (401, 403)}}}},
            "/agents": {"get": {
                "summary": "the agents served (name, tools), the mode, and who is asking",
                "responses": {"200": _json(_object(
                    agents={"type": "array", "items": _object(
                        agent={"type": "string"},
                        tools={"type": "array", "items": {"type": "string"}})},
                    development={"type": "boolean"}, by={"type": ["string", "null"]})),
                    **{str(c): _ERROR for c in (401, 403)}}}},
            "/agents/{agent}/sessions": {"get": {
                "summary": "the agent's sessions the caller may see, newest first",
                "parameters": agent_only, "responses": {"200": _json(_object(
                    sessions={"type": "array", "items": _object(
                        session={"type": "string"},
                        status={"type": "string"}, generation={"type": "integer"},
                        last_activity={"type": ["number", "null"]})})),
                    **errors(404)}}},
            "/agents/{agent}/pending": {"get": {
                "summary": "the inbox: the parked sessions the caller may see or answer",
                "parameters": agent_only, "responses": {"200": _json(_object(
                    pending={"type": "array", "items": _object(
                        session={"type": "string"}, request={"type": "object"})})),
                    **errors(404)}}},
            base: {"get": {"summary": "status, generation, owner, transcript, pending, turns",
                           "parameters": params, "responses": {
                               "200": _json({"allOf": [_ref("Summary"), _object(
                                   transcript={"type": "array"}, turns={"type": "array"})]}),
                               **errors(404)}}},
            f"{base}/timeline": {"get": {
                "summary": "each turn's steps (model, tool, input) with their times and "
                           "status, and seq, the cursor for /events?after=",
                "parameters": [*params,
                               {"name": "last", "in": "query", "required": False,
                                "schema": {**_CURSOR, "minimum": 1}}],
                "responses": {"200": _json({"allOf": [_ref("Summary"), _object(
                    exists={"type": "boolean"}, seq={"type": "integer"},
                    earlier={"type": "integer"}, turns={"type": "array"})]}),
                    **errors(400, 404)}}},
            f"{base}/turn": _keyed(post("turn", "start a turn; its events", turn, 409, 422)),
            f"{base}/chat": _keyed(post("chat", "start a turn; its result or its events", chat,
                                        409, 422)),
            **{f"{base}/{c.route.path}": post(
                c.route.path, c.route.summary,
                result if c.route.answer is None else _json(dict(c.route.answer)),
                *c.route.codes, required=c.route.required)
               for c in commands if c.route is not None},
            f"{base}/history": {"get": {
                "summary": "the session's checkpoints, oldest first: each commit's place "
                           "(generation, seq, sub), kind, steps and events",
                "parameters": params, "responses": {"200": _json(_object(
                    checkpoints={"type": "array", "items": _ref("Checkpoint")})),
                    **errors(404)}}},
            f"{base}/fork": post("fork", "copy the session up to a checkpoint into a new one "
                                 "the caller owns", _json({"allOf": [_ref("Summary"), _object(
                                     history={"type": "integer"})]}, "the fork"), 409,
                                 status=201),
            f"{base}/replay": post("replay", "replay the session's turns in a new session "
                                   "(another model); the report, turn by turn", _json(_object(
                                       source={"type": "string"}, replay={"type": "string"},
                                       identical={"type": "boolean"},
                                       turns={"type": "array", "items": {"type": "object"}}),
                                       "the report"), 409, required=False, status=201),
            f"{base}/events": {"get": {
                "summary": "the session's events after a cursor, then live ones",
                "parameters": [*params,
                               {"name": "after", "in": "query", "required": False,
                                "schema": _CURSOR},
                               {"name": "until", "in": "query", "required": False,
                                "schema": {"type": "string", "enum": ["turn"]}},
                               {"name": "Last-Event-ID", "in": "header", "required": False,
                                "schema": _CURSOR}],
                "responses": {"200": {"description": "the events", "content": _SSE_CONTENT},
                              **errors(400, 404)}}},
        },
        "components": {"schemas": schemas},
    }


def _keyed(route: dict[str, Any]) -> dict[str, Any]:
    """A route that starts a turn takes an ``Idempotency-Key`` (``server/_idempotency.py``)
    and a ``mode`` (``AgentSession.start``'s: a steer streams the turn it joins)."""
    post = route["post"]
    post["parameters"] = [*post["parameters"], {
        "name": "mode", "in": "query", "required": False,
        "description": "queue (default), replace, or steer: join the running turn at its "
                       "next model call (its events are then the stream), else start one",
        "schema": {"type": "string", "enum": list(MODES), "default": "queue"}}, {
        "name": "Idempotency-Key", "in": "header", "required": False,
        "description": "the same key with the same body is the same turn; with another "
                       "body, 422",
        "schema": {"type": "string", "pattern": "^[ -~]{1,255}$"}}]
    return route


__all__ = ["openapi"]
