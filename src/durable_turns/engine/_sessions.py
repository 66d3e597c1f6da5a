"""``Runtime.sessions``: the runtime's sessions as a tool step sees them (:class:`~durable_turns.
context.Sessions`), through the session API — what a subagent starts, follows and cancels."""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..commands import Reset
from ..context import Watcher
from ..events import TurnEvent
from ..inbound import InboundEvent
from ..records import ChainEntry, SessionKey, TurnResult
from ..sessions import RuntimeAPI


class RuntimeSessions:
    """The :class:`~durable_turns.context.Sessions` of a runtime.

    Args:
        runtime: the runtime whose sessions it reaches.
    """

    def __init__(self, runtime: RuntimeAPI) -> None:
        self._rt = runtime

    def agent_names(self) -> Collection[str]:
        return self._rt.agents.keys()

    async def start(self, key: SessionKey, text: str, *, turn_id: str,
                    event: InboundEvent | None = None, deliver: str | None = None,
                    parent: SessionKey | None = None) -> None:
        if parent is not None:
            # Before the child's first turn: its owner is the parent's, from the start (its
            # id is unpredictable, so no one else could have made it meanwhile).
            info = await self._rt.store.session_info(parent)
            if info is not None and info.owner is not None:
                await self._rt.store.own_session(key, info.owner)
        await self._rt.session(key.agent, key.session).start(text, turn_id=turn_id,
                                                             event=event, deliver=deliver)

    async def wait(self, key: SessionKey, turn_id: str, *,
                   timeout: float | None = None) -> TurnResult:
        return await self._rt.wait(key, turn_id, timeout=timeout)

    async def interrupt(self, key: SessionKey, turn_id: str, *, reason: str) -> list[str]:
        return await self._rt.interrupt(key, turn_id, reason=reason)

    async def reset(self, key: SessionKey, entry_id: str) -> None:
        await self._rt.accept(key, Reset(entry_id).entry())

    async def entry(self, key: SessionKey, turn_id: str) -> ChainEntry | None:
        return await self._rt.session(key.agent, key.session).entry(turn_id)

    async def events(self, key: SessionKey, *, after_seq: int = 0,
                     turn_id: str | None = None) -> list[TurnEvent]:
        self._rt.require_open()
        return await self._rt.store.read_events(key, after_seq=after_seq, turn_id=turn_id)

    def watch(self, key: SessionKey, watcher: Watcher) -> Callable[[], None]:
        return self._rt.store.watch(key, watcher)

    def live(self, key: SessionKey, taker: Callable[[TurnEvent], None]) -> Callable[[], None]:
        sub = self._rt.subscribe(key, None, deltas=True)  # from whichever process drives it

        def live_only(e: TurnEvent) -> None:
            if not e.durable:
                taker(e)

        sub.deliver_to(live_only)
        return sub.close


__all__ = ["RuntimeSessions"]
