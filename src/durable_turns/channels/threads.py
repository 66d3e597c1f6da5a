"""Turns delivered into chat threads: one reply per turn, for any platform with threads.

What a reply is, whatever the platform: a turn's events followed into its thread, its text
streamed into a message as the model writes it and each tool call a line of a timeline; the
stream stopped before a long tool (a platform ends a stream whose appends stop) and the rest
put in a new message; a prompt for each request it parks on (the calls of a parallel batch
that park at once get one each), and after the answer the reply going on; a reply a restart
cut mid-stream finished whole from the stored events. What was delivered is stored on the
turn's chain entry (``AgentSession.set_turn_data``, under the channel's name), not in memory:

``{"seq": last event delivered in full, "stream": {"ts": the open stream's message id,
"after": the seq its content starts after}, "prompts": {input id: message id}, "done": …}``

A platform implements :class:`ThreadPlatform`, six calls (start, append to and stop a
stream, post and update a message, post a prompt), and a channel drives a
:class:`ThreadDeliveries`: it starts and answers turns, follows each turn's events with one
task per turn in this process (a turn is never delivered twice at once), and recovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

from .._in_doubt import SETTLED_WORDS
from ..events import (
    TURN_ENDS,
    ActionCompleted,
    ActionInDoubt,
    ActionRequested,
    InputReminder,
    InputRequested,
    MessageCompleted,
    MessageDelta,
    MessageRetry,
    TurnCancelled,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
    TurnSleeping,
    TurnStarted,
)
from ..inbound import InboundEvent
from ..records import ChainEntry, InputRequest, SessionKey, TurnStatus
from ..sessions import AgentSession, Mode
from ..stores import Subscription
from ._context import ChannelContext
from ._contract import Deliverer
from ._delivery import deliver_when_settled, delivery_settled, delivery_target

SUPERSEDED = "superseded by a newer message"
"""How a reply superseded by a newer message in its thread ends."""
STREAM_IDLE = 20.0
"""Seconds without anything to append after which a reply's stream is stopped (a long
tool); the rest of the reply goes in a new message."""
STOP_GRACE = 5.0
"""Seconds :meth:`ThreadDeliveries.stop` lets running deliveries finish before it cancels
them (the next process's recovery finishes what they left)."""


class StreamEnded(Exception):
    """Raised by a platform when a streamed message takes no more appends (it expired, or
    was stopped): the reply finishes that message by rewriting it whole."""


@dataclass(frozen=True, slots=True)
class Text:
    """A piece of the reply's text (markdown)."""

    text: str


@dataclass(frozen=True, slots=True)
class Task:
    """A tool call's line in the reply's timeline."""

    id: str
    """The call's id: a later chunk with the same id updates the line."""
    title: str
    """The tool's name."""
    status: Literal["in_progress", "complete", "error"]
    output: str | None = None
    """The error, for ``error``."""


Chunk = Text | Task
"""What a stream is made of."""


@dataclass(frozen=True, slots=True)
class Thread:
    """Where one turn's reply goes."""

    session: str
    """The session id (a prompt carries it, with the turn id, to route the answer)."""
    turn_id: str
    route: Mapping[str, Any]
    """What the channel stored with the turn's inbound event to find its thread (its
    ``meta``: Slack's ``team``, ``channel``, ``thread_ts``)."""
    user: str | None
    """Who spoke: the inbound event's user id (attested by the channel)."""

    @classmethod
    def of(cls, rec: ChainEntry, session: str) -> Thread:
        """The thread of a turn the channel started, read off its stored inbound event."""
        event = rec.event or {}
        user = (event.get("user") or {}).get("id")
        return cls(session, rec.turn_id, dict(event.get("meta") or {}),
                   str(user) if user else None)


class ThreadPlatform(Protocol):
    """The calls a reply is made of, on one platform. Each raises the platform's own error
    when the platform refuses (the delivery fails and is logged; recovery tries again),
    except where :class:`StreamEnded` is said."""

    async def start_stream(self, thread: Thread, chunks: Sequence[Chunk]) -> str:
        """Open a streamed message in the thread with its first chunks; returns its id."""
        ...

    async def append_stream(self, thread: Thread, message: str,
                            chunks: Sequence[Chunk]) -> None:
        """Append to the open stream ``message``.

        Raises:
            StreamEnded: the stream takes no more appends.
        """
        ...

    async def stop_stream(self, thread: Thread, message: str,
                          chunks: Sequence[Chunk] = ()) -> None:
        """Stop the stream ``message``, after its last ``chunks``.

        Raises:
            StreamEnded: it had ended already.
        """
        ...

    async def post(self, thread: Thread, text: str) -> str:
        """Post ``text`` (markdown) as a message in the thread; returns its id."""
        ...

    async def update(self, thread: Thread, message: str, text: str) -> None:
        """Rewrite the message ``message`` whole with ``text`` (a stream's, once ended)."""
        ...

    async def post_prompt(self, thread: Thread, request: InputRequest) -> str:
        """Post the request with a way to answer it (buttons that route the answer by
        ``thread.session``, ``thread.turn_id`` and ``request.id``); returns its id."""
        ...


def reply_state(rec: ChainEntry, name: str) -> dict[str, Any]:
    """What the channel ``name`` delivered of the turn so far (``rec.data[name]``)."""
    return dict((rec.data or {}).get(name) or {})


class ThreadReply:
    """One delivery of a turn's reply: from where its stored state says to the turn's end or
    its next park. Feed it the turn's events with :meth:`on`."""

    def __init__(self, platform: ThreadPlatform, session: AgentSession, rec: ChainEntry,
                 name: str, log: logging.Logger) -> None:
        self.platform = platform
        self.session = session
        self.thread = Thread.of(rec, session.key.session)
        self.name = name
        self.log = log
        state = reply_state(rec, name)
        self.seq = int(state.get("seq", 0))
        """The last event delivered in full: a follower starts after it."""
        self.prompts: dict[str, str] = dict(state.get("prompts") or {})
        stream = state.get("stream")
        # A stream this process did not open is past repair by appends (it may have
        # expired): its message is rewritten whole at the segment's end.
        self.stale: dict[str, Any] | None = stream if stream else None
        self.message: str | None = None
        self.live = False
        self.segment: list[TurnEvent] = []
        """The durable events of the message being written."""
        self.streamed = ""
        self.after = 0

    async def _save(self, **changes: Any) -> None:
        state = {"seq": self.seq, "prompts": self.prompts,
                 "stream": ({"ts": self.message, "after": self.after} if self.message
                            else self.stale), **changes}
        await self.session.set_turn_data(self.thread.turn_id, self.name, state)

    async def on(self, e: TurnEvent) -> bool:
        """Render one event; True when this delivery is over (the turn ended or parked)."""
        if e.child is not None:
            # A subagent's work forwarded into this turn (F13): its text, ends and questions
            # are not this reply's (a child that asks parks the parent, which asks itself).
            self.seq = max(self.seq, e.seq)
            return False
        if isinstance(e, TurnStarted):
            self.seq = max(self.seq, e.seq)
            return False
        if isinstance(e, MessageRetry):
            # The failed attempt's text is void and the next attempt streams from the start:
            # what was appended cannot be taken back, so the message is rewritten at the end.
            if self.streamed and self.message is not None and self.live:
                with contextlib.suppress(StreamEnded):
                    await self.platform.stop_stream(self.thread, self.message)
                self.live = False
            self.streamed = ""
            return False
        if isinstance(e, MessageDelta):
            self.streamed += e.text
            await self._append([Text(e.text)])
            return False
        if not e.durable:
            return False  # another live notice (a tool's retry): the reply shows the outcome
        self.segment.append(e)
        if isinstance(e, MessageCompleted):
            rest = e.text[len(self.streamed):] if e.text.startswith(self.streamed) else e.text
            self.streamed = ""
            if rest:
                await self._append([Text(rest)])
        elif isinstance(e, ActionRequested):
            await self._append([Task(e.call.id, e.call.name, "in_progress")])
        elif isinstance(e, ActionCompleted):
            await self._append([Task(e.call.id, e.call.name,
                                     "error" if e.error else "complete", e.error)])
        elif isinstance(e, ActionInDoubt):
            await self._append([Task(e.call.id, f"{e.call.name} ({SETTLED_WORDS[e.settled]})",
                                     "in_progress")])
        elif isinstance(e, InputRequested):
            await self._finish(e)
            # Calls of a parallel batch that park at once (F15): a prompt for each.
            for request in e.request.all:
                if request.id not in self.prompts:
                    self.prompts[request.id] = await self.platform.post_prompt(self.thread,
                                                                               request)
            self.seq = e.seq
            await self._save()
            # A request the clock answers or reminds of (F24): the reply follows on, to
            # post the reminders and what the turn does after its deadline.
            return not any(r.expires or r.remind_every for r in e.request.all)
        elif isinstance(e, InputReminder):
            # Asked again: its buttons posted again, the newest prompt the one answered.
            request = dataclasses.replace(e.request, more=())
            self.prompts[request.id] = await self.platform.post_prompt(self.thread, request)
            self.seq = e.seq
            await self._save()
        elif isinstance(e, TurnSleeping):
            await self._finish(e)  # the reply goes on once the clock wakes the turn
            self.seq = e.seq
            await self._save()
        elif isinstance(e, TURN_ENDS):
            await self._finish(e)
            self.seq = e.seq
            await self._save(done=True)
            await self.session.settle_delivery(self.thread.turn_id)
            return True
        return False

    async def _append(self, chunks: list[Chunk]) -> None:
        if self.stale is not None:
            return  # collected in self.segment; rewritten at the end
        if self.message is None:
            self.after = self.segment[0].seq - 1 if self.segment else self.seq
            self.message = await self.platform.start_stream(self.thread, chunks)
            self.live = True
            await self._save()
        elif self.live:
            try:
                await self.platform.append_stream(self.thread, self.message, chunks)
            except StreamEnded as err:
                self.log.warning("stream %s ended (%s); finishing it with an update",
                                 self.message, err)
                self.live = False

    async def pause(self) -> None:
        """Nothing to append for a while (a long tool): stop the stream before the platform
        expires it; the segment goes on in a new message."""
        if self.message is not None and self.live:
            with contextlib.suppress(StreamEnded):
                await self.platform.stop_stream(self.thread, self.message)
            self.seq = self.segment[-1].seq if self.segment else self.seq
            self.message, self.live, self.segment = None, False, []
            await self._save()

    async def _finish(self, end: TurnEvent) -> None:
        note = closing(end)
        if self.stale is not None:
            after = int(self.stale.get("after", 0))
            events = [e for e in await self.session.events(after, turn_id=self.thread.turn_id)
                      if e.seq <= end.seq]
            text = render(events) or note or "(no reply)"
            await self.platform.update(self.thread, str(self.stale["ts"]), text)
            self.stale = None
            return
        if self.message is None:
            text = render(self.segment)
            if text:
                await self.platform.post(self.thread, text)
            return
        message, self.message = self.message, None
        if self.live:
            try:
                await self.platform.stop_stream(
                    self.thread, message, [Text(f"\n\n{note}")] if note else ())
                return
            except StreamEnded as err:
                self.log.warning("stopping stream %s failed (%s); finishing it with an "
                                 "update", message, err)
        await self.platform.update(self.thread, message, render(self.segment) or "(no reply)")


class ThreadDeliveries:
    """A channel's deliveries into threads, in this process: one task per turn at a time.

    Args:
        channel: the channel (its ``name`` names the stored state; its ``deliver`` renders
            the ``receive()`` turns it owes, F9).
        platform: the platform's calls.
        stream_idle: seconds without output after which a streamed reply is stopped.
        log: where failed deliveries are logged.
    """

    def __init__(self, channel: Deliverer, platform: ThreadPlatform, *,
                 stream_idle: float = STREAM_IDLE, log: logging.Logger | None = None) -> None:
        self.channel = channel
        self.platform = platform
        self.stream_idle = stream_idle
        self.log = log or logging.getLogger("durable_turns")
        self._tasks: dict[tuple[SessionKey, str], asyncio.Task[None]] = {}
        self._spawned: set[asyncio.Task[Any]] = set()

    # -- what a channel calls ---------------------------------------------------------------

    async def start_turn(self, s: AgentSession, text: str, *, turn_id: str,
                         event: InboundEvent, replace: bool = False,
                         mode: Mode = "queue") -> None:
        """Start a turn (durable when this returns) and deliver its reply in the background;
        ``mode`` as ``AgentSession.start``'s (a steer that joined a turn has no reply of its
        own: the turn's, delivered as it was, answers it).

        Raises:
            SessionBusyError: the session is parked on another turn (nothing started).
            TurnConflictError: ``turn_id`` was accepted with other text.
        """
        # Subscribed before the turn starts: its live text is not stored, so a reader that
        # comes later misses it.
        sub = s.runtime.subscribe(s.key)
        try:
            await sub.ready()
            started = await s.start(text, turn_id=turn_id, event=event, replace=replace,
                                    deliver=self.channel.name, mode=mode)
        except BaseException:
            sub.close()
            raise
        if started.steering is not None:
            sub.close()
            return
        self.follow(s, turn_id, sub)

    async def answer(self, s: AgentSession, turn_id: str, input_id: str, value: Any, *,
                     by: str | None) -> None:
        """Answer a parked turn (stored when this returns) and deliver what follows in the
        background: a thread's reply goes on; a ``receive()`` turn is delivered through the
        channel once it ends or parks again.

        Raises:
            ResumeConflictError: not parked on that input, or another answer was given.
            ResumeAuthorizationError: ``by`` may not answer it.
            InvalidInputError: ``value`` does not fit the request's schema.
        """
        sub = s.runtime.subscribe(s.key)
        try:
            await sub.ready()
            await s.resume(turn_id, input_id, value, by=by)
            rec = await s.entry(turn_id)
        except BaseException:
            sub.close()
            raise
        if rec is not None and delivery_target(rec) is not None:
            sub.close()
            self.after(s, turn_id, partial(deliver_when_settled, self.channel, s, turn_id))
        else:
            self.follow(s, turn_id, sub)

    def follow(self, s: AgentSession, turn_id: str, sub: Subscription | None = None) -> None:
        """Deliver the turn's reply, from where its stored state says, unless this process
        delivers it already.

        Args:
            sub: a subscription to the session made before the turn was started or answered
                (so its live text is seen); closed here when not used. With one, a delivery
                that is running goes first and this one follows it (a click while the reply
                to the click before is still being written: F15's batch).
        """
        before = self._running(s.key, turn_id)
        if before is not None and sub is None:
            return
        self._track(s.key, turn_id, self._follow(s, turn_id, sub, before))

    def after(self, s: AgentSession, turn_id: str,
              work: Callable[[], Awaitable[Any]]) -> None:
        """Run ``work`` for the turn in the background, after its delivery running now."""
        self._track(s.key, turn_id, self._then(self._running(s.key, turn_id), work))

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` in the background (a notice, a click's answer); a failure is logged,
        :meth:`idle` waits for it and :meth:`stop` ends it."""
        task = asyncio.get_running_loop().create_task(work)
        self._spawned.add(task)
        task.add_done_callback(self._spawn_done)

    async def recover(self, ctx: ChannelContext) -> int:
        """Take up every delivery the channel owes for ``ctx``'s agent (what a stopped
        process left): a reply not finished is followed from its stored state (a half
        streamed one rewritten whole), a ``receive()`` turn not delivered is delivered once
        it ends or parks. Returns how many it took up; they run in the background."""
        n = 0
        owed = await ctx.runtime.queries.owed_deliveries(self.channel.name, ctx.agent.name)
        for key, rec in owed:
            s, turn_id = ctx.session(key.session), rec.turn_id
            if delivery_target(rec) is not None:
                if delivery_settled(rec):
                    continue
                self.after(s, turn_id, partial(deliver_when_settled, self.channel, s, turn_id))
            elif reply_state(rec, self.channel.name).get("done") or not (rec.event or {}).get(
                    "meta"):
                continue
            else:
                self.follow(s, turn_id)
            n += 1
        return n

    async def idle(self) -> None:
        """Wait until this process delivers nothing (tests, an orderly shutdown)."""
        while self._tasks or self._spawned:
            await asyncio.wait([*self._tasks.values(), *self._spawned])

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """Let running deliveries finish for up to ``grace`` seconds, then cancel the rest
        (each stored what it delivered; the next process's recovery goes on from there)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self.idle()
        rest = [*self._tasks.values(), *self._spawned]
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest)

    # -- the tasks ---------------------------------------------------------------------------

    def _running(self, key: SessionKey, turn_id: str) -> asyncio.Task[None] | None:
        task = self._tasks.get((key, turn_id))
        return task if task is not None and not task.done() else None

    def _track(self, key: SessionKey, turn_id: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks[(key, turn_id)] = task
        task.add_done_callback(lambda t: self._done(key, turn_id, t))

    def _done(self, key: SessionKey, turn_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get((key, turn_id)) is task:
            del self._tasks[(key, turn_id)]
        if not task.cancelled() and task.exception() is not None:
            self.log.error("delivering turn %s of %s failed", turn_id, key,
                           exc_info=task.exception())

    def _spawn_done(self, task: asyncio.Task[Any]) -> None:
        self._spawned.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error("background work failed", exc_info=task.exception())

    async def _then(self, before: asyncio.Task[None] | None,
                    work: Callable[[], Awaitable[Any]]) -> None:
        if before is not None:
            await asyncio.wait({before})
        await work()

    async def _follow(self, s: AgentSession, turn_id: str, sub: Subscription | None,
                      before: asyncio.Task[None] | None) -> None:
        try:
            if before is not None:
                await asyncio.wait({before})
            rec = await s.entry(turn_id)
        except BaseException:
            if sub is not None:
                sub.close()
            raise
        state = reply_state(rec, self.channel.name) if rec is not None else {}
        if rec is None or state.get("done") or (
                rec.request is not None and rec.request.id in (state.get("prompts") or {})
                and (sub is None or rec.status is TurnStatus.SUSPENDED)):
            # Delivered, or parked with its prompt posted (an answer follows it again).
            if sub is not None:
                sub.close()
            return
        reply = ThreadReply(self.platform, s, rec, self.channel.name, self.log)
        if sub is None:
            sub = s.runtime.subscribe(s.key, reply.seq)
        events = aiter(sub)
        waiting: asyncio.Future[TurnEvent] | None = None
        try:
            await sub.ready()
            while True:
                # Never cancel the pending read (that would end the subscription's
                # generator): wait on it, and pause the stream when it takes long.
                waiting = asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait({waiting}, timeout=self.stream_idle)
                if not done:
                    await reply.pause()
                e = await waiting
                waiting = None
                if e.turn_id != turn_id or (e.durable and e.seq <= reply.seq):
                    continue
                if await reply.on(e):
                    return
        finally:
            if waiting is not None:
                waiting.cancel()
            sub.close()


# -- rendering -----------------------------------------------------------------------------

def render(events: Sequence[TurnEvent]) -> str:
    """A segment as one message's markdown: the tool timeline, then the text."""
    lines: list[str] = []
    texts: list[str] = []
    for e in events:
        if e.child is not None:  # a subagent's own work, not this reply's
            continue
        if isinstance(e, ActionCompleted):
            mark = "✗" if e.error else "✓"
            lines.append(f"{mark} {e.call.name}" + (f": {e.error}" if e.error else ""))
        elif isinstance(e, ActionInDoubt):
            lines.append(f"? {e.call.name}: {SETTLED_WORDS[e.settled]}")
        elif isinstance(e, MessageCompleted) and e.text:
            texts.append(e.text)
        elif e.ends_turn:
            note = closing(e)
            if note:
                texts.append(note)
    return "\n".join([*lines, *([""] if lines and texts else []), *texts]).strip()


def closing(e: TurnEvent) -> str:
    """The line a reply ends with: why the turn failed or was cancelled (else empty)."""
    if isinstance(e, TurnFailed):
        return f"⚠️ Sorry, this failed: {e.error}"
    if isinstance(e, TurnCancelled):
        return (f"_{SUPERSEDED}_" if e.reason.startswith("superseded")
                else f"_cancelled: {e.reason}_")
    return ""


def outcome(e: TurnEvent) -> str:
    """A turn's end as one message: its text, or why it failed or was cancelled."""
    if isinstance(e, TurnCompleted):
        return e.text or "(no reply)"
    return closing(e)


__all__ = ["STOP_GRACE", "STREAM_IDLE", "SUPERSEDED", "Chunk", "StreamEnded", "Task", "Text",
           "Thread", "ThreadDeliveries", "ThreadPlatform", "ThreadReply", "closing",
           "outcome", "render", "reply_state"]
