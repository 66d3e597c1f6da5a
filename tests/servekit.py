"""An ASGI app served by uvicorn on loopback in a thread of the test process, for clients in
other processes (schemathesis, Node)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import uvicorn

WAIT = 30.0
"""The bound on the server's start and shutdown."""


@contextmanager
def served_in_thread(app: Any, *, lifespan: Literal["on", "off"] = "off") -> Iterator[str]:
    """uvicorn serving ``app`` on ``127.0.0.1`` (a free port) in a thread: its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:  # uvicorn has no event for it: a bounded poll
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()
