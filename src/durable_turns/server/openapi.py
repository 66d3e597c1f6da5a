"""``/openapi.json``: the HTTP host's routes, bodies and answers as an OpenAPI 3.1 document."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_ERROR = {"description": "refused: {\"error\": {\"type\", \"message\"}}",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_SSE = {"description": "the events, as text/event-stream",
        "content": {"text/event-stream": {"schema": {"type": "string"}}}}
_JSON = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}


def openapi(bodies: dict[str, type[BaseModel]], agents: list[str]) -> dict[str, Any]:
    """The document, with each request body's JSON schema taken from its pydantic model and
    the ``agent`` path parameter listing the served agents."""
    params = [
        {"name": "agent", "in": "path", "required": True,
         "schema": {"type": "string", "enum": agents}},
        {"name": "session", "in": "path", "required": True,
         "schema": {"type": "string", "minLength": 1}}]
    schemas: dict[str, Any] = {"Error": {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["type", "message"],
                                 "properties": {"type": {"type": "string"},
                                                "message": {"type": "string"}}}}}}
    for model in bodies.values():
        schemas[model.__name__] = model.model_json_schema(
            ref_template="#/components/schemas/{model}")

    def errors(*codes: int) -> dict[str, Any]:
        return {str(c): _ERROR for c in codes}

    def post(name: str, summary: str, ok: dict[str, Any], *codes: int) -> dict[str, Any]:
        return {"post": {
            "summary": summary, "parameters": params,
            "requestBody": {"required": False, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{bodies[name].__name__}"}}}},
            "responses": {"200": ok, **errors(400, 401, 404, 413, *codes)}}}

    base = "/agents/{agent}/sessions/{session}"
    agent_only = params[:1]
    return {
        "openapi": "3.1.0",
        "info": {"title": "durable_turns HTTP host", "version": "1"},
        "paths": {
            "/": {"get": {"summary": "the web console (HTML)", "responses": {
                "200": {"description": "the console's page",
                        "content": {"text/html": {"schema": {"type": "string"}}}},
                **errors(401)}}},
            "/agents": {"get": {
                "summary": "the agents served (name, tools), the mode, and who is asking",
                "responses": {"200": _JSON, **errors(401)}}},
            "/agents/{agent}/sessions": {"get": {
                "summary": "the agent's sessions, newest first, with status",
                "parameters": agent_only, "responses": {"200": _JSON, **errors(401, 404)}}},
            "/agents/{agent}/pending": {"get": {
                "summary": "the inbox: every parked session and its request",
                "parameters": agent_only, "responses": {"200": _JSON, **errors(401, 404)}}},
            base: {"get": {"summary": "status, generation, transcript, pending, turns",
                           "parameters": params, "responses": {"200": _JSON, **errors(401, 404)}}},
            f"{base}/timeline": {"get": {
                "summary": "each turn's steps (model, tool, input) with their times and "
                           "status, and seq, the cursor for /events?after=",
                "parameters": [*params,
                               {"name": "last", "in": "query", "required": False,
                                "schema": {"type": "string", "pattern": "^[0-9]+$"}}],
                "responses": {"200": _JSON, **errors(400, 401, 404)}}},
            f"{base}/turn": post("turn", "start a turn; its events", _SSE, 409),
            f"{base}/chat": post("chat", "start a turn; its events or its result", _JSON, 409),
            f"{base}/resume": post("resume", "answer a parked turn", _JSON, 403, 409, 422, 500),
            f"{base}/cancel": post("cancel", "cancel a turn or every unfinished one", _JSON),
            f"{base}/reset": post("reset", "archive the session's history", _JSON),
            f"{base}/retry": post("retry", "re-open a failed turn where it failed", _JSON, 409),
            f"{base}/events": {"get": {
                "summary": "the session's events after a cursor, then live ones",
                "parameters": [*params,
                               {"name": "after", "in": "query", "required": False,
                                "schema": {"type": "string", "pattern": "^[0-9]+$"}},
                               {"name": "until", "in": "query", "required": False,
                                "schema": {"type": "string", "enum": ["turn"]}},
                               {"name": "Last-Event-ID", "in": "header", "required": False,
                                "schema": {"type": "string", "pattern": "^[0-9]+$"}}],
                "responses": {"200": _SSE, **errors(400, 401, 404)}}},
        },
        "components": {"schemas": schemas},
    }
