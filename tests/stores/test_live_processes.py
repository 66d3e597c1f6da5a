"""F22: Live text across processes: a turn a ``durable-turns worker`` drives streams its text to
the SSE clients of a ``durable-turns serve --no-drive``, on PostgreSQL (``NOTIFY`` frames) and
on one SQLite file (datagrams). Real processes, the CLI as users run it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from deploykit import deployment, write_app
from livekit import AGENT_PY, WAIT, check_stream, store_option, stream_turn, warm_up, watch


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_a_worker_s_live_text_reaches_every_client_of_a_server(
        kind: str, tmp_path: Path) -> None:
    workers = 2 if kind == "postgres" else 1
    store = store_option(kind, tmp_path)
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
