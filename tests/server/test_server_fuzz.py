"""F18: Schemathesis, with every one of its checks, against the HTTP host's own ``/openapi.json``.

Its command line runs all its phases (coverage, fuzzing, stateful) and every check: no 5xx,
every status, content type, header and body as the document says, invalid data refused and
valid data taken, 405 with ``Allow`` for a method a route does not take. No check is
excluded and no failure is accepted. The host runs with uvicorn on loopback in a thread, in
development mode and with authentication. ``/events`` is fuzzed too: its stream stays open
by design, so the harness ends each one shortly after it starts, as a client that leaves or
a shutdown does (``app.state.end_streams``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from schemathesis.core.warnings import SchemathesisWarning

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, scripted
from durable_turns.clock import ManualClock
from durable_turns.server import create_app, mount_ag_ui, mount_ai_sdk
from servekit import served_in_thread

WAIT = 30.0
"""The bound on the server's start and shutdown."""
RUN = 300.0
"""The bound on one schemathesis run."""
EXAMPLES = 30
"""Cases per operation and phase."""


@contextmanager
def served(authenticate: Any) -> Iterator[str]:
    # A clock that stands still: the schedules the fuzzer adds (F24) fire at most once (an
    # ``at`` already past), not every second for the rest of the run.
    rt = Runtime([Agent("desk", "You help.")], MemoryStore(),
                 scripted(lambda _request: ModelReply("ok")), clock=ManualClock())
    app = create_app(rt, authenticate)
    mount_ai_sdk(app)  # the frontend protocols' routes are in the document too
    mount_ag_ui(app)

    async def ending_streams(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/events"):
            asyncio.get_running_loop().call_later(0.2, app.state.end_streams)
        await app(scope, receive, send)

    with served_in_thread(ending_streams, lifespan="on") as url:  # it opens the runtime
        yield url


WARNINGS = ",".join(w.value for w in SchemathesisWarning if w not in {
    SchemathesisWarning.MISSING_TEST_DATA, SchemathesisWarning.LOW_VALID_RATE})
"""Every warning but two about the fuzzer's own reach, not the API: missing test data (``POST
…/retry`` answers 404 to every turn id it makes up: only a turn that failed may be retried),
and a low valid-input rate (by chance most of a run's ``…/turn`` requests may meet a session
parked by an earlier case, or reuse a key: a 409 or 422 each, as they should)."""


@pytest.mark.parametrize("authenticate", [None, lambda _request: {"id": "fuzzer"}],
                         ids=["development", "authenticated"])
def test_schemathesis_with_every_check_finds_nothing(authenticate: Any,
                                                     tmp_path: Path) -> None:
    # A turn's Idempotency-Key sent again with another body is refused, 422 (the IETF
    # draft's answer), which the fuzzer, reusing its keys, meets with valid bodies.
    (tmp_path / "schemathesis.toml").write_text(
        '[checks.positive_data_acceptance]\nexpected-statuses = '
        '["2xx", "3xx", 401, 403, 404, 409, 422, 429, "5xx"]\n')
    with served(authenticate) as url:
        run = subprocess.run(
            [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()",
             "run", f"{url}/openapi.json", "--checks", "all", "--workers", "1",
             "--max-examples", str(EXAMPLES), "--suppress-health-check", "all",
             "--warnings", WARNINGS],
            capture_output=True, text=True, timeout=RUN, cwd=tmp_path,
            env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_HOOKS": ""})
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    assert "Selected: 22/22" in report and "No issues found" in report, report[-3000:]
