"""The web console (F12): static pages at ``/``, and the two routes only it needed.

The console is plain HTML, CSS and JavaScript shipped in ``server/console/`` (no build step,
nothing fetched from elsewhere). Its script talks to the public routes only: the ones every
client has, plus ``GET /agents`` (who is served, and who is asking) and
``GET …/{session}/timeline`` (each turn's steps with their times), both described at
``/openapi.json``. Every route here goes through the host's guard, so the console is behind
the same ``authenticate`` as the API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._input_limits import HttpError, cursor
from ..runtime import Runtime
from ._timeline import read_timeline

Handler = Callable[[Request], Awaitable[Response]]

ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "kit.js": "text/javascript; charset=utf-8",
    "timetravel.js": "text/javascript; charset=utf-8",
    "schedules.js": "text/javascript; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
"""The console's files, by name, with their media types: nothing else is served."""


def _asset(name: str) -> bytes:
    return resources.files("durable_turns.server").joinpath("console", name).read_bytes()


def console_routes(runtime: Runtime, guard: Callable[..., Handler],
                   development: bool, replay_models: Sequence[str] = ()) -> list[BaseRoute]:
    """The console's page, its files, ``GET /agents`` and ``GET …/timeline``.

    Args:
        guard: wraps each handler (origin, authentication, JSON errors; with the route's
            action, authorization), as for every API route (``_guard.Guard``).
        development: whether the host runs without ``authenticate``.
        replay_models: the names ``POST …/replay`` takes for its ``model`` (the console
            offers them).
    """

    async def page(request: Request) -> Response:
        return _file("index.html")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            raise HttpError(404, "NotFound", f"no console file {name!r}")
        return _file(name)

    async def agents(request: Request) -> Response:
        by = None if development else getattr(request.state, "by", None)
        return JSONResponse({
            "agents": [{"agent": name, "tools": sorted(a.tools_by_name)}
                       for name, a in sorted(runtime.agents.items())],
            "development": development, "by": by, "replay_models": sorted(replay_models)})

    async def timeline(request: Request) -> Response:
        s = runtime.session(request.path_params["agent"], request.path_params["session"])
        # A session never used is not an error here: it is new, with nothing on it yet (a
        # console opens it before its first turn, and follows its events once it exists).
        last = request.query_params.get("last")
        snapshot = await read_timeline(
            s, last=None if last is None else cursor(last, "last (a number of turns)",
                                                     minimum=1, error="MalformedQuery"))
        found = await s.summary()
        return JSONResponse({**found.to_dict(), "exists": found.exists, **snapshot})

    return [
        Route("/", guard(page), methods=["GET"]),
        Route("/console/{name}", guard(asset), methods=["GET"]),
        Route("/agents", guard(agents), methods=["GET"]),
        Route("/agents/{agent}/sessions/{session}/timeline", guard(timeline, "read"),
              methods=["GET"]),
    ]


def _file(name: str) -> Response:
    # The console changes with the package: a browser revalidates instead of keeping an old one.
    return Response(_asset(name), media_type=ASSETS[name],
                    headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


__all__ = ["ASSETS", "Handler", "console_routes"]
