"""The Worker's side of an agent object: JavaScript ``Response``s of the object's replies,
and the entrypoint's routing of ``/agents/{agent}/sessions/{id}/…`` to the session's object.

On Workers a response's body must be a JavaScript ``ReadableStream``: a streamed reply is
the readable side of a ``TransformStream`` whose writer a Python task feeds, chunk by chunk,
kept alive with ``ctx.waitUntil``; when the reader leaves, the write fails and the reply's
stream is closed (its subscription with it; the turn goes on). Outside Pyodide a reply is
returned as it is (the tests read it).
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any
from urllib.parse import urlsplit

from ._http import Reply, error_reply
from ._values import ON_PYODIDE, callback

__all__ = ["forward", "object_name", "to_response"]


def to_response(reply: Reply, ctx: Any) -> Any:
    """``reply`` as the host answers it: a JavaScript ``Response`` under Pyodide."""
    if not ON_PYODIDE:
        return reply
    # Pyodide's modules: through importlib, as no checker here knows them (and a folder
    # named js may stand in their place).
    js: Any = importlib.import_module("js")
    to_js = importlib.import_module("pyodide.ffi").to_js

    init = to_js({"status": reply.status, "headers": reply.headers},
                 dict_converter=js.Object.fromEntries)
    if isinstance(reply.body, bytes):
        return js.Response.new(to_js(reply.body), init)
    pipe = js.TransformStream.new()
    # Each write's promise is settled in JavaScript: a promise rejected with no reason
    # (undefined, as a cancelled stream's writes are) that reaches Python fails inside
    # Pyodide's own future handling and takes the process down instead of raising here.
    write = js.Function.new("w", "c", "return w.write(c).then(() => true, () => false)")
    close = js.Function.new("w", "return w.close().then(() => true, () => false)")
    writer = pipe.writable.getWriter()
    task = asyncio.ensure_future(_feed(
        reply, lambda chunk: write(writer, to_js(chunk)), lambda: close(writer)))
    wait_until = getattr(ctx, "waitUntil", None)
    if wait_until is not None:
        def settle(resolve: Any, _reject: Any) -> None:
            task.add_done_callback(lambda _t: resolve())

        wait_until(js.Promise.new(callback(settle)))
    return js.Response.new(pipe.readable, init)


async def _feed(reply: Reply, write: Any, close: Any) -> None:
    """Write the reply's chunks (``write(chunk)``, ``close()``: promises of whether they
    were written) until its end or until the reader leaves."""
    try:
        async for chunk in reply.chunks():
            if not await write(chunk):
                return  # the reader left: the reply's stream stops (the turn goes on)
        await close()
    finally:
        await reply.close()


def object_name(path: str) -> str | None:
    """The name of the object a path's session lives in (``"{agent}/{session}"``), or
    ``None`` for a path outside ``/agents/{agent}/sessions/{session}[/…]``."""
    parts = path.strip("/").split("/")
    if len(parts) < 4 or parts[0] != "agents" or parts[2] != "sessions" or \
            not parts[1] or not parts[3]:
        return None
    return f"{parts[1]}/{parts[3]}"


async def forward(request: Any, namespace: Any) -> Any:
    """Route a Worker's request to its session's object: what a ``WorkerEntrypoint``'s
    ``fetch`` returns (``await forward(request, self.env.AGENTS)``).

    Args:
        request: the Worker's request.
        namespace: the Durable Object binding of the :class:`AgentObject` class.

    Returns:
        The object's response; 404 (JSON) for a path that names no session.
    """
    name = object_name(urlsplit(str(request.url)).path)
    if name is None:
        from .._input_limits import HttpError

        return to_response(error_reply(HttpError(
            404, "NotFound", "sessions are under /agents/{agent}/sessions/{session}")), None)
    stub = namespace.get(namespace.idFromName(name))
    return await stub.fetch(getattr(request, "js_object", request))
