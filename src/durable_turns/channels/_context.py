"""One agent mounted for a host: start, answer and reset its turns, and stream their events.

:func:`mount_agent` gives a :class:`ChannelContext`: start a turn and stream its events to
where it ends or parks, answer a parked turn and stream what follows, reset a session. The
HTTP host (``durable_turns.server``), the chat REPL and the channels are thin layers over
it; none drives a turn itself, so a turn goes on when its stream's reader leaves.

Built on the runtime's public API only: ``Runtime.subscribe`` (stored events after a cursor,
then live ones) and the :class:`~durable_turns.AgentSession` façade.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from .._hitl import Grant
from ..agent import Agent
from ..errors import ConfigurationError
from ..events import TurnEvent
from ..inbound import InboundEvent, Trigger
from ..records import TurnStatus
from ..runtime import Runtime
from ..sessions import AgentSession, Mode, ResetResult
from ..stores import Subscription


class ChannelContext:
    """One agent mounted on a runtime: what a channel calls to run, answer and reset turns.

    Args:
        agent: the agent (the runtime must have it, under its name).
        runtime: the runtime that accepts and drives its turns.
    """

    def __init__(self, agent: Agent, runtime: Runtime) -> None:
        if runtime.agents.get(agent.name) is not agent:
            raise ConfigurationError(
                f"agent {agent.name!r} is not this runtime's; pass it to Runtime([...]) first")
        self.agent = agent
        self.runtime = runtime

    def session(self, session: str) -> AgentSession:
        """The session ``session`` of this agent.

        Raises:
            ValueError: an empty session id.
        """
        return self.runtime.session(self.agent.name, session)

    async def open_turn(self, text: str, *, session: str, replace: bool = False,
                        event: InboundEvent | None = None, turn_id: str | None = None,
                        trigger: Trigger | None = None, deliver: str | None = None,
                        data: Mapping[str, Any] | None = None,
                        mode: Mode = "queue") -> TurnStream:
        """Start a turn and return its stream (for a host that must answer an error before
        it streams). The turn is durable when this returns; ``data``: names of its data set
        with it; ``mode``: as ``AgentSession.start``'s — a steer's stream is the stream of
        the turn it joins, from that turn's first event.

        Raises:
            SessionBusyError: the session is parked on another turn.
            TurnConflictError: ``turn_id`` was accepted with other text.
            ValueError: empty text or session id.
        """
        s = self.session(session)
        sub = self.runtime.subscribe(s.key)
        try:
            await sub.ready()
            started = await s.start(text, turn_id=turn_id, event=event, replace=replace,
                                    trigger=trigger, deliver=deliver, data=data, mode=mode)
            if started.steering is not None:
                sub.close()
                return await self.follow(started.steering, session=session)
            if not started.new:
                sub.close()
                return await self.follow(started.turn_id, session=session)
        except BaseException:
            sub.close()
            raise
        return TurnStream(s, started.turn_id, sub, fresh=started.new)

    async def follow(self, turn_id: str, *, session: str) -> TurnStream:
        """The stream of a turn the session has, from its first event: its logged events,
        then live ones, to its end or its next park (a client that reconnects to a turn).

        Live text of the model step that was under way when the stream joined may have begun
        before it: :attr:`TurnStream.joined` says up to which event.

        Raises:
            StoreError: the store could not be read.
        """
        s = self.session(session)
        logged = await s.events(turn_id=turn_id)
        # From just before the turn's first event: the session's earlier turns are not read.
        sub = self.runtime.subscribe(s.key, logged[0].seq - 1 if logged else 0)
        try:
            await sub.ready()
            # Read after the subscription is ready: text after a later durable event was
            # published while it listened.
            joined = max((e.seq for e in await s.events(turn_id=turn_id)), default=0)
        except BaseException:
            sub.close()
            raise
        return TurnStream(s, turn_id, sub, fresh=False, joined=joined)

    async def run_stream(self, text: str, *, session: str, replace: bool = False,
                         event: InboundEvent | None = None, turn_id: str | None = None,
                         trigger: Trigger | None = None,
                         deliver: str | None = None) -> AsyncIterator[TurnEvent]:
        """Start a turn and yield its events, ending with its terminal event or
        ``input.requested``. With ``trigger`` the turn is one nobody typed (F9): its opening
        message has role ``trigger``, attributed to ``trigger.by``. With ``deliver``, that
        channel owes the turn a delivery (``AgentSession.start``).

        The turn is durable before the first event is yielded, and it runs on when the
        caller stops reading. A redelivered ``turn_id`` yields the turn's logged events,
        then live ones, to the same end.

        Raises:
            SessionBusyError: the session is parked on another turn.
            TurnConflictError: ``turn_id`` was accepted with other text.
            ValueError: empty text or session id.
        """
        stream = await self.open_turn(text, session=session, replace=replace, event=event,
                                      turn_id=turn_id, trigger=trigger, deliver=deliver)
        async with stream:
            async for e in stream:
                yield e

    async def open_resume(self, turn_id: str, input_id: str, value: Any, *, session: str,
                          by: str | None = None, granted: Grant | None = None,
                          authorize: bool = False, principal: Any = None) -> TurnStream:
        """Answer a parked turn and return the stream of what follows (see
        :meth:`resume_stream`). The answer is stored when this returns."""
        s = self.session(session)
        sub = self.runtime.subscribe(s.key)
        try:
            await sub.ready()
            after = sub.cursor or 0
            await s.resume(turn_id, input_id, value, by=by, granted=granted,
                           authorize=authorize, principal=principal)
            rec = await s.entry(turn_id)
            if rec is not None and rec.status.ended:
                # It may have ended before we subscribed (a repeated answer): then the
                # stream is its last terminal event.
                ends = [e for e in await s.events(turn_id=turn_id) if e.ends_turn]
                if ends and ends[-1].seq <= after:
                    sub.close()
                    return TurnStream(s, turn_id, None, fresh=True, done=ends[-1])
        except BaseException:
            sub.close()
            raise
        return TurnStream(s, turn_id, sub, fresh=True)

    async def resume_stream(self, turn_id: str, input_id: str, value: Any, *, session: str,
                            by: str | None = None,
                            granted: Grant | None = None) -> AsyncIterator[TurnEvent]:
        """Answer a parked turn (``AgentSession.resume``) and yield the turn's events from
        there to its end or its next park.

        The answer is stored before the first event is yielded. The same answer by the same
        resumer again is one answer: the stream then shows where the turn stands.

        Raises:
            ResumeConflictError: not parked on that input, or another answer was given.
            ResumeAuthorizationError: ``by`` may not answer it.
            InvalidInputError: ``value`` does not fit the request's schema.
        """
        stream = await self.open_resume(turn_id, input_id, value, session=session, by=by,
                                        granted=granted)
        async with stream:
            async for e in stream:
                yield e

    async def reset_session(self, *, session: str) -> ResetResult:
        """Reset a session (F8): cancel its unfinished turns, archive its history."""
        return await self.session(session).reset()


def mount_agent(agent: Agent, runtime: Runtime) -> ChannelContext:
    """Mount ``agent`` (one of ``runtime``'s agents) for a channel.

    Raises:
        ConfigurationError: the runtime does not have this agent.
    """
    return ChannelContext(agent, runtime)


class TurnStream:
    """One turn's events, to its end or its park: ``async for event in stream``.

    Close it (or use ``async with``) when done; closing stops the reading, not the turn.
    """

    def __init__(self, session: AgentSession, turn_id: str, sub: Subscription | None, *,
                 fresh: bool, done: TurnEvent | None = None, joined: int = 0) -> None:
        self.session = session
        self.turn_id = turn_id
        """The turn streamed."""
        self.joined = joined
        """The seq of the turn's newest logged event when the stream joined it (0 for a
        stream that saw the turn from its start): live text that carries a seq up to it may
        have begun before the stream did, and only the ``message.completed`` that follows
        it holds the whole."""
        self._sub = sub
        self._fresh = fresh
        self._done = done

    def __aiter__(self) -> AsyncIterator[TurnEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TurnEvent]:
        # A fresh subscription starts after everything the turn had done, so its first
        # terminal event is the end. A replay from the start of the log also holds the turn's
        # earlier parks: it ends at the last terminal event logged if the turn has ended, else
        # at the first one after it.
        if self._done is not None:
            yield self._done
            return
        if self._sub is None:
            return
        last_end = -1
        if not self._fresh:
            last_end, ended = await _where_it_stands(self.session, self.turn_id)
            if not ended:
                last_end += 1  # an earlier park, answered since: not this stream's end
        async for e in self._sub:
            if e.turn_id != self.turn_id:
                continue
            yield e
            if e.ends_turn and e.seq >= last_end:
                return

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close()

    async def __aenter__(self) -> TurnStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


async def _where_it_stands(s: AgentSession, turn_id: str) -> tuple[int, bool]:
    """The seq of the turn's last logged terminal event, and whether the turn has ended; read
    until both agree (a terminal event may commit between the two reads)."""
    while True:
        before = _last_end(await s.events(turn_id=turn_id))
        rec = await s.entry(turn_id)
        status = rec.status if rec is not None else TurnStatus.QUEUED
        if _last_end(await s.events(max(before, 0), turn_id=turn_id)) == -1:
            return before, status.ended


def _last_end(events: list[TurnEvent]) -> int:
    return max((e.seq for e in events if e.ends_turn), default=-1)


__all__ = ["ChannelContext", "TurnStream", "mount_agent"]
