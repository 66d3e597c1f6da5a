"""The runtime's sessions as a remote tool reaches them (``ctx.services.sessions``).

Each call goes through its step's guard (``CallServices.guard`` in ``_tool_steps.py``), which
keeps a runtime failure it meets: a store failure abandons the step, whatever the tool made
of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Protocol, TypeVar

from ..context import Sessions, Watcher
from ..events import TurnEvent
from ..inbound import InboundEvent
from ..records import ChainEntry, SessionKey, TurnResult

T = TypeVar("T")


class Guard(Protocol):
    """What keeps the runtime failure a tool's call on its context met."""

    async def guard(self, running: Awaitable[T]) -> T: ...


class GuardedSessions:
    """The runtime's sessions as a remote tool reaches them (``ctx.services.sessions``): each call
    goes through :meth:`CallServices.guard`, so a store failure it meets abandons the step."""

    def __init__(self, sessions: Sessions, services: Guard) -> None:
        self._h = sessions
        self._s = services

    def agent_names(self) -> Collection[str]:
        return self._h.agent_names()

    async def start(self, key: SessionKey, text: str, *, turn_id: str,
                    event: InboundEvent | None = None, deliver: str | None = None,
                    parent: SessionKey | None = None) -> None:
        await self._s.guard(self._h.start(key, text, turn_id=turn_id, event=event,
                                          deliver=deliver, parent=parent))

    async def wait(self, key: SessionKey, turn_id: str, *,
                   timeout: float | None = None) -> TurnResult:
        return await self._s.guard(self._h.wait(key, turn_id, timeout=timeout))

    async def interrupt(self, key: SessionKey, turn_id: str, *, reason: str) -> list[str]:
        return await self._s.guard(self._h.interrupt(key, turn_id, reason=reason))

    async def reset(self, key: SessionKey, entry_id: str) -> None:
        await self._s.guard(self._h.reset(key, entry_id))

    async def entry(self, key: SessionKey, turn_id: str) -> ChainEntry | None:
        return await self._s.guard(self._h.entry(key, turn_id))

    async def events(self, key: SessionKey, *, after_seq: int = 0,
                     turn_id: str | None = None) -> list[TurnEvent]:
        return await self._s.guard(self._h.events(key, after_seq=after_seq, turn_id=turn_id))

    def watch(self, key: SessionKey, watcher: Watcher) -> Callable[[], None]:
        return self._h.watch(key, watcher)

    def live(self, key: SessionKey, taker: Callable[[TurnEvent], None]) -> Callable[[], None]:
        return self._h.live(key, taker)


__all__ = ["Guard", "GuardedSessions"]
