"""Live events across processes (part of the public store kit): how the text a turn streams in
one process reaches the subscribers of its session in the others.

A live event (``message.delta``, ``message.thinking``, ``message.retry``, ``action.retry``) is
never stored. The store offers it to this process's subscribers at once (``Feed.live``); where
the store is shared by processes, its dialect also brings a :class:`LiveWire` (PostgreSQL:
``NOTIFY`` on the channel ``durable_turns_live``; SQLite: datagrams between the processes of
one machine), and the store's :class:`LiveRelay` carries the events over it:

- **coalesced**: the events a process publishes within ``interval`` (5 ms) go out together,
  as few frames as fit the wire's size limit (PostgreSQL's ``NOTIFY`` payloads stop short of
  8,000 bytes), one send at a time; consecutive text of one turn after one durable event is
  merged into one delta;
- **bounded**: at most ``max_pending`` bytes wait for the wire; past that, new live events are
  dropped and counted. Publishing never blocks a turn, never raises;
- **ahead of the step that follows**: a step that commits durable events of a session first
  takes that session's live events still waiting (:meth:`LiveRelay.take`) and sends them
  before its own change is told (PostgreSQL: in the step's own transaction, ahead of its
  ``NOTIFY``; SQLite: at once), so a model that streams faster than ``interval`` still has
  its text reach other processes before the ``message.completed`` that ends it;
- **received** in order from each sender, its own frames skipped, each event offered to the
  feed, which slots it after the durable event whose ``seq`` it carries.

A lost or late live event never corrupts a stream: a subscriber drops one whose durable
successor it has handed over already, and the stored ``message.completed`` carries the whole
text (what a client keeps).

A frame is JSON, ``{"from": origin, "live": [[agent, session, turn_id, seq, type, fields],
…]}``, ``fields`` being the event's own (:meth:`TurnEvent.payload`) and ``at``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..events import TurnEvent, event_from_fields
from ..records import SessionKey

__all__ = ["INTERVAL", "MAX_PENDING", "MERGED", "LiveRelay", "LiveWire", "decode_frame"]

log = logging.getLogger("durable_turns")

INTERVAL = 0.005
"""Seconds a relay gathers live events before it sends them (at most one send in flight)."""
MAX_PENDING = 1 << 20
"""Bytes of live events a relay lets wait for its wire before it drops new ones."""
MERGED = frozenset({"message.delta", "message.thinking"})
"""The live events whose consecutive pieces (one turn, one durable ``seq``) are sent as one."""
_MERGE_LIMIT = 2000  # characters of one merged piece: a frame holds several turns' text
_ITEM_OVERHEAD = 96  # what an item costs beside its text (ids, type, time), roughly


class LiveWire(Protocol):
    """What carries a store's live events between the processes that share its storage; a
    dialect brings one (``Dialect.live``). Frames are ASCII JSON text (see the module)."""

    @property
    def limit(self) -> int:
        """The largest frame it carries, in bytes."""
        ...

    @property
    def transactional(self) -> bool:
        """Whether frames can ride in a write's transaction: then ``Dialect.notify`` sends
        a step's frames ahead of its change, else the step sends them itself first."""
        ...

    @property
    def origin(self) -> str:
        """This store's name in the frames it sends (unique among the processes sharing the
        storage): a frame of its own that comes back is skipped."""
        ...

    def peers(self) -> bool:
        """Whether any other process may take live events now. Called for every live event a
        turn makes (the engine makes none when nobody takes them): it must be cheap."""
        ...

    async def send(self, frames: list[str]) -> None:
        """Send frames to every other process, in order. Never waits long for a slow
        receiver (a frame one cannot take is dropped for it).

        Raises:
            Exception: the frames could not be sent (they are dropped).
        """
        ...

    def on_frame(self, receive: Callable[[str], None]) -> None:
        """Hand every frame received from another process to ``receive`` (on the loop)."""
        ...


def encode_item(event: TurnEvent) -> list[Any]:
    """A live event as a frame's item: ``[agent, session, turn_id, seq, type, fields]``."""
    return [event.agent, event.session, event.turn_id, event.seq, event.type,
            {**event.payload(), "at": event.at}]


def decode_frame(frame: str) -> tuple[str | None, list[TurnEvent]]:
    """A frame's sender and its events (what cannot be read of it is left out).

    Args:
        frame: the frame's text.

    Returns:
        ``(origin, events)``; ``(None, [])`` for a frame that is not one.
    """
    try:
        data = json.loads(frame)
        items = data["live"]
        origin = str(data["from"])
    except (ValueError, TypeError, KeyError):
        return None, []
    events = []
    for item in items:
        try:
            agent, session, turn_id, seq, type_, fields = item
            events.append(event_from_fields(str(agent), str(session), int(seq), str(turn_id),
                                            str(type_), dict(fields)))
        except (ValueError, TypeError, KeyError):
            continue  # a kind this version does not know: the durable events carry on
    return origin, events


class LiveRelay:
    """Carries one store's live events over its dialect's wire; see the module docstring.

    Args:
        wire: the dialect's wire.
        deliver: takes each live event received from another process (``Feed.live``).
        interval: seconds live events are gathered before they are sent.
        max_pending: bytes that may wait for the wire before new live events are dropped.
    """

    def __init__(self, wire: LiveWire, deliver: Callable[[SessionKey, TurnEvent], None], *,
                 interval: float = INTERVAL, max_pending: int = MAX_PENDING) -> None:
        self.wire = wire
        self.origin = origin = wire.origin
        self.interval = interval
        self.max_pending = max_pending
        self.sent = 0
        """Frames sent so far."""
        self.dropped = 0
        """Live events dropped so far (the wire was slow or failing)."""
        self._deliver = deliver
        self._pending: list[list[Any]] = []
        self._bytes = 0
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sending: set[tuple[str, str]] = set()  # the sessions of the send in flight
        self._sent = asyncio.Event()  # set while no send is in flight
        self._sent.set()
        self._prefix = json.dumps({"from": origin, "live": []})[:-2]  # '{"from": …, "live": ['
        wire.on_frame(self.receive)

    @property
    def idle(self) -> bool:
        """Nothing waits and nothing is being sent (a step then has nothing to take)."""
        return not self._pending and not self._sending

    def wanted(self) -> bool:
        """Whether a live event may reach another process now (``LiveWire.peers``)."""
        return self.wire.peers()

    def put(self, event: TurnEvent) -> None:
        """Queue a live event for the other processes; never blocks, never raises."""
        size = len(getattr(event, "text", "")) + _ITEM_OVERHEAD
        if self._bytes + size > self.max_pending:
            self.dropped += 1
            return
        pending = self._pending
        if pending and event.type in MERGED:
            last = pending[-1]
            fields = last[5]
            if (last[4] == event.type and last[3] == event.seq and last[2] == event.turn_id
                    and last[1] == event.session and last[0] == event.agent
                    and fields.get("child") == event.child
                    and len(fields["text"]) < _MERGE_LIMIT):
                fields["text"] += event.text  # type: ignore[attr-defined]
                self._bytes += size - _ITEM_OVERHEAD
                return
        pending.append(encode_item(event))
        self._bytes += size
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._ready.set()

    async def take(self, key: SessionKey) -> list[str]:
        """The frames of ``key``'s live events still waiting, taken out of the queue, for a
        step of that session to send ahead of its change (once a send in flight that
        carries some of them is done, so theirs stay in order)."""
        session = (key.agent, key.session)
        while session in self._sending:
            await self._sent.wait()
        pending = self._pending
        if not pending:
            return []
        mine = [i for i in pending if i[0] == key.agent and i[1] == key.session]
        if not mine:
            return []
        self._pending = [i for i in pending if i[0] != key.agent or i[1] != key.session]
        self._bytes = sum(len(i[5].get("text", "")) + _ITEM_OVERHEAD for i in self._pending)
        return self.frames(mine)

    def receive(self, frame: str) -> None:
        """Offer the events of a frame from another process (``LiveWire.on_frame``)."""
        origin, events = decode_frame(frame)
        if origin is None or origin == self.origin:
            return
        for e in events:
            self._deliver(SessionKey(e.agent, e.session), e)

    async def close(self) -> None:
        """Stop sending (what waits is dropped)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._pending, self._bytes = [], 0

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            # Not a wait for a condition: the window in which a turn's pieces gather.
            await asyncio.sleep(self.interval)
            batch, self._pending, self._bytes = self._pending, [], 0
            self._ready.clear()
            if not batch:
                continue
            frames = self.frames(batch)
            self._sending = {(i[0], i[1]) for i in batch}
            self._sent.clear()
            try:
                await self.wire.send(frames)
            except Exception as e:  # live text is best effort: the durable events carry on
                self.dropped += len(batch)
                log.debug("live events not sent (%d dropped): %s", len(batch), e)
            else:
                self.sent += len(frames)
            finally:
                self._sending = set()
                self._sent.set()

    def frames(self, items: list[list[Any]]) -> list[str]:
        """``items`` as few frames as fit the wire's limit (an item too large alone for one
        is dropped)."""
        limit, prefix = self.wire.limit, self._prefix
        out: list[str] = []
        parts: list[str] = []
        size = len(prefix) + 2
        for item in items:
            text = json.dumps(item, separators=(",", ":"))  # ASCII: a byte per character
            if len(prefix) + 2 + len(text) > limit:
                self.dropped += 1
                continue
            if parts and size + 1 + len(text) > limit:
                out.append(f"{prefix}{','.join(parts)}]}}")
                parts, size = [], len(prefix) + 2
            parts.append(text)
            size += len(text) + (1 if len(parts) > 1 else 0)
        if parts:
            out.append(f"{prefix}{','.join(parts)}]}}")
        return out
