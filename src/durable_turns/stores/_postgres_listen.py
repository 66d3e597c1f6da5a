"""The PostgreSQL store's wake-ups and live events: ``NOTIFY`` in every transaction that
changes a session, ``LISTEN`` on one connection while anyone subscribes or watches; live
events (``message.delta``…) as frames on a channel of their own (:class:`NotifyWire`).

A payload is JSON, ``{"from": store, "changes": [[agent, session, seq], ...]}`` (``seq`` the
newest event committed, ``null`` for a change of the chain: a new turn, a resume, a cancel),
never any content. The listening connection skips its own store's notifications (published
already), coalesces what arrives together (one re-read per session, none when its
subscribers already have that seq) and tells the feed; it also re-reads every
``poll_interval`` seconds and after a reconnect, so a lost notification is only a delay.
Workers wake only on chain changes.

Live events travel on the channel ``durable_turns_live`` (``LIVE_CHANNEL``): the store's
``LiveRelay`` (``stores.live``) hands :class:`NotifyWire` frames of at most 7,900 bytes, which
it sends from a connection of its own (``application_name`` ``durable_turns live``, with
``synchronous_commit`` off: a frame needs no durability, and a NOTIFY's commit would otherwise
wait for a WAL flush), several frames in one statement; the listening connection listens on
both channels and hands live frames to the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from ..records import SessionKey
from ._feed import Feed

CHANNEL = "durable_turns"
"""The NOTIFY channel; a payload is
``{"from": origin, "changes": [[agent, session, seq], ...]}``."""
LISTENER_NAME = "durable_turns listener"
"""The ``application_name`` of a store's listening connection (in ``pg_stat_activity``)."""
LIVE_CHANNEL = "durable_turns_live"
"""The NOTIFY channel of live events' frames (``stores.live``)."""
LIVE_NAME = "durable_turns live"
"""The ``application_name`` of the connection that sends a store's live frames."""
_NOTIFY_LIMIT = 7900  # PostgreSQL refuses payloads of 8000 bytes or more
_NOTIFY = "SELECT pg_notify(%s, %s)"
_LIVE_RETRY = 1.0  # seconds a wire that failed to connect sends nothing (frames dropped)
RECONNECT_PAUSE = 0.25
"""The longest pause between the listener's attempts to reconnect: a refused connect costs
little, and its first success wakes every worker and subscriber (the database is back)."""
LINGER = 10.0
"""Seconds the listening connection stays after the last subscriber or watcher left."""

log = logging.getLogger("durable_turns")

Changes = list[tuple[SessionKey, int | None]]


def payload(origin: str, changes: Changes) -> str:
    """A notification's payload: ``{"from": origin, "changes": [[agent, session, seq], ...]}``;
    without ``changes`` (anything may have changed) when they would not fit PostgreSQL's
    payload limit."""
    text = json.dumps({"from": origin,
                       "changes": [[k.agent, k.session, seq] for k, seq in changes]})
    return text if len(text.encode()) < _NOTIFY_LIMIT else json.dumps({"from": origin})


def notify(c: psycopg.Connection[Any], origin: str, key: SessionKey, seq: int | None,
           live: Sequence[str] = ()) -> None:
    """In the caller's transaction: tell every listener that ``key`` changed, after the frames
    of its live events ``live`` (one statement: notifications of one transaction arrive in
    the order they were made)."""
    if not live:
        c.execute(_NOTIFY, (CHANNEL, payload(origin, [(key, seq)])))
        return
    params = [x for frame in live for x in (LIVE_CHANNEL, frame)]
    c.execute("SELECT " + ", ".join(["pg_notify(%s, %s)"] * (len(live) + 1)),
              (*params, CHANNEL, payload(origin, [(key, seq)])))


def parse_payload(text: str) -> tuple[str | None, Changes | None]:
    """Who sent a payload and the changes it names; ``None`` changes for "anything may have
    changed" (none named, or a payload this version cannot read)."""
    try:
        data = json.loads(text)
        if isinstance(data, list):  # [agent, session, seq], as the first version sent it
            data = {"changes": [data]}
        origin = data.get("from")
        out = [(SessionKey(str(a), str(s)), None if q is None else int(q))
               for a, s, q in data.get("changes") or ()]
    except (ValueError, TypeError, AttributeError):
        return None, None
    return (None if origin is None else str(origin)), (out or None)


class NotifyWire:
    """PostgreSQL's ``LiveWire``: frames of live events as notifications on
    :data:`LIVE_CHANNEL`, sent from a connection of its own (see the module docstring).

    Args:
        dsn: the store's DSN.
        connect_args: the store's connection arguments.
        origin: the store's name in its payloads.
    """

    limit = _NOTIFY_LIMIT
    transactional = True

    def __init__(self, dsn: str, connect_args: dict[str, Any], origin: str) -> None:
        self.origin = origin
        self._dsn = dsn
        self._connect_args = connect_args
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._receive: Callable[[str], None] | None = None
        self._quiet_until = 0.0

    def peers(self) -> bool:
        """``LiveWire.peers``: other processes may always listen on a database server."""
        return True

    def on_frame(self, receive: Callable[[str], None]) -> None:
        """``LiveWire.on_frame``."""
        self._receive = receive

    def received(self, payload: str) -> None:
        """A notification of :data:`LIVE_CHANNEL` (the listener hands it over)."""
        if self._receive is not None:
            self._receive(payload)

    async def send(self, frames: list[str]) -> None:
        """``LiveWire.send``: every frame in one statement (one round trip, one commit).

        Raises:
            psycopg.Error: the database is away (the frames are dropped; for a second after
                a failed connect, nothing is tried).
        """
        conn = self._conn
        if conn is None or conn.closed:
            if time.monotonic() < self._quiet_until:
                raise psycopg.OperationalError("the live connection is down")
            try:
                conn = self._conn = await psycopg.AsyncConnection.connect(
                    self._dsn, **self._connect_args, application_name=LIVE_NAME)
                await conn.execute("SET synchronous_commit = off")
            except psycopg.Error:
                self._quiet_until = time.monotonic() + _LIVE_RETRY
                await self.close()
                raise
        params = [x for frame in frames for x in (LIVE_CHANNEL, frame)]
        try:
            await conn.execute("SELECT " + ", ".join(["pg_notify(%s, %s)"] * len(frames)),
                               params)
        except psycopg.Error:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the sending connection (the next send opens another)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):  # it is gone either way
                await conn.close()


async def listen(feed: Feed, dsn: str, connect_args: dict[str, Any], origin: str,
                 poll_interval: float, is_open: Callable[[], bool],
                 wire: NotifyWire | None = None) -> None:
    """Tell ``feed`` of other connections' commits while it is active (and ``LINGER`` seconds
    after) and ``is_open()``, and hand ``wire`` the live frames that come meanwhile;
    reconnects with a backoff when the connection is lost."""
    loop = asyncio.get_running_loop()
    idle_since = loop.time()

    def wanted() -> bool:
        # Subscribers come and go (a request each): a listener that stayed a moment is
        # listening already when the next one comes, and misses none of its live text.
        nonlocal idle_since
        if feed.active:
            idle_since = loop.time()
            return True
        return loop.time() - idle_since < LINGER

    pause = 0.05
    said = -LINGER * 3
    while wanted() and is_open():
        try:
            conn = await psycopg.AsyncConnection.connect(
                dsn, **connect_args, application_name=LISTENER_NAME)
        except psycopg.Error as e:
            if loop.time() - said > LINGER * 3:  # said once in a while, not at every try
                log.warning("cannot listen for notifications (retrying): %s", e)
                said = loop.time()
            feed.changed_any()  # meanwhile, the re-poll
            await asyncio.sleep(pause)
            pause = min(pause * 2, poll_interval, RECONNECT_PAUSE)
            continue
        try:
            async with conn:
                await conn.execute(f"LISTEN {CHANNEL}")
                if wire is not None:
                    await conn.execute(f"LISTEN {LIVE_CHANNEL}")
                pause = 0.05
                # Listening now: what committed before it (or while the connection was
                # down) is read once, by everyone.
                feed.changed_any()
                while wanted():
                    batch = _Batch(feed, origin)
                    async for n in conn.notifies(timeout=poll_interval):
                        if n.channel == LIVE_CHANNEL:
                            if wire is not None:
                                wire.received(n.payload)
                            continue
                        batch.add(n.payload)
                    batch.flush()
                    feed.changed_any()  # the periodic re-read
        except psycopg.Error as e:
            log.warning("lost the notification connection (reconnecting): %s", e)


class _Batch:
    """Notifications that arrive together, told to the feed once per session: the listener
    adds each as it comes and the feed hears of them when the event loop next runs (after
    the whole burst psycopg read), with the newest seq per session."""

    def __init__(self, feed: Feed, origin: str) -> None:
        self._feed = feed
        self._origin = origin
        self._changes: dict[SessionKey, int | None] = {}
        self._anything = False
        self._scheduled = False

    def add(self, text: str) -> None:
        origin, changes = parse_payload(text)
        if origin == self._origin:
            return  # this store's own commit: published already
        if changes is None:
            self._anything = True
        else:
            for key, seq in changes:
                if key in self._changes:
                    old = self._changes[key]
                    # A chain change (None) outranks events: workers must hear of it.
                    seq = None if old is None or seq is None else max(old, seq)
                self._changes[key] = seq
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        changes, self._changes = self._changes, {}
        anything, self._anything = self._anything, False
        if anything:
            self._feed.changed_any()
            return
        for key, seq in changes.items():
            self._feed.changed(key, seq)
