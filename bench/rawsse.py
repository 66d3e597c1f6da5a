"""A raw SSE client for the benches: one ``GET …/events`` stream over a socket, each line
handed to :meth:`RawSse.line` with the time it arrived.

A protocol rather than a stream reader: the clients share the machine with the server, so
each read should cost them as little as it can.
"""

from __future__ import annotations

import asyncio
import time


class RawSse(asyncio.Protocol):
    """Sends ``request``, checks its answer is a 200, then splits what follows into lines
    (the transfer encoding's chunk-size lines among them: a subclass skips what it does not
    know)."""

    def __init__(self, request: bytes, connected: asyncio.Event | None = None) -> None:
        self.request = request
        self.connected = connected or asyncio.Event()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.head = b""
        self.rest = b""

    def line(self, line: bytes, now: float) -> None:
        """One line of the stream, received at ``now`` (``time.time()``)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if not self.connected.is_set():
            self.head += data
            if b"\r\n\r\n" not in self.head:
                return
            head, _, data = self.head.partition(b"\r\n\r\n")
            if b" 200 " not in head.split(b"\r\n", 1)[0]:
                self.done.set_exception(RuntimeError(f"refused: {head[:200]!r}"))
                return
            self.connected.set()
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            self.line(line, now)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)
