"""F18: Slow clients are cut off: headers that trickle in (or never come) and bodies that do, while
the server goes on answering everyone else (``server.deadlines``,
``_input_limits.read_limited``)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, scripted
from durable_turns.server import create_app
from durable_turns.server.deadlines import H11Deadline, HttpProtocol, with_deadline
from fakes.serving import serving

WAIT = 30.0
"""The bound on every wait of these tests."""
DEADLINE = 0.5
"""The deadline the server under test gives headers and bodies."""
SLOW = 40
"""How many slow connections of each kind."""


@asynccontextmanager
async def server(protocol: type[asyncio.Protocol]) -> AsyncIterator[str]:
    rt = Runtime([Agent("desk", "You help.")], MemoryStore(),
                 scripted(lambda _request: ModelReply("ok")))
    app = create_app(rt, body_timeout=DEADLINE)
    async with rt, serving(app, http=with_deadline(protocol, DEADLINE)) as url:
        yield url


async def connect(url: str) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", int(url.rsplit(":", 1)[1])))
    return sock


async def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by WAIT)."""
    got = bytearray()
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(WAIT):
        while chunk := await loop.sock_recv(sock, 4096):
            got += chunk
    sock.close()
    return bytes(got)


async def until_answered(sock: socket.socket) -> bytes:
    """One whole response (its headers and its Content-Length of body; bounded by WAIT)."""
    got = bytearray()
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(WAIT):
        while True:
            head, sep, body = bytes(got).partition(b"\r\n\r\n")
            if sep:
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                if len(body) >= length:
                    sock.close()
                    return bytes(got)
            chunk = await loop.sock_recv(sock, 4096)
            assert chunk, bytes(got)
            got += chunk


@pytest.mark.parametrize("protocol", [HttpProtocol, H11Deadline], ids=["default", "h11"])
async def test_slow_headers_and_bodies_are_cut_off_and_others_are_served(
        protocol: type[asyncio.Protocol]) -> None:
    async with server(protocol) as url:
        loop = asyncio.get_running_loop()
        silent = [await connect(url) for _ in range(SLOW)]
        trickling = [await connect(url) for _ in range(SLOW)]
        for sock in trickling:  # the start of a request, never its end
            await loop.sock_sendall(sock, b"GET /agents/desk/sessions HTTP/1.1\r\nHost: 127")
        slow_body = [await connect(url) for _ in range(SLOW)]
        for sock in slow_body:  # whole headers, then one byte of a body of 100
            await loop.sock_sendall(
                sock, b"POST /agents/desk/sessions/s1/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        async with httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
            r = await client.post("/agents/desk/sessions/s1/chat", json={"text": "hi"})
            assert r.status_code == 200 and r.json()["text"] == "ok"  # meanwhile, served
        for sock in silent + trickling:
            got = await until_closed(sock)
            assert got.startswith(b"HTTP/1.1 408 "), got[:80]
            body = json.loads(got.split(b"\r\n\r\n", 1)[1])
            assert body["error"]["type"] == "RequestTimeout"
        for sock in slow_body:
            got = await until_answered(sock)
            assert got.startswith(b"HTTP/1.1 408 "), got[:80]
            assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["type"] == \
                "RequestTimeout"
