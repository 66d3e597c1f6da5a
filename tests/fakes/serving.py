"""Serve an ASGI app for a test: on loopback with uvicorn, or in-process with httpx2.

Loopback runs uvicorn as a task in the test's own event loop, so ``asyncio`` primitives work
across the app and the test (a uvicorn in a thread breaks them). Use it for anything about
timing: stalls, read timeouts, cut connections, cancellation, other processes. In-process
(``httpx2.ASGITransport``) buffers the whole response: use it for contents only.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx2
import uvicorn

WAIT = 30.0
"""The bound on the server's start and on its shutdown."""


@asynccontextmanager
async def serving(app: Any, *, sndbuf: int | None = None,
                  lifespan: Literal["auto", "on", "off"] = "off",
                  **config: Any) -> AsyncIterator[str]:
    """Run ``app`` on ``127.0.0.1:<free port>``; yields its base URL (no trailing slash).

    ``sndbuf`` sets the send buffer of the connections it accepts, so that a client that
    stops reading holds the server's writes up after a few KiB, not megabytes. ``config``:
    more of ``uvicorn.Config``'s settings (``http=…``). ``lifespan="on"`` runs the app's
    lifespan (its runtime opened and its channels started as ``serve`` does).
    """
    sock = socket.socket()
    if sndbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)  # accepted ones inherit
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan,
                                           timeout_graceful_shutdown=1, **config))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(WAIT):
            while not server.started:  # uvicorn has no event for it: a bounded poll
                if task.done():
                    task.result()
                await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT)
        sock.close()


def in_process(app: Any) -> httpx2.AsyncClient:
    """An ``httpx2`` client that calls ``app`` directly (pass it as an SDK's ``http_client``)."""
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://fake")
