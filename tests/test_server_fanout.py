"""The SSE fan-out of ``GET …/events``: many subscribers, slow ones, and the shutdown."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.applications import Starlette

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, scripted
from durable_turns.models import ModelRequest
from durable_turns.server import create_app
from durable_turns.server.fanout import Outbox, Pacer
from fakes.serving import serving

WAIT = 60.0
"""The bound on every wait of these tests."""

BIG = 1 << 20
"""The text of a ``big`` turn: more than the sockets (4 KiB buffers) and uvicorn's buffer
(64 KiB) hold unread."""


def reply(request: ModelRequest) -> ModelReply:
    opening = next(m.text for m in reversed(request.messages) if m.is_opening)
    return ModelReply("x" * BIG if opening == "big" else f"You said: {opening}")


@asynccontextmanager
async def hosted(max_backlog: int = 1 << 20) -> AsyncIterator[tuple[Runtime, str, Starlette]]:
    rt = Runtime([Agent("desk", "You help.")], MemoryStore(), scripted(reply, chunks=3))
    async with rt:
        app = create_app(rt, max_backlog=max_backlog)
        async with serving(app, sndbuf=4096) as url:
            yield rt, url, app
        await asyncio.wait_for(rt.idle(), WAIT)


async def read_events(client: httpx.AsyncClient, after: int,
                      until_turns: int) -> list[tuple[int | None, str, int]]:
    """``(id, event, data length)`` of every frame until ``until_turns`` turns completed."""
    out: list[tuple[int | None, str, int]] = []
    frame: dict[str, str] = {}
    async with client.stream("GET", "/agents/desk/sessions/s1/events",
                             headers={"Last-Event-ID": str(after)}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line:
                name, _, value = line.partition(": ")
                frame[name] = value
                continue
            if "event" in frame:
                seq = int(frame["id"]) if "id" in frame else None
                out.append((seq, frame["event"], len(frame.get("data", ""))))
                if sum(e == "turn.completed" for _, e, _ in out) == until_turns:
                    return out
            frame = {}
    return out


async def test_many_subscribers_each_get_every_event_once_in_order() -> None:
    async with hosted() as (rt, url, _app), httpx.AsyncClient(base_url=url,
                                                               timeout=WAIT) as client:
        watchers = [asyncio.create_task(read_events(client, 0, 2)) for _ in range(20)]
        for text in ("one", "two"):
            r = await client.post("/agents/desk/sessions/s1/chat", json={"text": text})
            assert r.json()["status"] == "completed"
        seen = await asyncio.wait_for(asyncio.gather(*watchers), WAIT)
        logged = [(e.seq, e.type) for e in await rt.session("desk", "s1").events()]
        for frames in seen:
            assert [(s, e) for s, e, _ in frames if s is not None] == logged


async def test_a_client_that_does_not_read_is_cut_off_and_catches_up_on_reconnect() -> None:
    # The big turn fills every buffer; the "after" turn's write is then held up, and behind
    # it at most 100 bytes may wait: the "again" turn's events are more.
    async with hosted(max_backlog=100) as (rt, url, _app), httpx.AsyncClient(
            base_url=url, timeout=WAIT) as client:
        port = int(url.rsplit(":", 1)[1])
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # read nothing, hold little
        slow.connect(("127.0.0.1", port))
        slow.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(slow, b"GET /agents/desk/sessions/s1/events?after=0 HTTP/1.1"
                                b"\r\nHost: test\r\nConnection: close\r\n\r\n")
        got = bytearray()
        async with asyncio.timeout(WAIT):  # its headers: it is subscribed; then it stalls
            while b"\r\n\r\n" not in got:
                got += await loop.sock_recv(slow, 1)
        for text in ("before", "big", "after", "again"):
            r = await client.post("/agents/desk/sessions/s1/chat", json={"text": text})
            assert r.json()["status"] == "completed"  # the turns never wait for the client
        # A client that catches up gets every event, the big ones whole: a replay is queued
        # before its first write, so it is not cut off however long it is.
        frames = await read_events(client, 0, 4)
        logged = [(e.seq, e.type) for e in await rt.session("desk", "s1").events()]
        assert [(s, e) for s, e, _ in frames if s is not None] == logged
        assert max(n for _, _, n in frames) > BIG
        # The stalled client was cut off: its stream ends (the server closes it) short of
        # the end, after whole frames only.
        async with asyncio.timeout(WAIT):
            while chunk := await loop.sock_recv(slow, 1 << 20):
                got += chunk
        slow.close()
        ids = [int(line[4:]) for line in bytes(got).split(b"\r\n") if line.startswith(b"id: ")]
        assert ids == [s for s, _ in logged[:len(ids)]] and len(ids) < len(logged)
        # Reconnecting with its last id, it gets exactly the rest.
        missed = logged[len(ids):]
        rest = await read_events(client, ids[-1], sum(e == "turn.completed" for _, e in missed))
        assert [(s, e) for s, e, _ in rest if s is not None] == missed


async def test_head_of_an_event_stream_is_its_headers_only() -> None:
    async with hosted() as (_rt, url, _app), httpx.AsyncClient(base_url=url,
                                                                timeout=WAIT) as client:
        r = await client.head("/agents/desk/sessions/s1/events")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")


async def test_end_streams_ends_open_event_streams() -> None:
    async with hosted() as (_rt, url, app), httpx.AsyncClient(base_url=url,
                                                               timeout=WAIT) as client:
        r = await client.post("/agents/desk/sessions/s1/chat", json={"text": "hi"})
        assert r.json()["status"] == "completed"
        async with client.stream("GET", "/agents/desk/sessions/s1/events",
                                 params={"after": "0"}) as events:
            lines = events.aiter_lines()
            async with asyncio.timeout(WAIT):
                async for line in lines:
                    if line == "event: turn.completed":
                        break
                app.state.end_streams()
                rest = [line async for line in lines]  # the stream ends
        assert all(not line.startswith("id:") for line in rest)


async def test_an_outbox_cuts_off_a_client_over_its_limit_and_keeps_one_big_frame() -> None:
    big = Outbox(limit=10)
    big.put(b"y" * 100)  # one frame over the limit still goes out to a client that reads
    big.end()
    assert [c async for c in big] == [b"y" * 100] and not big.overflowed
    slow = Outbox(limit=10)
    chunks = aiter(slow)
    slow.put(b"first")
    assert await anext(chunks) == b"first"  # and its write is held up: the client stalls
    for _ in range(3):
        slow.put(b"z" * 6)  # the third comes while 12 bytes wait behind it: cut off
    assert slow.overflowed and slow.ended
    assert [c async for c in chunks] == []
    slow.put(b"more")
    replay = Outbox(limit=10)
    for _ in range(5):
        replay.put(b"r" * 6)  # queued before the first write (a catch-up): never cut off
    replay.end()
    assert [c async for c in replay] == [b"r" * 30] and not replay.overflowed
    burst = Outbox(limit=100)
    for part in (b"a", b"b", b"c"):
        burst.put(part)
    burst.end()
    assert [c async for c in burst] == [b"abc"]  # what queued meanwhile goes as one write


async def test_live_text_waits_for_the_next_durable_event_or_the_pacer() -> None:
    pacer = Pacer(linger=0.01)
    box = Outbox(pacer=pacer)
    chunks = aiter(box)
    box.put(b"d1", urgent=False)
    box.put(b"d2", urgent=False)
    box.put(b"E", urgent=True)  # a durable event takes the live text with it, in order
    assert await asyncio.wait_for(anext(chunks), WAIT) == b"d1d2E"
    box.put(b"d3", urgent=False)  # alone: written at the pacer's tick
    assert await asyncio.wait_for(anext(chunks), WAIT) == b"d3"
    box.end()
    assert [c async for c in chunks] == []
