"""The thread-channel base: a chat platform with threads is its platform calls and its routes.

A :class:`ThreadChannel` is a :class:`~durable_turns.channels.Channel` for a platform where
people talk to the agent in threads (Slack; Teams, Discord). The base holds what is the same
on every such platform:

- the lifecycle: ``mount`` picks the agent that answers, ``start`` / ``recover`` / ``stop``
  (the server's lifespan calls them; the runtime is open by then, its owner opened it);
- a message heard in a thread (:meth:`ThreadChannel.message`): the app's ``authorize``
  asked, the turn stored before the platform is answered, its reply delivered in the
  background (:mod:`.threads`: streamed, a prompt per park, finished after a restart), a
  busy thread or a refusal told to the speaker privately;
- a click on a prompt's button (:meth:`ThreadChannel.click`): answered as the verified
  clicker, under the request's answerer rules and ``authorize``; a wrong answerer told why,
  privately; the prompt updated to show who answered;
- ``deliver(target, events)`` for turns nobody on the platform started (F9), and their
  recovery after a restart.

A platform subclasses it and writes its :meth:`~ThreadChannel.routes` (verify the
platform's signature, parse, call ``message`` or ``click``, answer at once) and its calls:
the six of :class:`~.threads.ThreadPlatform` (``start_stream``, ``append_stream``,
``stop_stream``, ``post``, ``update``, ``post_prompt``) and four more (``note``,
``refuse_click``, ``answered``, ``post_outcome``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..access import Action, Authorize, decide
from ..errors import (
    ConfigurationError,
    InvalidInputError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionBusyError,
    TurnConflictError,
)
from ..events import TurnEvent
from ..inbound import InboundEvent, identity, source_of
from ..records import SessionSummary
from ..sessions import AgentSession
from ._context import ChannelContext, mount_agent
from .threads import STREAM_IDLE, Chunk, Thread, ThreadDeliveries

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from ..records import InputRequest
    from ..runtime import Runtime

REFUSED = "You can't talk to this agent here."
"""What a speaker the app's ``authorize`` refuses is told, privately."""
BUSY = "I'm waiting for an answer to the approval above; send this again after it."
"""What a speaker is told whose thread is parked on a request."""
NOT_YOURS = "You can't answer this request; it is for someone else."
"""What a clicker who may not answer is told, privately."""
UNFIT = "That answer doesn't fit the request"
"""How a clicker is told, privately, that the answer does not fit the request's schema."""


@dataclass(frozen=True, slots=True)
class Said:
    """A message heard in a thread, verified by the platform's routes."""

    session: str
    """The thread's session id (``"<platform>:…:<thread>"``)."""
    turn_id: str
    """The turn's id, made from the platform's message id: a resend is the same turn."""
    user: str
    """Who spoke: the platform's verified user id (the turn's attested speaker)."""
    text: str
    route: Mapping[str, Any]
    """Where to reply, in the platform's terms: stored as the inbound event's ``meta`` and
    handed back to the platform's calls as ``Thread.route``."""
    principal: Mapping[str, Any] = field(default_factory=dict)
    """More of who spoke, for the app's ``authorize`` (Slack: ``{"team": "T…"}``)."""
    raw: Any = None
    """The platform's request, kept with the turn's inbound event."""


@dataclass(frozen=True, slots=True)
class Click:
    """A click on a prompt's button, verified by the platform's routes."""

    session: str
    turn_id: str
    input_id: str
    """What the button routes to (the prompt carried them: routing only, never who)."""
    value: Any
    """The answer (Approve: ``True``, Deny: ``False``)."""
    by: str
    """Who clicked: the platform's verified user id, the answer's ``by``."""
    reply: Mapping[str, Any] = field(default_factory=dict)
    """What the platform needs to answer the click (Slack: its ``response_url``)."""
    principal: Mapping[str, Any] = field(default_factory=dict)
    """More of who clicked, for the app's ``authorize``."""


class ThreadChannel:
    """A chat platform with threads, as a :class:`~durable_turns.channels.Channel`.

    Subclass it: set :attr:`name`, write :meth:`routes` and the platform calls (below).

    Args:
        agent: the runtime's agent that answers (default: its only one).
        replace_in_flight: a message in a busy thread supersedes the running turn instead
            of queueing behind it (a parked approval is never superseded).
        steer_in_flight: a message in a busy thread joins the running turn at its next model
            call instead (F25: ``start(mode="steer")``; the turn's reply, delivered as it
            was, answers both; a parked thread refuses it as it refuses a turn).
        stream_idle: seconds without output after which a streamed reply is stopped.
        authorize: the host's rule (``access.Authorize``), asked with the platform's user as
            the principal (``{"id", "source": name, **principal}``) before a message starts
            a turn (``turn``) and before a click answers (``resume``).
        log: where failed deliveries are logged.
    """

    name: str = ""
    """The event source of its turns (it selects ``surfaces={name: …}``, F10)."""

    def __init__(self, *, agent: str | None = None, replace_in_flight: bool = False,
                 stream_idle: float = STREAM_IDLE, authorize: Authorize | None = None,
                 log: logging.Logger | None = None, steer_in_flight: bool = False) -> None:
        if replace_in_flight and steer_in_flight:
            raise ValueError("a message in a busy thread either replaces the running turn "
                             "or steers it: not both")
        self.agent = agent
        self.replace_in_flight = replace_in_flight
        self.steer_in_flight = steer_in_flight
        self.authorize = authorize
        self.log = log or logging.getLogger(f"durable_turns.{self.name}")
        self.threads = ThreadDeliveries(self, self, stream_idle=stream_idle, log=self.log)
        """The replies this process delivers (one task per turn)."""
        self._ctx: ChannelContext | None = None

    # -- what the platform writes -----------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        """The platform's routes (called by :meth:`mount`, :attr:`ctx` set)."""
        raise NotImplementedError

    async def start_stream(self, thread: Thread, chunks: Sequence[Chunk]) -> str:
        """:class:`~.threads.ThreadPlatform`'s: open a streamed message; its id."""
        raise NotImplementedError

    async def append_stream(self, thread: Thread, message: str,
                            chunks: Sequence[Chunk]) -> None:
        """Append to a stream (raise ``StreamEnded`` when it takes no more)."""
        raise NotImplementedError

    async def stop_stream(self, thread: Thread, message: str,
                          chunks: Sequence[Chunk] = ()) -> None:
        """Stop a stream after its last chunks (raise ``StreamEnded`` if it had ended)."""
        raise NotImplementedError

    async def post(self, thread: Thread, text: str) -> str:
        """Post a message (markdown) in the thread; its id."""
        raise NotImplementedError

    async def update(self, thread: Thread, message: str, text: str) -> None:
        """Rewrite a message whole."""
        raise NotImplementedError

    async def post_prompt(self, thread: Thread, request: InputRequest) -> str:
        """Post a request with buttons that route a click by ``thread.session``,
        ``thread.turn_id`` and ``request.id``; its id."""
        raise NotImplementedError

    async def note(self, said: Said, text: str) -> None:
        """Tell the speaker of ``said``, privately (a refusal, a busy thread)."""
        raise NotImplementedError

    async def refuse_click(self, click: Click, text: str) -> None:
        """Tell the clicker, privately, why the click answered nothing."""
        raise NotImplementedError

    async def answered(self, click: Click) -> None:
        """Show on the prompt who answered and how (``click.by``, ``click.value``)."""
        raise NotImplementedError

    async def post_outcome(self, target: Mapping[str, Any], end: TurnEvent) -> Any:
        """Post a turn nobody on the platform started at ``target`` (F9): its prompt with
        buttons if ``end`` is ``input.requested``, else its outcome (``threads.outcome``).
        Returns a JSON-able receipt."""
        raise NotImplementedError

    # -- the lifecycle ----------------------------------------------------------------------

    def mount(self, runtime: Runtime) -> list[BaseRoute]:
        """Bind the channel to ``runtime``'s agent; returns its routes (``create_app``
        calls it).

        Raises:
            ConfigurationError: ``agent`` is not the runtime's, or none was named and the
                runtime has more than one.
        """
        self._ctx = self.context(runtime)
        return self.routes()

    def context(self, runtime: Runtime) -> ChannelContext:
        """The :class:`ChannelContext` of the agent that answers on ``runtime``.

        Raises:
            ConfigurationError: as :meth:`mount`.
        """
        name = self.agent
        if name is None:
            if len(runtime.agents) != 1:
                raise ConfigurationError(
                    f"the runtime has {len(runtime.agents)} agents: name the one that answers "
                    f"in {self.name} with agent=…")
            name = next(iter(runtime.agents))
        if name not in runtime.agents:
            raise ConfigurationError(f"{self.name} channel: the runtime has no agent {name!r} "
                                     f"({', '.join(sorted(runtime.agents))})")
        return mount_agent(runtime.agents[name], runtime)

    @property
    def ctx(self) -> ChannelContext:
        """The mounted agent.

        Raises:
            ConfigurationError: not mounted yet.
        """
        if self._ctx is None:
            raise ConfigurationError(f"the {self.name} channel is not mounted: pass it to "
                                     "create_app(runtime, channels=[…])")
        return self._ctx

    async def start(self) -> None:
        """Nothing runs in the background until a turn is delivered: checks it is mounted.

        Raises:
            ConfigurationError: not mounted.
        """
        _ = self.ctx

    async def recover(self) -> int:
        """Take up what a stopped process left undelivered: replies cut short (a
        half-streamed one rewritten whole) and ``receive()`` turns not delivered. Returns
        how many; their deliveries go on in the background."""
        return await self.threads.recover(self.ctx)

    async def stop(self) -> None:
        """Let deliveries finish for a few seconds, then end them (recovery goes on)."""
        await self.threads.stop()

    async def idle(self) -> None:
        """Wait until this process delivers nothing (tests, orderly shutdown)."""
        await self.threads.idle()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` in the background, after the platform was answered (a failure is
        logged; :meth:`stop` ends it)."""
        self.threads.spawn(work)

    # -- what the routes call ---------------------------------------------------------------

    async def message(self, said: Said) -> None:
        """Take a message heard in a thread: store its turn (durable when this returns) and
        reply in the background. A refused speaker or a parked thread is told privately;
        a resend of the same message is the same turn.

        Raises:
            Exception: the store failed (the platform should send the message again).
        """
        s = self.ctx.session(said.session)
        found = await s.summary()
        if found.exists and not self.made(found):
            # Not this channel's session (made elsewhere under one of its names, before the
            # API refused them): nothing said here is stored there.
            self.log.warning("%s: session %s is not this channel's (owner %r): message %s "
                             "refused", self.name, s.key, found.owner, said.turn_id)
            self.spawn(self.note(said, REFUSED))
            return
        if not await self.allowed(said.user, said.principal, "turn", s):
            self.spawn(self.note(said, REFUSED))
            return
        if not found.exists:
            # The thread's session is the channel's, owned by its first speaker (of two
            # surfaces that make it at once, one owns it: the other refuses).
            owner = await self.ctx.runtime.queries.own(s.key, identity(self.name, said.user))
            if owner is not None and source_of(owner) != self.name:
                self.spawn(self.note(said, REFUSED))
                return
        event = InboundEvent(self.name, {"id": said.user, "attested": True}, said.text,
                             raw=said.raw, meta=dict(said.route))
        try:
            await self.threads.start_turn(
                s, said.text, turn_id=said.turn_id, event=event,
                mode="steer" if self.steer_in_flight else
                "replace" if self.replace_in_flight else "queue")
        except SessionBusyError:
            self.spawn(self.note(said, BUSY))
        except TurnConflictError:
            pass  # the same message id stored with other text: one message, one turn

    def session_of(self, *parts: str) -> str:
        """The session id of a thread on this platform: ``"<name>:<part>:…"`` (the source's
        own namespace, so no other source's sessions share it)."""
        return ":".join((self.name, *parts))

    def click(self, click: Click) -> None:
        """Take a click on a prompt's button: answered in the background (the platform is
        answered at once), as the verified clicker."""
        self.spawn(self.answer_click(click))

    async def answer_click(self, click: Click) -> bool:
        """Answer a click as the verified clicker, now (a platform that must answer the
        click's own request with the outcome awaits it; :meth:`click` runs it in the
        background): under the request's answerer rules and ``authorize``; the prompt
        updated (:meth:`answered`), or the clicker told why not (:meth:`refuse_click`).
        Returns whether it answered."""
        s = self.ctx.session(click.session)
        by = identity(self.name, click.by)
        try:
            if not await self.heard_here(s, click.turn_id) or \
                    not await self.allowed(click.by, click.principal, "resume", s):
                raise ResumeAuthorizationError("refused by the app's rule", by=by)
            await self.threads.answer(s, click.turn_id, click.input_id, click.value, by=by)
        except ResumeAuthorizationError:
            await self.refuse_click(click, NOT_YOURS)
            return False
        except ResumeConflictError as e:
            await self.refuse_click(click, f"This request can't take that answer any more: {e}")
            return False
        except InvalidInputError as e:
            await self.refuse_click(click, f"{UNFIT}: {e}")
            return False
        await self.answered(click)
        return True

    def made(self, found: SessionSummary) -> bool:
        """Whether this channel made the session: its owner is one of the channel's people
        (``<name>:<id>``, the first who spoke in the thread), or it has none (a thread of a
        version that recorded no owner). A session the API or a subagent made under one of
        the channel's names is not its own."""
        return found.owner is None or source_of(found.owner) == self.name

    async def heard_here(self, s: AgentSession, turn_id: str) -> bool:
        """Whether turn ``turn_id`` came from this channel (a message heard in a thread, or a
        ``receive()`` turn it delivers): a prompt's button answers only those."""
        rec = await s.entry(turn_id)
        return rec is not None and (rec.event or {}).get("source") == self.name

    async def allowed(self, user: str, principal: Mapping[str, Any], action: Action,
                      s: AgentSession) -> bool:
        """Whether the app's ``authorize`` lets this platform user do ``action`` on ``s``
        (no rule: yes)."""
        if self.authorize is None:
            return True
        who = {"id": user, "source": self.name, **principal}
        return await decide(self.authorize, who, action, await s.summary()) is True

    # -- F9 -----------------------------------------------------------------------------------

    async def deliver(self, target: Mapping[str, Any],
                      events: AsyncIterable[TurnEvent]) -> Any:
        """Post a turn's outcome, or its prompt if it parked, at ``target`` (``receive()``
        calls it); returns the platform's receipt.

        Raises:
            ValueError: the events hold no end (or ``target`` is not the platform's).
        """
        last: TurnEvent | None = None
        async for e in events:
            if e.ends_turn:  # its own end or park, not a subagent's
                last = e
        if last is None:
            raise ValueError("the turn has not ended: nothing to deliver")
        return await self.post_outcome(target, last)


__all__ = ["BUSY", "NOT_YOURS", "REFUSED", "UNFIT", "Click", "Said", "ThreadChannel"]
