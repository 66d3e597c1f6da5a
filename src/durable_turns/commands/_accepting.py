"""The part of accepting an entry that acts at once: what a superseding entry (a turn sent
with ``replace``, a reset) does to the entries before it before it queues behind them (F7).

A queued entry's write may wait behind a running step (a local tool's step holds a
one-writer store's write lock until the tool ends); its cancel of the turns before it must
not. So before the entry is enqueued, each queued or running entry before it gets its
cancel as a signal of its own (``SessionStore.request_cancel``, which never waits), and the
running turn stops at its next boundary whatever the entry's own write waits for. The
enqueue then sets the same cancel in its transaction, for what came meanwhile.
"""

from __future__ import annotations

from ..errors import TurnConflictError
from ..records import ChainEntry, NewEntry, SessionKey
from ..stores import SessionStore

__all__ = ["check_redelivery", "supersede_at_once"]


def check_redelivery(key: SessionKey, rec: ChainEntry, entry: NewEntry) -> None:
    """A redelivered turn id must repeat its turn's opening.

    Raises:
        TurnConflictError: ``rec``, stored under ``entry``'s id, was opened with other text
            (or is a command).
    """
    if entry.kind != "turn" or entry.opening is None:
        return
    if rec.opening is not None and (rec.opening.role, rec.opening.text) == (
            entry.opening.role, entry.opening.text):
        return
    before = rec.opening.text[:60] if rec.opening is not None else rec.kind
    raise TurnConflictError(
        f"session {key} already has a {rec.kind} {entry.turn_id!r} opened with other "
        f"text ({before!r}); a redelivery must repeat it, a new turn needs a new id",
        session=str(key), turn_id=entry.turn_id)


async def supersede_at_once(store: SessionStore, key: SessionKey, entry: NewEntry) -> list[str]:
    """Cancel, at once, the queued and running entries ``entry`` supersedes.

    Nothing for an entry that supersedes nothing, for a redelivered id (it superseded when
    first accepted), or while a turn is parked (the store decides whether the entry is
    accepted at all; nothing runs meanwhile).

    Returns:
        The ids of the entries that got the cancel.
    """
    reason = entry.supersede
    if reason is None or await store.entries(key, turn_id=entry.turn_id):
        return []
    pending = await store.entries(key, unfinished=True)
    if not pending or any(t.parked for t in pending):
        return []
    # Nothing parked: every unfinished entry is queued or running, and one request reaches
    # them all at once (one by one, the driver could open the next before its cancel).
    return await store.request_cancel(key, None, reason)
