"""What hosts read across sessions: an agent's sessions, its inbox, where a turn is, owed
deliveries.

The server, the console, the CLI and the channels read through :class:`Queries` (one per
runtime: ``runtime.queries``) and :class:`~durable_turns.AgentSession` (one session's
reads), never through the store itself, so what a host may see is this module's to say.
"""

from __future__ import annotations

from collections.abc import Callable

from .records import ChainEntry, SessionKey, SessionSummary, Visibility
from .stores import SessionStore

Check = Callable[[], None]


class Queries:
    """Reads across sessions, for hosts.

    Args:
        store: the store read.
        check: raises before a read when the store may not be read
            (``Runtime.require_open``: the runtime is not open).
    """

    def __init__(self, store: SessionStore, check: Check) -> None:
        self._store = store
        self._check = check

    async def sessions(self, agent: str, *,
                       visible: Visibility | None = None) -> list[SessionSummary]:
        """Every session of ``agent`` the store has (only those ``visible`` shows, if given),
        newest first, each with its status, generation, owner and the request it is parked
        on."""
        self._check()
        return await self._store.session_summaries(agent, visible=visible)

    async def inbox(self, agent: str, *,
                    visible: Visibility | None = None) -> list[SessionSummary]:
        """The sessions of ``agent`` parked on a request someone may answer (an operator's
        inbox; only those ``visible`` shows, if given), newest first."""
        self._check()
        return await self._store.session_summaries(agent, parked_only=True, visible=visible)

    async def own(self, key: SessionKey, owner: str) -> str | None:
        """Make ``owner`` the owner of a session the store does not have yet; returns the
        session's owner, whoever it is (``None``: it exists without one). See
        ``SessionQueries.own_session``."""
        self._check()
        return await self._store.own_session(key, owner)

    async def agents(self) -> list[str]:
        """The agents the store has sessions of, by name."""
        self._check()
        return sorted({k.agent for k in await self._store.find_sessions()})

    async def find_turn(self, turn_id: str) -> list[SessionKey]:
        """The sessions that have a turn of this id."""
        self._check()
        return await self._store.find_sessions(turn_id=turn_id)

    async def owed_deliveries(self, channel: str,
                              agent: str | None = None) -> list[tuple[SessionKey, ChainEntry]]:
        """The turns accepted with ``deliver=channel`` whose delivery the channel has not
        settled (of ``agent`` only, if given), in the order they were accepted, whatever
        their status (a channel follows a running one and delivers an ended one): the
        channel's durable outbox, what it recovers after a restart."""
        self._check()
        return [(key, rec) for key, rec in await self._store.owed_deliveries(channel)
                if agent is None or key.agent == agent]


async def summary_of(store: SessionStore, key: SessionKey) -> SessionSummary:
    """One session's summary (``exists=False`` for a session the store does not have)."""
    info = await store.session_info(key)
    if info is None:
        return SessionSummary(key, exists=False)
    pending = None
    for t in await store.entries(key, unfinished=True):
        if t.parked and t.request is not None:
            pending = t.request
            break
    return SessionSummary(key, info.status, info.generation, pending, owner=info.owner)


__all__ = ["Check", "Queries", "summary_of"]
