"""The host's one event-stream writer, and the way from a session's events to many clients.

Every ``text/event-stream`` the host sends (``GET …/events``, a turn's stream from ``POST
…/turn`` and ``…/chat``, the AI SDK's and AG-UI's streams) is an :class:`EventStream`:
Starlette's ``StreamingResponse`` (its body raced against the client leaving, every write
through the app's ``send`` and so through any middleware) whose body is an :class:`Outbox`.

A session watched by a thousand clients hands every event to a thousand subscriptions of
the store's feed (one store read serves them all). What each client then costs is the
server's part of the fan-out, so it is kept small (``bench/sse.py`` measures it):

- :class:`FrameCache` encodes an event into its SSE frame (sse-starlette's
  ``ServerSentEvent``) once, for every client that gets the same event object;
- an :class:`Outbox` per client takes frames synchronously, as the feed delivers them (no
  task per client between the feed and the outbox), and its response writes whatever has
  queued meanwhile as one write: a commit's events (several) are one write per client.
- live text (``message.delta``) is not urgent: it is written at the :class:`Pacer`'s next
  tick (every ``linger`` = 20 ms) or with the next durable event, whichever is first; a
  model's deltas then cost one write per client per tick instead of one each. Ticks are
  spaced so that live text takes at most a quarter of the loop (:data:`TEXT_SHARE`).
- a stream whose events come from an iterator (a turn's stream) is pumped into its outbox,
  which holds the pump back while a write is held up (the iterator is read as fast as the
  client reads, as a plain ``StreamingResponse`` would).
- keep-alive comments come from a timer per client; :meth:`Streams.end_all` (the lifespan's
  shutdown, ``serve``'s SIGTERM) ends every open stream.
- **Slow clients.** While a write to a client is held up (its socket and uvicorn's buffer
  are full), its outbox takes at most ``limit`` more bytes. A client of ``GET …/events``
  that does not read that much is cut off: its stream ends, nothing more is queued for it,
  and the other clients never wait for it. (A replay is queued before the first write, so
  a long catch-up is not cut off; it goes out as one write.) Nothing durable is lost: the
  client reconnects with ``Last-Event-ID`` (EventSource does it by itself) and the store
  replays what it missed; only live text deltas of that gap are gone, and the
  ``message.completed`` that follows carries the whole text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterable, Callable
from datetime import UTC, datetime

from sse_starlette import ServerSentEvent
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..events import TurnEvent
from ._http import sse_fields

log = logging.getLogger("durable_turns.server")

MAX_BACKLOG = 1 << 20
"""Bytes of frames an SSE client may have waiting before it is cut off (1 MiB)."""
LINGER = 0.02
"""Seconds live text may wait for company before it is written."""
TEXT_SHARE = 0.25
"""The most of the event loop's time that writing live text out may take."""
FRAME_CACHE = 1024
"""How many recent events' SSE frames are kept for the other subscribers."""
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
"""An event stream's headers, as sse-starlette sets them: no cache, no proxy buffering."""
OUTAGE = (b": the store is unavailable; this stream goes on from its cursor when it is "
          b"back\nretry: %d\n\n")
"""What a stream says when its store cannot be read: a comment, and ``retry:`` (ms), the
time an EventSource waits should the connection drop meanwhile (``%d``: filled in)."""
BACK = b": the store is back\n\n"
"""What a stream says when its store answers again (its events follow, from its cursor)."""


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
    """Wakes a host's outboxes that hold live text only, at its ticks.

    One timer serves every client of the host. Ticks come every ``linger`` seconds, and
    further apart when a tick's writes take long: live text takes at most ``share`` of the
    loop's time (a tick's writes to a thousand clients take tens of milliseconds; at 20 ms
    a tick they would take all of it, and the durable events' writes would wait for the CPU).
    """

    def __init__(self, linger: float = LINGER, share: float = TEXT_SHARE) -> None:
        self.linger = linger
        self.share = share
        self._due: list[Outbox] = []
        self._timer: asyncio.TimerHandle | None = None
        self._rest_until = 0.0  # time.monotonic() before which no tick starts
        self._ticked = 0.0

    def later(self, outbox: Outbox) -> None:
        """Wake ``outbox`` at the next tick."""
        self._due.append(outbox)
        if self._timer is None:
            delay = max(self.linger, self._rest_until - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        due, self._due = self._due, []
        for outbox in due:
            outbox.wake()
        # The writes the tick woke run at the loop's next turn: measure them from here to
        # then (one callback after them all, as the loop is FIFO).
        self._ticked = time.monotonic()
        asyncio.get_running_loop().call_soon(self._measured)

    def _measured(self) -> None:
        end = time.monotonic()
        self._rest_until = end + (end - self._ticked) * (1 / self.share - 1)


class Outbox:
    """The frames waiting for one SSE client, bounded: ``async for chunk in outbox`` (what
    its :class:`EventStream` writes) gives what has queued as one chunk, as soon as
    something urgent is queued.

    Args:
        limit: the most bytes that may wait behind a write in progress; a frame that comes
            while more than that waits cuts the client off (:attr:`overflowed`): its
            stream ends. A pumped outbox (:meth:`pump`) holds its pump back instead.
        ping: seconds between keep-alive comments once the writing started (0: none).
        pacer: the host's :class:`Pacer` (one of its own when left out). Non-urgent frames
            (``put(…, urgent=False)``) wait for its tick or for the next urgent frame.
        sep: the line separator of the keep-alive comments.
    """

    def __init__(self, limit: int = MAX_BACKLOG, ping: float = 0,
                 pacer: Pacer | None = None, sep: str = "\r\n") -> None:
        self.limit = limit
        self.ping = ping
        self.sep = sep
        self._pacer = pacer if pacer is not None else Pacer()
        self.overflowed = False
        """Whether the client was cut off for not reading."""
        self._frames: list[bytes] = []
        self._size = 0
        self._urgent = False
        self._paced = False
        self._ended = False
        self._writing = False
        self._started = False
        self._wake: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._pump: asyncio.Task[None] | None = None

    @property
    def ended(self) -> bool:
        """Whether nothing more will be queued (the stream ends once the queue is written)."""
        return self._ended

    def put(self, frame: bytes, urgent: bool = True) -> None:
        """Queue ``frame`` (written at once if ``urgent``, else at the pacer's next tick or
        with the next urgent frame); cut the client off if it is over its limit."""
        if self._ended:
            return
        if self._writing and self._size > self.limit and self._pump is None:
            # Checked before adding, so that one event larger than the limit (a big tool
            # result) still reaches a client that reads.
            self.overflowed = True
            self._frames.clear()
            self._size = 0
            self.end()
            return
        self._size += len(frame)
        self._frames.append(frame)
        if urgent:
            self._urgent = True
            self.wake()
        elif not self._paced:
            self._paced = True
            self._pacer.later(self)

    def end(self) -> None:
        """Queue nothing more: the stream ends after what is queued."""
        if self._ended:
            return
        self._ended = True
        if self._timer is not None:
            self._timer.cancel()
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
        self._free()
        self.wake()

    def pump(self, frames: AsyncIterable[bytes]) -> None:
        """Queue ``frames`` as they come, then end; reading them waits while more than
        ``limit`` bytes wait behind a held-up write (a slow client slows the reading, it
        is not cut off). Ending the outbox stops the reading."""
        async def run() -> None:
            try:
                async for frame in frames:
                    self.put(frame)
                    while self._writing and self._size > self.limit and not self._ended:
                        self._room = asyncio.get_running_loop().create_future()
                        await self._room
            except Exception:  # the stream ends where its source failed; the log says why
                log.exception("an event stream's source failed")
            finally:
                self.end()

        self._pump = asyncio.ensure_future(run())

    def wake(self) -> None:
        """Let the writer take what is queued (the pacer's tick; an urgent frame)."""
        self._paced = False
        if self._frames:
            self._urgent = True
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _free(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def __aiter__(self) -> Outbox:
        return self

    async def __anext__(self) -> bytes:
        self._writing = False  # the previous chunk is written: the writer asks again
        self._free()
        if not self._started:
            self._started = True
            if self.ping > 0 and not self._ended:
                self._timer = asyncio.get_running_loop().call_later(self.ping,
                                                                    self._keepalive)
        while not ((self._frames and (self._urgent or self._ended)) or self._ended):
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
        if not self._frames:
            raise StopAsyncIteration
        chunk = b"".join(self._frames)
        self._frames.clear()
        self._size = 0
        self._urgent = False
        self._writing = True
        return chunk

    def _keepalive(self) -> None:
        self.put(ServerSentEvent(comment=f"ping - {datetime.now(UTC)}", sep=self.sep).encode())
        if not self._ended:
            self._timer = asyncio.get_running_loop().call_later(self.ping, self._keepalive)


class EventStream(StreamingResponse):
    """The host's ``text/event-stream`` response: Starlette's ``StreamingResponse`` writing
    an :class:`Outbox`. When it ends (written out, cut off, the client gone or the server
    shutting down) the outbox is ended and ``close`` called."""

    media_type = "text/event-stream"

    def __init__(self, outbox: Outbox, close: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(outbox, headers={**HEADERS, **(headers or {})})
        self.outbox = outbox
        self.close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.outbox.end()
            self.close()


class Streams:
    """A host's event streams: each one's outbox (its limit, keep-alive and pacer), its
    response, and the open ones, so that a shutdown can end them all.

    Args:
        ping: seconds between keep-alive comments on an idle stream.
        limit: bytes an outbox may hold behind a held-up write.
    """

    def __init__(self, ping: float = 0, limit: int = MAX_BACKLOG) -> None:
        self.ping = ping
        self.limit = limit
        self.pacer = Pacer()
        self._open: set[Outbox] = set()

    def outbox(self, sep: str = "\r\n") -> Outbox:
        """A new client's outbox."""
        return Outbox(self.limit, self.ping, self.pacer, sep)

    def response(self, outbox: Outbox, close: Callable[[], None] | None = None,
                 headers: dict[str, str] | None = None) -> EventStream:
        """The ``text/event-stream`` response that writes ``outbox``; ``close`` is called
        when it ends."""
        self._open.add(outbox)

        def closed() -> None:
            self._open.discard(outbox)
            if close is not None:
                close()

        return EventStream(outbox, closed, headers)

    def of(self, frames: AsyncIterable[bytes], close: Callable[[], None] | None = None,
           headers: dict[str, str] | None = None, sep: str = "\r\n") -> EventStream:
        """The response that writes ``frames`` (each one SSE frame) as they come."""
        outbox = self.outbox(sep)
        outbox.pump(frames)
        return self.response(outbox, close, headers)

    def end_all(self) -> None:
        """End every open stream (after what is queued); a client of ``GET …/events``
        reconnects with its ``Last-Event-ID``. Call it on the event loop."""
        for outbox in list(self._open):
            outbox.end()


__all__ = [
    "FRAME_CACHE",
    "HEADERS",
    "MAX_BACKLOG",
    "EventStream",
    "FrameCache",
    "Outbox",
    "Pacer",
    "Streams",
]
