"""The PostgreSQL store's wake-ups: ``NOTIFY`` in every transaction that changes a session,
``LISTEN`` on one connection while anyone subscribes or watches.

A payload is JSON, ``{"from": store, "changes": [[agent, session, seq], ...]}`` (``seq`` the
newest event committed, ``null`` for a change of the chain: a new turn, a resume, a cancel),
never any content. The listening connection skips its own store's notifications (published
already), coalesces what arrives together (one re-read per session, none when its
subscribers already have that seq) and tells the feed; it also re-reads every
``poll_interval`` seconds and after a reconnect, so a lost notification is only a delay.
Workers wake only on chain changes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import psycopg

from ..records import SessionKey
from .feed import Feed

CHANNEL = "durable_turns"
"""The NOTIFY channel; a payload is
``{"from": origin, "changes": [[agent, session, seq], ...]}``."""
LISTENER_NAME = "durable_turns listener"
"""The ``application_name`` of a store's listening connection (in ``pg_stat_activity``)."""
_NOTIFY_LIMIT = 7900  # PostgreSQL refuses payloads of 8000 bytes or more
_NOTIFY = "SELECT pg_notify(%s, %s)"

log = logging.getLogger("durable_turns")

Changes = list[tuple[SessionKey, int | None]]


def payload(origin: str, changes: Changes) -> str:
    """A notification's payload: ``{"from": origin, "changes": [[agent, session, seq], ...]}``;
    without ``changes`` (anything may have changed) when they would not fit PostgreSQL's
    payload limit."""
    text = json.dumps({"from": origin,
                       "changes": [[k.agent, k.session, seq] for k, seq in changes]})
    return text if len(text.encode()) < _NOTIFY_LIMIT else json.dumps({"from": origin})


def notify(c: psycopg.Connection[Any], origin: str, key: SessionKey, seq: int | None) -> None:
    """In the caller's transaction: tell every listener that ``key`` changed."""
    c.execute(_NOTIFY, (CHANNEL, payload(origin, [(key, seq)])))


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


async def listen(feed: Feed, dsn: str, connect_args: dict[str, Any], origin: str,
                 poll_interval: float, is_open: Callable[[], bool]) -> None:
    """Tell ``feed`` of other connections' commits while it is active and ``is_open()``;
    reconnects with a backoff when the connection is lost."""
    pause = 0.05
    while feed.active and is_open():
        try:
            conn = await psycopg.AsyncConnection.connect(
                dsn, **connect_args, application_name=LISTENER_NAME)
        except psycopg.Error as e:
            log.warning("cannot listen for notifications (retrying): %s", e)
            feed.changed_any()  # meanwhile, the re-poll
            await asyncio.sleep(pause)
            pause = min(pause * 2, poll_interval)
            continue
        try:
            async with conn:
                await conn.execute(f"LISTEN {CHANNEL}")
                pause = 0.05
                # Listening now: what committed before it (or while the connection was
                # down) is read once, by everyone.
                feed.changed_any()
                while feed.active:
                    batch = _Batch(feed, origin)
                    async for n in conn.notifies(timeout=poll_interval):
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
