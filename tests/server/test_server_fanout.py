"""F5, F12: The SSE fan-out of ``GET …/events``: many subscribers, slow ones, and the shutdown."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, scripted
from durable_turns.models import ModelRequest
from durable_turns.server import create_app
from durable_turns.server._fanout import EventStream, Outbox, Pacer, start_eagerly
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
                                b"\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
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


async def test_middleware_added_to_the_app_sees_every_write_of_an_event_stream() -> None:
    # Every write of a stream goes through the app's send path (here: a middleware that
    # counts the body bytes it passes on).
    passed: list[int] = []

    class Count:
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            async def counted(message: Message) -> None:
                if message["type"] == "http.response.body":
                    passed.append(len(message.get("body", b"")))
                await send(message)

            await self.app(scope, receive, counted)

    rt = Runtime([Agent("desk", "You help.")], MemoryStore(), scripted(reply, chunks=3))
    async with rt:
        app = create_app(rt)
        app.add_middleware(Count)
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
            r = await client.post("/agents/desk/sessions/s1/chat", json={"text": "hi"})
            assert r.json()["status"] == "completed"
            passed.clear()
            async with client.stream("GET", "/agents/desk/sessions/s1/events",
                                     params={"after": "0", "until": "turn"}) as events:
                body = b"".join([chunk async for chunk in events.aiter_raw()])
        assert b"event: turn.completed" in body and sum(passed) == len(body)


class Client:
    """The ASGI ``send`` of an SSE client, for an outbox: it takes body chunks; while
    ``reading`` is clear, a write is held up (as uvicorn's is when the socket is full)."""

    def __init__(self) -> None:
        self.chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self.reading = asyncio.Event()
        self.reading.set()

    async def send(self, message: Message) -> None:
        assert message["type"] == "http.response.body" and message["more_body"]
        self.chunks.put_nowait(message["body"])
        await self.reading.wait()

    def taken(self) -> list[bytes]:
        out = []
        while not self.chunks.empty():
            out.append(self.chunks.get_nowait())
        return out


async def test_an_outbox_cuts_off_a_client_over_its_limit_and_keeps_one_big_frame() -> None:
    big, client = Outbox(limit=10), Client()
    big.put(b"y" * 100)  # one frame over the limit still goes out to a client that reads
    big.end()
    await asyncio.wait_for(big.start(client.send), WAIT)
    assert client.taken() == [b"y" * 100] and not big.overflowed
    slow, client = Outbox(limit=10), Client()
    client.reading.clear()
    slow.put(b"first")
    written = slow.start(client.send)  # its write is held up: the client stalls
    for _ in range(3):
        slow.put(b"z" * 6)  # the third comes while 12 bytes wait behind it: cut off
    assert slow.overflowed and slow.ended
    slow.put(b"more")
    client.reading.set()
    await asyncio.wait_for(written, WAIT)  # ends once the held-up write is done
    assert client.taken() == [b"first"]
    replay, client = Outbox(limit=10), Client()
    client.reading.clear()
    for _ in range(5):
        replay.put(b"r" * 6)  # queued before the first write (a catch-up): never cut off
    replay.end()
    written = replay.start(client.send)
    client.reading.set()
    await asyncio.wait_for(written, WAIT)
    assert client.taken() == [b"r" * 30] and not replay.overflowed
    burst, client = Outbox(limit=100), Client()
    written = burst.start(client.send)
    for part in (b"a", b"b", b"c"):
        burst.put(part)
    burst.end()
    await asyncio.wait_for(written, WAIT)
    assert client.taken() == [b"abc"]  # what queued meanwhile goes as one write


async def test_frames_queued_behind_a_held_up_write_follow_it_as_one_write() -> None:
    box, client = Outbox(limit=100), Client()
    client.reading.clear()
    written = box.start(client.send)
    box.put(b"1")
    assert await asyncio.wait_for(client.chunks.get(), WAIT) == b"1"  # and held up
    box.put(b"2")
    box.put(b"3")
    box.end()
    client.reading.set()
    await asyncio.wait_for(written, WAIT)
    assert client.taken() == [b"23"]


async def test_live_text_waits_for_the_next_durable_event_or_the_pacer() -> None:
    pacer = Pacer(linger=0.01)
    box, client = Outbox(pacer=pacer), Client()
    written = box.start(client.send)
    box.put(b"d1", urgent=False)
    box.put(b"d2", urgent=False)
    box.put(b"E", urgent=True)  # a durable event takes the live text with it, in order
    assert await asyncio.wait_for(client.chunks.get(), WAIT) == b"d1d2E"
    box.put(b"d3", urgent=False)  # alone: written at the pacer's tick
    assert await asyncio.wait_for(client.chunks.get(), WAIT) == b"d3"
    box.end()
    await asyncio.wait_for(written, WAIT)
    assert client.taken() == []


async def test_a_failed_write_ends_the_outbox_and_closes_its_stream() -> None:
    async def gone(message: Message) -> None:
        if message["type"] == "http.response.body":
            raise OSError("the client left")

    async def silent() -> Message:
        await asyncio.get_running_loop().create_future()  # the client never says it left
        raise AssertionError

    closed: list[str] = []
    box = Outbox()
    box.put(b"lost")
    scope: Scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
    stream = EventStream(box, lambda: closed.append("closed"))
    await asyncio.wait_for(stream(scope, silent, gone), WAIT)
    assert box.ended and closed == ["closed"]
    box.put(b"more")  # taken and dropped


async def test_a_pumped_outbox_reads_its_source_as_fast_as_the_client_reads() -> None:
    read: list[int] = []

    async def source() -> AsyncIterator[bytes]:
        for i in range(10):
            read.append(i)
            yield b"x" * 6

    box, client = Outbox(limit=10), Client()
    client.reading.clear()
    box.put(b"first")
    written = box.start(client.send)  # its write is held up: the client stalls
    box.pump(source())
    for _ in range(20):
        await asyncio.sleep(0)  # (not a wait on time: turns of the loop for the pump)
    assert len(read) == 2 and not box.overflowed  # held back at 12 bytes, not cut off
    client.reading.set()
    await asyncio.wait_for(written, WAIT)
    assert b"".join(client.taken()) == b"first" + b"x" * 60 and len(read) == 10


async def test_start_eagerly_runs_at_once_and_hands_a_suspension_to_a_task() -> None:
    steps: list[str] = []

    async def quick() -> None:
        steps.append("quick")

    assert start_eagerly(quick()) is None and steps == ["quick"]  # ran in this call

    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def waits() -> None:
        steps.append("before")
        steps.append(await gate)

    rest = start_eagerly(waits())
    assert rest is not None and steps[-1] == "before" and not rest.done()
    gate.set_result("after")
    await asyncio.wait_for(rest, WAIT)
    assert steps[-1] == "after"

    async def fails() -> None:
        raise ValueError("at once")

    with pytest.raises(ValueError, match="at once"):
        start_eagerly(fails())


async def test_cancelling_the_rest_of_an_eager_start_cancels_the_awaitable() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def waits() -> None:
        try:
            await loop.create_future()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("ended")

    rest = start_eagerly(waits())
    assert rest is not None
    stepped = loop.create_future()  # set after the task's first step (the loop is FIFO)
    loop.call_soon(stepped.set_result, None)
    await asyncio.wait_for(stepped, WAIT)
    rest.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(rest, WAIT)
    assert seen == ["cancelled", "ended"]
    seen.clear()
    rest = start_eagerly(waits())  # cancelled before its task ever ran: closed
    assert rest is not None
    rest.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(rest, WAIT)
    assert seen == ["ended"]


async def test_live_text_ticks_are_spaced_so_that_text_takes_at_most_its_share() -> None:
    # Writes that take 20 ms (a slow pass, as to a thousand clients): with a quarter of the
    # loop for text, the next tick comes at least three passes' time after one ends.
    spans: list[tuple[float, float]] = []
    written = asyncio.Queue[None]()

    async def slow(message: Message) -> None:
        start = time.monotonic()
        time.sleep(0.02)  # the write's cost, on the loop, as a socket write's is
        spans.append((start, time.monotonic()))
        written.put_nowait(None)

    pacer = Pacer(linger=0.001, share=0.25)
    box = Outbox(pacer=pacer)
    done = box.start(slow)
    box.put(b"d1", urgent=False)
    await asyncio.wait_for(written.get(), WAIT)
    box.put(b"d2", urgent=False)
    await asyncio.wait_for(written.get(), WAIT)
    (_, first_end), (second_start, _) = spans
    assert second_start - first_end >= 3 * 0.02 - 0.001  # (timers may fire a hair early)
    box.put(b"E")  # urgent: at the loop's next turn, whatever the text's rest
    await asyncio.wait_for(written.get(), WAIT)
    box.end()
    await asyncio.wait_for(done, WAIT)
