"""Live text across processes, the parts its tests share (``tests/stores/test_live_processes.py``,
``tests/temporal/test_temporal_cli.py``, ``tests/server/test_frontends_split.py``): the app, the
store option of a deployment, and reading a turn's stream.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from conftest import PG_DSN, pg_schema_dsn
from deploykit import Frame, read_sse

WAIT = 30.0
TEXT = "The order ships on Monday, and the invoice follows by mail within a day."
AGENT_PY = f"""
import os
from durable_turns import ModelReply, scripted

# Streams its reply in 12 pieces, 10 ms apart: text a client can watch arrive.
model = scripted(lambda _request: ModelReply({TEXT!r} + f" (pid {{os.getpid()}})"),
                 chunks=12, delay=0.01)
"""


def store_option(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return str(tmp_path / "ops.db")
    if PG_DSN is None:
        pytest.skip("PostgreSQL tests need DURABLE_TURNS_TEST_PG (a DSN; see .ci/pg)")
    import psycopg

    options = psycopg.conninfo.conninfo_to_dict(pg_schema_dsn())["options"]
    return f"{PG_DSN}?options={quote(str(options))}"


async def stream_turn(client: httpx.AsyncClient, session: str, text: str) -> list[Frame]:
    """``POST …/turn`` and read its stream to its end."""
    async with client.stream("POST", f"/agents/ops/sessions/{session}/turn",
                             json={"text": text}) as r:
        assert r.status_code == 200, await r.aread()
        return await read_sse(r)


async def watch(client: httpx.AsyncClient, session: str) -> list[Frame]:
    """``GET …/events?after=0&until=turn``: a second client of a session, to its turn's end."""
    async with client.stream("GET", f"/agents/ops/sessions/{session}/events",
                             params={"after": "0", "until": "turn"}) as r:
        return await read_sse(r)


async def warm_up(client: httpx.AsyncClient) -> None:
    """Stream turns until one's live text arrives.

    A process starts taking other processes' live text a moment after its first subscriber
    came (it connects, or binds): a first turn whose deltas arrived says it has (by
    contract, text before that may be lost).
    """
    async with asyncio.timeout(WAIT):
        for i in range(100):
            warm = await stream_turn(client, f"warm{i}", "hello")
            if any(k == "message.delta" for _s, k, _d in warm):
                return


def check_stream(frames: list[Frame], pids: list[int]) -> str:
    """The stream's live text, checked: the durable events in order without a gap, every
    delta after the ``turn.started`` and before the ``message.completed`` it belongs to,
    their text that message's, written by a worker."""
    kinds = [k for _s, k, _d in frames]
    durable = [(s, k) for s, k, _d in frames if s is not None]
    assert [k for _s, k in durable] == ["turn.started", "message.completed", "turn.completed"]
    first = int(durable[0][0] or 0)
    assert [int(s or 0) for s, _k in durable] == [first, first + 1, first + 2]
    deltas = [i for i, k in enumerate(kinds) if k == "message.delta"]
    assert deltas, f"no live text reached the server's client: {kinds}"
    assert kinds.index("turn.started") < deltas[0]
    assert deltas[-1] < kinds.index("message.completed")
    text = "".join(frames[i][2]["text"] for i in deltas)
    completed = next(d for _s, k, d in frames if k == "message.completed")
    assert text == completed["text"], "every piece of text arrived, once, in order"
    assert text.startswith(TEXT) and any(f"(pid {p})" in text for p in pids)
    assert all(frames[i][2]["seq"] == first for i in deltas)  # after turn.started
    return text
