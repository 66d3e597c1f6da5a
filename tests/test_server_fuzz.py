"""Schemathesis fuzzes the HTTP host from its own ``/openapi.json``: no input makes it fail.

The host runs with uvicorn on loopback, in a thread (schemathesis's client is synchronous);
the fuzzing is about contents, not timing. ``/events`` is left out: without ``until`` it is a
stream that stays open by design (tests/test_server.py covers it).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, scripted
from durable_turns.server import create_app

WAIT = 30.0
"""The bound on the server's start and shutdown and on each request."""


@pytest.fixture(scope="module")
def api() -> Iterator[Any]:
    rt = Runtime([Agent("desk", "You help.")], MemoryStore(),
                 scripted(lambda _request: ModelReply("ok")))
    app = create_app(rt, lambda _request: {"id": "fuzzer"})  # authenticated: any host
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:  # uvicorn has no event for it: a bounded poll
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield schemathesis.openapi.from_url(f"http://127.0.0.1:{port}/openapi.json")
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()


def test_no_input_makes_the_server_fail(api: Any) -> None:
    # Each operation's cases drawn by hypothesis (schemathesis's pytest plugin needs a pytest
    # internal that current pytest lacks, so its strategies are driven here).
    schema = api.exclude(path_regex=r"/events$")
    checked, statuses = [], set()
    for found in schema.get_all_operations():
        operation = found.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        def fuzz(case: Any) -> None:
            response = case.call(timeout=WAIT)
            statuses.add(response.status_code)
            assert response.status_code < 500, (case.method, case.formatted_path,
                                                response.text[:300])
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"type", "message"}

        fuzz()
        checked.append(operation.label)
    assert len(checked) == 12, checked  # with the console: /, /agents, …/timeline; …/retry
    assert {200, 400, 404} <= statuses  # it reached the handlers, not only the refusals
