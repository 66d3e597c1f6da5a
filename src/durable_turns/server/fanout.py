"""The way from a session's events to many SSE clients: encode once, queue, write in bursts.

A session watched by a thousand clients hands every event to a thousand subscriptions of
the store's feed (one store read serves them all). What each client then costs is the
server's part of the fan-out, so it is kept small:

- :class:`FrameCache` encodes an event into its SSE frame (sse-starlette's
  ``ServerSentEvent``) once, for every client that gets the same event object;
- an :class:`Outbox` per client takes frames synchronously, as the feed delivers them (no
  task switch per event), and its stream yields everything queued as one chunk: a client
  that fell behind a burst (a commit's events, a model's text deltas) costs one write, not
  one per event. The socket write is what dominates (``bench/sse.py --profile``).
- live text (``message.delta``) is not urgent: a :class:`Pacer` writes it out at most
  ``linger`` seconds later (20 ms), or with the next durable event, whichever is first; a
  model's deltas then cost one write per client per tick instead of one each, and durable
  events are written at once.
- the response is Starlette's ``StreamingResponse`` (sse-starlette frames every event, and
  the keep-alive comments): sse-starlette's own response opens an anyio cancel scope around
  every write, which doubled the cost of a write (``bench/sse.py``); the keep-alive is a
  timer per client instead of a task, and the streams end when the server shuts down
  (:meth:`Streams.end_all`, called by ``serve``).
- **Slow clients.** While a write to a client is held up (its socket and uvicorn's buffer
  are full), its outbox takes at most ``limit`` more bytes. A client that does not read that
  much is cut off: its stream ends, nothing more is queued for it, and the other clients
  never wait for it. (A replay is queued before the first write, so a long catch-up is not
  cut off; it goes out as one write.) Nothing durable is lost:
  the client reconnects with ``Last-Event-ID`` (EventSource does it by itself) and the
  store replays what it missed; only live text deltas of that gap are gone, and the
  ``message.completed`` that follows carries the whole text.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

from sse_starlette import ServerSentEvent
from starlette.responses import StreamingResponse

from ..events import TurnEvent
from ._http import sse_fields

MAX_BACKLOG = 1 << 20
"""Bytes of frames an SSE client may have waiting before it is cut off (1 MiB)."""
LINGER = 0.02
"""Seconds live text may wait for company before it is written."""
FRAME_CACHE = 1024
"""How many recent events' SSE frames are kept for the other subscribers."""
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
"""An event stream's headers, as sse-starlette sets them: no cache, no proxy buffering."""


class FrameCache:
    """An event's SSE frame, encoded once for every client that is handed the same event."""

    def __init__(self, size: int = FRAME_CACHE) -> None:
        self._size = size
        # Keyed by id(): holding the event keeps its id unique while it is cached.
        self._frames: OrderedDict[int, tuple[TurnEvent, bytes]] = OrderedDict()

    def frame(self, event: TurnEvent) -> bytes:
        """``event`` as its SSE frame: ``id:`` (durable events only), ``event:``, ``data:``."""
        found = self._frames.get(id(event))
        if found is not None and found[0] is event:
            return found[1]
        frame = ServerSentEvent(**sse_fields(event)).encode()
        self._frames[id(event)] = (event, frame)
        if len(self._frames) > self._size:
            self._frames.popitem(last=False)
        return frame


class Pacer:
    """Writes out the outboxes that hold only non-urgent frames, every ``linger`` seconds:
    one timer for all of a host's clients."""

    def __init__(self, linger: float = LINGER) -> None:
        self.linger = linger
        self._due: list[Outbox] = []
        self._timer: asyncio.TimerHandle | None = None

    def later(self, outbox: Outbox) -> None:
        """Write ``outbox`` out at the next tick."""
        self._due.append(outbox)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.linger, self._tick)

    def _tick(self) -> None:
        self._timer = None
        due, self._due = self._due, []
        for outbox in due:
            outbox.flush()


class Outbox:
    """The frames waiting for one SSE client, bounded; iterate it for the response body.

    Args:
        limit: the most bytes that may wait behind a write in progress; a frame that comes
            while more than that waits cuts the client off (:attr:`overflowed`): its
            stream ends.
        ping: seconds between keep-alive comments while the stream is read (0: none).
        pacer: writes out non-urgent frames (``put(…, urgent=False)``) later; without one,
            every frame is urgent.
    """

    def __init__(self, limit: int = MAX_BACKLOG, ping: float = 0,
                 pacer: Pacer | None = None) -> None:
        self.limit = limit
        self.ping = ping
        self._pacer = pacer
        self._paced = False
        self.overflowed = False
        """Whether the client was cut off for not reading."""
        self._frames: list[bytes] = []
        self._size = 0
        self._ended = False
        self._writing = False
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def ended(self) -> bool:
        """Whether nothing more will be queued (the stream ends once the queue is written)."""
        return self._ended

    def put(self, frame: bytes, urgent: bool = True) -> None:
        """Queue ``frame`` (written at once if ``urgent``, else at the pacer's next tick or
        with the next urgent frame); cut the client off if it is over its limit."""
        if self._ended:
            return
        if self._writing and self._size > self.limit:
            # Checked before adding, so that one event larger than the limit (a big tool
            # result) still reaches a client that reads.
            self.overflowed = True
            self._frames.clear()
            self._size = 0
            self.end()
            return
        self._size += len(frame)
        self._frames.append(frame)
        if urgent or self._pacer is None:
            self._wake.set()
        elif not self._paced:
            self._paced = True
            self._pacer.later(self)

    def flush(self) -> None:
        """Write out what is queued now."""
        self._paced = False
        if self._frames:
            self._wake.set()

    def end(self) -> None:
        """Queue nothing more: the stream ends after what is queued."""
        self._ended = True
        self._wake.set()
        if self._timer is not None:
            self._timer.cancel()

    def _keepalive(self) -> None:
        self.put(ServerSentEvent(comment=f"ping - {datetime.now(UTC)}").encode())
        if not self._ended:
            self._timer = asyncio.get_running_loop().call_later(self.ping, self._keepalive)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        if self.ping > 0 and not self._ended:
            self._timer = asyncio.get_running_loop().call_later(self.ping, self._keepalive)
        try:
            while True:
                if self._frames:
                    chunk = b"".join(self._frames)
                    self._frames.clear()
                    self._size = 0
                    self._writing = True  # until the response asks for the next chunk
                    yield chunk
                    self._writing = False
                    continue
                if self._ended:
                    return
                self._wake.clear()
                await self._wake.wait()
        finally:
            if self._timer is not None:
                self._timer.cancel()


class Streams:
    """The open outboxes of a host, so that a shutdown can end them all."""

    def __init__(self) -> None:
        self._open: set[Outbox] = set()

    def response(self, outbox: Outbox, close: Callable[[], None]) -> StreamingResponse:
        """The ``text/event-stream`` response that writes ``outbox``; ``close`` is called
        when it ends (written out, cut off, the client gone or the server shutting down)."""
        self._open.add(outbox)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in outbox:
                    yield chunk
            finally:
                self._open.discard(outbox)
                outbox.end()
                close()

        return StreamingResponse(body(), media_type="text/event-stream", headers=HEADERS)

    def end_all(self) -> None:
        """End every open stream (after what is queued); a client reconnects with its
        ``Last-Event-ID``. Call it on the event loop."""
        for outbox in list(self._open):
            outbox.end()


__all__ = ["FRAME_CACHE", "HEADERS", "MAX_BACKLOG", "FrameCache", "Outbox", "Streams"]
