"""The host's one event-stream writer, and the way from a session's events to many clients.

Every ``text/event-stream`` the host sends (``GET …/events``, a turn's stream from ``POST
…/turn`` and ``…/chat``, the AI SDK's and AG-UI's streams) is an :class:`EventStream`:
Starlette's ``StreamingResponse`` (its body raced against the client leaving, every write
through the app's ``send`` and so through its middleware) whose body an :class:`Outbox`
writes.

A session watched by a thousand clients hands every event to a thousand subscriptions of
the store's feed (one store read serves them all). What each client then costs is the
server's part of the fan-out, so it is kept small (``bench/sse.py`` measures it):

- :class:`FrameCache` encodes an event into its SSE frame (sse-starlette's
  ``ServerSentEvent``) once, for every client that gets the same event object;
- an :class:`Outbox` per client takes frames synchronously, as the feed delivers them (no
  task switch per event), and a :class:`Pacer` writes every outbox that has something
  urgent in one pass at the loop's next turn: a commit's events (several) are one write
  per client. Each write is the response's ``send``, run at once (:func:`start_eagerly`):
  to a client that reads it completes without suspending, so a pass costs no task switch
  per client (``StreamingResponse``'s own loop, a task woken per client and write, cost
  half as much again in ``bench/sse.py``); what remains per client is the send path and
  uvicorn's write to its socket.
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
from collections.abc import AsyncIterable, Awaitable, Callable, Generator
from datetime import UTC, datetime
from typing import Any

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
    """Writes out a host's outboxes: those with urgent frames at the loop's next turn, those
    with live text only at its ticks.

    One callback a turn (and one timer) serves every client of the host, so a commit's
    events, queued for a thousand clients one by one, go out in one pass: one write per
    client. Ticks come every ``linger`` seconds, and further apart when a tick's writes
    take long: live text takes at most ``share`` of the loop's time (a tick's writes to a
    thousand clients take tens of milliseconds; at 20 ms a tick they would take all of it,
    and the durable events' writes would wait for the CPU).
    """

    def __init__(self, linger: float = LINGER, share: float = TEXT_SHARE) -> None:
        self.linger = linger
        self.share = share
        self._soon: list[Outbox] = []
        self._due: list[Outbox] = []
        self._timer: asyncio.TimerHandle | None = None
        self._rest_until = 0.0  # time.monotonic() before which no tick starts

    def soon(self, outbox: Outbox) -> None:
        """Write ``outbox`` out at the loop's next turn."""
        if not self._soon:
            asyncio.get_running_loop().call_soon(self._write_soon)
        self._soon.append(outbox)

    def later(self, outbox: Outbox) -> None:
        """Write ``outbox`` out at the next tick."""
        self._due.append(outbox)
        if self._timer is None:
            delay = max(self.linger, self._rest_until - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _write_soon(self) -> None:
        due, self._soon = self._soon, []
        for outbox in due:
            outbox.flush()

    def _tick(self) -> None:
        self._timer = None
        due, self._due = self._due, []
        start = time.monotonic()
        for outbox in due:
            outbox.flush()
        end = time.monotonic()
        self._rest_until = end + (end - start) * (1 / self.share - 1)


class Outbox:
    """The frames waiting for one SSE client, bounded, and their writes to it.

    Frames queue from :meth:`put` until :meth:`start` is given the client's ``send``; then
    whatever is queued goes out as one write per turn of the loop (see :class:`Pacer`), and
    only one write is in progress at a time.

    Args:
        limit: the most bytes that may wait behind a write in progress; a frame that comes
            while more than that waits cuts the client off (:attr:`overflowed`): its
            stream ends.
        ping: seconds between keep-alive comments once started (0: none).
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
        self.failed = False
        """Whether a write failed (the client is gone)."""
        self._frames: list[bytes] = []
        self._size = 0
        self._soon = False
        self._paced = False
        self._ended = False
        self._writing = False
        self._send: Send | None = None
        self._written: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._source: AsyncIterable[bytes] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._room: asyncio.Future[None] | None = None

    @property
    def ended(self) -> bool:
        """Whether nothing more will be queued (the stream ends once the queue is written)."""
        return self._ended

    def put(self, frame: bytes, urgent: bool = True) -> None:
        """Queue ``frame`` (written at the loop's next turn if ``urgent``, else at the
        pacer's next tick or with the next urgent frame); cut the client off if it is over
        its limit."""
        if self._ended:
            return
        if self._writing and self._size > self.limit and self._source is None:
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
            self._due_soon()
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
        self._make_room()
        if self._send is not None:
            self._due_soon()

    def pump(self, frames: AsyncIterable[bytes]) -> None:
        """Queue ``frames`` as they come, then end. Reading them waits while more than
        ``limit`` bytes wait behind a held-up write: a slow client slows the reading (as a
        plain ``StreamingResponse`` would), it is not cut off. The reading starts with the
        writing (:meth:`start`); ending the outbox stops it."""
        self._source = frames
        if self._send is not None:
            self._start_pump()

    def _start_pump(self) -> None:
        frames = self._source
        if frames is None or self._pump is not None or self._ended:
            return

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

    def _make_room(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def start(self, send: Send) -> asyncio.Future[None]:
        """Write to ``send`` (the response's ASGI ``send``, its headers sent) from now on,
        starting with what is queued (a replay).

        Returns:
            A future done once the outbox has ended and all it queued was written (or a
            write failed: the client is gone).
        """
        loop = asyncio.get_running_loop()
        self._send = send
        self._written = loop.create_future()
        if self.ping > 0 and not self._ended:
            self._timer = loop.call_later(self.ping, self._keepalive)
        self.flush()
        self._start_pump()
        return self._written

    def flush(self) -> None:
        """Write out what is queued now, unless a write is in progress (what is queued then
        follows it as soon as it is done)."""
        self._soon = self._paced = False
        send = self._send
        if send is None or self._writing:
            return
        if not self._frames:
            if self._ended:
                self._finish()
            return
        chunk = b"".join(self._frames)
        self._frames.clear()
        self._size = 0
        self._writing = True
        try:
            rest = start_eagerly(send({"type": "http.response.body", "body": chunk,
                                       "more_body": True}))
        except Exception:
            self._fail()
            return
        if rest is None:
            self._writing = False
            self._make_room()
            if self._ended and not self._frames:
                self._finish()
        else:
            rest.add_done_callback(self._held_up_write_done)

    def _due_soon(self) -> None:
        if not self._soon:
            self._soon = True
            self._pacer.soon(self)

    def _held_up_write_done(self, rest: asyncio.Future[None]) -> None:
        self._writing = False
        self._make_room()
        if rest.cancelled() or rest.exception() is not None:
            self._fail()
        else:
            self.flush()

    def _fail(self) -> None:
        # A write that raised: the client is gone; what is queued goes nowhere.
        self.failed = True
        self._frames.clear()
        self._size = 0
        self.end()
        self._finish()

    def _finish(self) -> None:
        if self._written is not None and not self._written.done():
            self._written.set_result(None)

    def _keepalive(self) -> None:
        self.put(ServerSentEvent(comment=f"ping - {datetime.now(UTC)}", sep=self.sep).encode())
        if not self._ended:
            self._timer = asyncio.get_running_loop().call_later(self.ping, self._keepalive)


def start_eagerly(awaitable: Awaitable[None]) -> asyncio.Future[None] | None:
    """Run ``awaitable`` now, up to its first suspension: ``None`` if it finished, else a
    task that runs the rest (what Python 3.12's ``eager_start`` tasks do, on 3.11 too).

    A write to a client that reads completes without suspending (uvicorn suspends only
    while the client's socket and buffer are full), so a fan-out costs no task switch per
    client and event; a held-up write becomes a task of its own, and no other client
    waits for it.

    Raises:
        What ``awaitable`` raises before its first suspension.
    """
    steps = awaitable.__await__()
    try:
        first = steps.send(None)
    except StopIteration:
        return None
    rest = asyncio.ensure_future(_Rest(steps, first))
    # A task cancelled before its first step never enters _Rest: close the awaitable then
    # (its ``finally`` blocks run); on a finished one, close() does nothing.
    rest.add_done_callback(lambda _rest: steps.close())
    return rest


class _Rest:
    """The rest of an awaitable started by :func:`start_eagerly`, for a task to await: hands
    the task what the awaitable yields (the futures it waits on) and the awaitable what the
    task sends or throws, as ``await`` itself would."""

    def __init__(self, steps: Generator[Any, Any, None], first: Any) -> None:
        self._steps = steps
        self._first = first

    def __await__(self) -> Generator[Any, None, None]:
        steps, out = self._steps, self._first
        while True:
            try:
                yield out
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as e:  # a cancellation, thrown into the task
                try:
                    out = steps.throw(e)
                except StopIteration:
                    return
                continue
            try:
                out = steps.send(None)
            except StopIteration:
                return


class EventStream(StreamingResponse):
    """The host's ``text/event-stream`` response: Starlette's ``StreamingResponse`` (its
    body raced against the client leaving, every message through the app's ``send`` and
    its middleware), its body written by an :class:`Outbox` as frames come. When it ends
    (written out, cut off, the client gone or the server shutting down) the outbox is
    ended and ``close`` called."""

    media_type = "text/event-stream"

    def __init__(self, outbox: Outbox, close: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        # Not StreamingResponse.__init__: the outbox, not an iterator, is the body.
        self.status_code = 200
        self.background = None
        self.outbox = outbox
        self.close = close
        self.init_headers({**HEADERS, **(headers or {})})

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        await self.outbox.start(send)
        if not self.outbox.failed:  # else the client is gone: nothing more to say to it
            await send({"type": "http.response.body", "body": b"", "more_body": False})

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
    "start_eagerly",
]
