"""Live text across processes: a turn a ``durable-turns worker`` drives streams its text to
the SSE clients of a ``durable-turns serve --no-drive``, on PostgreSQL (``NOTIFY`` frames) and
on one SQLite file (datagrams). Real processes, the CLI as users run it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from conftest import PG_DSN, pg_schema_dsn
from deploykit import Frame, deployment, read_sse, write_app

WAIT = 30.0
TEXT = "The order ships on Monday, and the invoice follows by mail within a day."
AGENT_PY = f"""
import os
from durable_turns import ModelReply, scripted

# Streams its reply in 12 pieces, 10 ms apart: text a client can watch arrive.
model = scripted(lambda _request: ModelReply({TEXT!r} + f" (pid {{os.getpid()}})"),
                 chunks=12, delay=0.01)
"""


def _store_option(kind: str, tmp_path: Path) -> str:
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


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_a_worker_s_live_text_reaches_every_client_of_a_server(
        kind: str, tmp_path: Path) -> None:
    workers = 2 if kind == "postgres" else 1
    store = _store_option(kind, tmp_path)
    app = write_app(tmp_path, "You run ops.", AGENT_PY)
    async with deployment(app, store, tmp_path, workers=workers) as d, \
            httpx.AsyncClient(base_url=d.url, timeout=WAIT) as client:
        await warm_up(client)
        # Three turns at once, on three sessions; each with a second client following the
        # session's events (GET …/events) beside the one that started it.
        async with asyncio.timeout(WAIT):
            watchers = [asyncio.create_task(watch(client, f"s{i}")) for i in range(3)]
            turns = await asyncio.gather(*(stream_turn(client, f"s{i}", "when?")
                                           for i in range(3)))
            watched = await asyncio.gather(*watchers)
    for frames in turns:
        check_stream(frames, [p.pid for p in d.workers])
    for frames in watched:
        # A watcher that joined after the turn began may have missed its first pieces (text
        # before it came is not kept); what it got is in order, after turn.started.
        kinds = [k for _s, k, _d in frames]
        assert kinds[-1] == "turn.completed" and kinds.count("message.completed") == 1
        deltas = [d["text"] for _s, k, d in frames if k == "message.delta"]
        completed = next(d for _s, k, d in frames if k == "message.completed")
        assert completed["text"].endswith("".join(deltas))
