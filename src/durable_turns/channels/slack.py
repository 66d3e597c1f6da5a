"""The Slack channel (F16): an agent people talk to in Slack threads.

``slack_channel(...)`` gives a :class:`SlackChannel`; ``create_app(runtime, channels=[slack])``
mounts it at ``/slack/events`` (the Events API request URL) and ``/slack/actions`` (the
Interactivity request URL). Built on ``slack_sdk``: its ``SignatureVerifier`` checks every
request over the raw body before anything is parsed, its ``AsyncWebClient`` talks to the
Web API (``base_url`` points it at another one, e.g. a test double) and honours 429
``Retry-After``.

Inbound, a mention (or a message in a thread the bot is in) becomes a turn of session
``slack:<team>:<channel>:<thread_ts>`` whose id is ``slack:<channel>:<ts>``: every resend of
an ``event_id``, and the ``message`` twin of an ``app_mention``, carry the same ``(channel,
ts)``, so they are one turn. The turn is durable before the request is acknowledged; the
reply is delivered in the background.

Outbound, each turn's reply streams into the thread (``chat.startStream`` /
``appendStream`` / ``stopStream``, the tool timeline as ``task_update`` chunks; rendered by
``slack_thread.ThreadReply``). What was
delivered is stored on the turn's chain entry (``SessionStore.set_turn_data``, name
``"slack"``): the stream's message ts, the event seq delivered up to, the approval prompts
posted. After a restart a half-streamed reply is finished with ``chat.update``, and a click
on a prompt posted before the restart resumes the turn (the button carries the routing; the
clicker's id comes from the signed payload).

One process should serve ``/slack/*`` (workers that drive turns may be many): deliveries
are deduplicated within the serving process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterable, Mapping
from typing import Any
from urllib.parse import parse_qs

try:
    # slack_sdk's AsyncWebClient needs aiohttp, which slack_sdk does not declare: fail here,
    # naming the extra, rather than at the first call to Slack.
    import aiohttp  # noqa: F401
    from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
    from slack_sdk.signature import SignatureVerifier
    from slack_sdk.web.async_client import AsyncWebClient
    from slack_sdk.webhook.async_client import AsyncWebhookClient
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import BaseRoute, Route
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        "the Slack channel needs slack_sdk, aiohttp and starlette: "
        "pip install 'durable-turns[slack]'") from e

from ..errors import (
    ConfigurationError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionBusyError,
    TurnConflictError,
)
from ..events import TurnEvent
from ..inbound import InboundEvent
from ..records import SessionKey
from ..runtime import Runtime
from ..sessions import AgentSession
from ..stores import Subscription
from . import ChannelContext, deliver_owed, mount_agent, recover_deliveries
from .slack_thread import (
    APPROVE,
    DENY,
    LIVE,
    SUPERSEDED,
    ThreadReply,
    outcome,
    prompt_blocks,
    reply_state,
    turn_meta,
)

log = logging.getLogger("durable_turns.slack")

MAX_BODY = 1 << 20
"""The largest request body read (1 MiB); Slack's are far smaller."""
STREAM_IDLE = 20.0
"""Seconds without anything to append after which a reply's stream is stopped (a long tool):
Slack ends a stream whose appends stop, so the rest of the reply goes in a new one."""
def slack_channel(*, signing_secret: str, bot_token: str, agent: str | None = None,
                  replace_in_flight: bool = False, base_url: str | None = None,
                  stream_idle: float = STREAM_IDLE, rate_limit_retries: int = 3,
                  clock: Any = None) -> SlackChannel:
    """A Slack channel for ``create_app(runtime, channels=[...])`` and ``receive()``.

    Args:
        signing_secret: the app's signing secret (Basic Information → App Credentials).
        bot_token: the bot token (``xoxb-…``).
        agent: the runtime's agent that answers (default: its only one).
        replace_in_flight: a message in a busy thread supersedes the running turn instead of
            queueing behind it (a parked approval is never superseded).
        base_url: the Web API's base URL (default Slack's); point it at a test double.
        stream_idle: seconds without output after which a streamed reply is stopped.
        rate_limit_retries: how often a call answered 429 is retried after its
            ``Retry-After``.
        clock: ``slack_sdk.signature.Clock`` for the signature check (tests freeze time).

    Raises:
        ValueError: an empty secret or token.
    """
    if not signing_secret or not bot_token:
        raise ValueError("slack_channel needs signing_secret and bot_token")
    return SlackChannel(signing_secret, bot_token, agent=agent,
                        replace_in_flight=replace_in_flight, base_url=base_url,
                        stream_idle=stream_idle, rate_limit_retries=rate_limit_retries,
                        clock=clock)


class SlackChannel:
    """A Slack app's two request URLs, the thread replies, and ``deliver()`` for F9.

    Make one with :func:`slack_channel`.
    """

    name = "slack"
    """The event source of its turns (it selects ``surfaces={"slack": …}``, F10)."""

    def __init__(self, signing_secret: str, bot_token: str, *, agent: str | None,
                 replace_in_flight: bool, base_url: str | None, stream_idle: float,
                 rate_limit_retries: int, clock: Any) -> None:
        kw: dict[str, Any] = {} if clock is None else {"clock": clock}
        self.verifier = SignatureVerifier(signing_secret, **kw)
        self.client = AsyncWebClient(token=bot_token,
                                     base_url=base_url or "https://slack.com/api/")
        self.client.retry_handlers.append(
            AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries))
        self.agent = agent
        self.replace_in_flight = replace_in_flight
        self.stream_idle = stream_idle
        self._ctx: ChannelContext | None = None
        self._tasks: dict[tuple[SessionKey, str], asyncio.Task[None]] = {}
        self._recovered = False

    # -- mounting --------------------------------------------------------------------------

    def mount(self, runtime: Runtime) -> list[BaseRoute]:
        """Bind the channel to ``runtime``'s agent; returns its routes (``create_app`` calls
        it).

        Raises:
            ConfigurationError: ``agent`` is not the runtime's, or none was named and the
                runtime has more than one.
        """
        self._ctx = self.context(runtime)
        return [Route("/slack/events", self.events, methods=["POST"]),
                Route("/slack/actions", self.actions, methods=["POST"])]

    def context(self, runtime: Runtime) -> ChannelContext:
        """The :class:`ChannelContext` of the agent that answers on ``runtime``."""
        name = self.agent
        if name is None:
            if len(runtime.agents) != 1:
                raise ConfigurationError(
                    f"the runtime has {len(runtime.agents)} agents: name the one that answers "
                    "in Slack with slack_channel(agent=…)")
            name = next(iter(runtime.agents))
        if name not in runtime.agents:
            raise ConfigurationError(f"slack_channel(agent={name!r}): the runtime has no such "
                                     f"agent ({', '.join(sorted(runtime.agents))})")
        return mount_agent(runtime.agents[name], runtime)

    @property
    def ctx(self) -> ChannelContext:
        if self._ctx is None:
            raise ConfigurationError("the Slack channel is not mounted: pass it to "
                                     "create_app(runtime, channels=[slack])")
        return self._ctx

    async def recover(self) -> int:
        """Finish what a stopped process left undelivered: replies of Slack turns (a
        half-streamed one is completed with ``chat.update``) and ``receive()`` turns whose
        delivery did not happen. Run at start, after ``Runtime.recover()``; the first request
        runs it too. Returns how many turns it took up."""
        self._recovered = True
        ctx = self.ctx
        await ctx.runtime.open()
        store = ctx.runtime.store
        n = 0
        for key in await store.list_sessions(ctx.agent.name):
            if not key.session.startswith("slack:"):
                continue
            for t in await store.turns(key):
                if (t.kind == "turn" and turn_meta(t).get("thread_ts")
                        and not reply_state(t).get("done")):
                    self.follow(key, t.turn_id)
                    n += 1
        n += await recover_deliveries(self, ctx)
        return n

    def _recover_once(self) -> None:
        # In the background: a request is acknowledged within Slack's 3 s however much a
        # stopped process left undelivered (recover() failing is logged by _done).
        if not self._recovered:
            self._recovered = True
            self._spawn(self.recover())

    # -- inbound: the Events API -----------------------------------------------------------

    async def _verified(self, request: Request) -> bytes | Response:
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY:
                return _refuse(413, "the body is too large")
        body = bytes(raw)
        if not self.verifier.is_valid_request(body, dict(request.headers)):
            return _refuse(401, "invalid or stale Slack signature")
        return body

    async def events(self, request: Request) -> Response:
        """``POST /slack/events``: verify, store the turn, acknowledge; reply in the
        background."""
        body = await self._verified(request)
        if isinstance(body, Response):
            return body
        try:
            envelope = json.loads(body)
            if not isinstance(envelope, dict):
                raise ValueError("not an object")
        except ValueError:
            return _refuse(400, "the body is not a JSON object")
        kind = envelope.get("type")
        if kind == "url_verification":
            return JSONResponse({"challenge": envelope.get("challenge")})
        self._recover_once()
        if kind == "event_callback" and isinstance(envelope.get("event"), dict):
            try:
                await self._on_event(envelope)
            except Exception:
                log.exception("slack: event %s failed", envelope.get("event_id"))
                # Slack resends it (the turn id dedupes whatever was stored).
                return _refuse(500, "the event could not be stored; resend it")
        return Response(status_code=200)

    async def _on_event(self, envelope: dict[str, Any]) -> None:
        event = envelope["event"]
        bots = {a.get("user_id") for a in envelope.get("authorizations") or ()
                if isinstance(a, dict) and a.get("is_bot")}
        if event.get("type") not in ("app_mention", "message"):
            return
        if event.get("subtype") or event.get("bot_id") or not event.get("user"):
            return  # edits, deletions, joins, bots (ourselves included)
        if event["user"] in bots:
            return
        channel, ts, user = str(event.get("channel")), str(event.get("ts")), str(event["user"])
        team = str(event.get("team") or envelope.get("team_id") or "")
        thread = str(event.get("thread_ts") or ts)
        session = f"slack:{team}:{channel}:{thread}"
        ctx = self.ctx
        key = ctx.session(session).key
        if event["type"] == "message":
            in_thread = event.get("thread_ts") not in (None, ts)
            is_dm = event.get("channel_type") == "im"
            if not is_dm and not (in_thread and
                                  await ctx.runtime.store.session_info(key) is not None):
                return  # not a thread the bot is in
        text = _strip_mentions(str(event.get("text") or ""), bots)
        if not text:
            text = "(empty message)"
        inbound = InboundEvent(
            "slack", {"id": user, "attested": True}, text, raw=envelope,
            meta={"team": team, "channel": channel, "thread_ts": thread, "ts": ts,
                  "event_id": envelope.get("event_id")})
        turn_id = f"slack:{channel}:{ts}"
        # Subscribed before the turn starts: its live text is not stored, so a reader that
        # comes later misses it.
        sub = ctx.runtime.subscribe(key)
        try:
            await sub.ready()
            await ctx.session(session).start(text, turn_id=turn_id, event=inbound,
                                             replace=self.replace_in_flight)
        except SessionBusyError:
            sub.close()
            self._spawn(self._busy_notice(channel, thread, user))
            return
        except TurnConflictError:
            sub.close()
            return  # the same (channel, ts) stored with other text: one message, one turn
        except BaseException:
            sub.close()
            raise
        self.follow(key, turn_id, sub)

    async def _deliver_rest(self, s: AgentSession, turn_id: str) -> None:
        await s.result(turn_id)
        await deliver_owed(self, s, turn_id)

    async def _busy_notice(self, channel: str, thread: str, user: str) -> None:
        await self.client.chat_postEphemeral(
            channel=channel, user=user, thread_ts=thread,
            text="I'm waiting for an answer to the approval above; send this again after it.")

    # -- inbound: interactivity (button clicks) --------------------------------------------

    async def actions(self, request: Request) -> Response:
        """``POST /slack/actions``: a click on Approve or Deny. Acknowledged at once; the
        answer and the message's update follow in the background."""
        body = await self._verified(request)
        if isinstance(body, Response):
            return body
        try:
            payload = json.loads(parse_qs(body.decode())["payload"][0])
            action = payload["actions"][0]
            route = json.loads(action["value"])
            clicker = str(payload["user"]["id"])
            answer = {APPROVE: True, DENY: False}[action["action_id"]]
            session, turn_id, input_id = route["s"], route["t"], route["i"]
            response_url = str(payload["response_url"])
        except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError):
            return _refuse(400, "not a durable_turns button click")
        self._recover_once()
        prompt = _prompt_text(payload)
        self._spawn(self._answer(session, turn_id, input_id, answer, clicker, response_url,
                                 prompt))
        return Response(status_code=200)

    async def _resume(self, session: str, turn_id: str, input_id: str, answer: bool,
                      clicker: str, hook: AsyncWebhookClient, prompt: str) -> None:
        s = self.ctx.session(session)
        sub = self.ctx.runtime.subscribe(s.key)
        try:
            await sub.ready()
            await s.resume(turn_id, input_id, answer, by=clicker)
            found = await self.ctx.runtime.store.turns(s.key, turn_id=turn_id)
        except BaseException:
            sub.close()
            raise
        if found and "deliver" in turn_meta(found[0]):
            # A receive() turn (F9): what follows the answer is delivered the same way.
            sub.close()
            self._spawn(self._deliver_rest(s, turn_id))
        else:
            self.follow(s.key, turn_id, sub)
        verdict = f"{'Approved' if answer else 'Denied'} by <@{clicker}>"
        await hook.send(replace_original=True, text=f"{prompt}\n{verdict}", blocks=[
            {"type": "section", "text": {"type": "mrkdwn", "text": prompt}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": verdict}]},
        ])

    async def _answer(self, session: str, turn_id: str, input_id: str, answer: bool,
                      clicker: str, response_url: str, prompt: str) -> None:
        hook = AsyncWebhookClient(response_url)
        try:
            await self._resume(session, turn_id, input_id, answer, clicker, hook, prompt)
        except ResumeAuthorizationError:
            await hook.send(response_type="ephemeral", replace_original=False,
                            text="You can't answer this request; it is for someone else.")
            return
        except ResumeConflictError as e:
            await hook.send(response_type="ephemeral", replace_original=False,
                            text=f"This request can't take that answer any more: {e}")

    # -- outbound: a turn's reply in its thread --------------------------------------------

    def follow(self, key: SessionKey, turn_id: str, sub: Subscription | None = None) -> None:
        """Deliver the turn's reply (from where its stored state says) unless this process
        is delivering it already. ``sub``: a subscription to the session made before the
        turn was started or resumed (so its live text is seen); closed here if not used."""
        task = self._tasks.get((key, turn_id))
        if task is not None and not task.done():
            if sub is None:
                return
            # A click while the reply to the click before is still being written (calls of
            # a parallel batch that parked at once, F15): follow again once it ends, from
            # this subscription (made before this answer was stored, so nothing is missed).
            task = asyncio.get_running_loop().create_task(
                self._follow_after(task, key, turn_id, sub))
        else:
            task = asyncio.get_running_loop().create_task(self._follow(key, turn_id, sub))
        self._tasks[(key, turn_id)] = task
        task.add_done_callback(lambda t: self._done(key, turn_id, t))

    async def _follow_after(self, before: asyncio.Task[None], key: SessionKey, turn_id: str,
                            sub: Subscription) -> None:
        try:
            await asyncio.wait({before})
        except BaseException:
            sub.close()
            raise
        await self._follow(key, turn_id, sub)

    def _done(self, key: SessionKey, turn_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get((key, turn_id)) is task:
            del self._tasks[(key, turn_id)]
        if not task.cancelled() and task.exception() is not None:
            log.error("slack: delivering turn %s of %s failed", turn_id, key,
                      exc_info=task.exception())

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        key = (SessionKey("_", "_"), str(id(task)))
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._done(key[0], key[1], t))

    async def idle(self) -> None:
        """Wait until this process delivers nothing (tests, orderly shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def _follow(self, key: SessionKey, turn_id: str, sub: Subscription | None) -> None:
        rt = self.ctx.runtime
        try:
            (rec,) = await rt.store.turns(key, turn_id=turn_id) or (None,)
        except BaseException:
            if sub is not None:
                sub.close()
            raise
        state = reply_state(rec) if rec is not None else {}
        if rec is None or state.get("done") or (
                rec.request is not None and rec.request.id in (state.get("prompts") or {})
                and (sub is None or rec.status == "suspended")):
            # Delivered, or parked with its prompt posted (a click follows it again).
            if sub is not None:
                sub.close()
            return
        reply = ThreadReply(self.client, rt.store, key, rec)
        if sub is None:
            sub = rt.subscribe(key, reply.seq)
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
                if e.turn_id != turn_id or (e.type not in LIVE and e.seq <= reply.seq):
                    continue
                if await reply.on(e):
                    return
        finally:
            if waiting is not None:
                waiting.cancel()
            sub.close()

    # -- F9: deliver a turn nobody in Slack started ----------------------------------------

    async def deliver(self, target: Mapping[str, Any],
                      events: AsyncIterable[TurnEvent]) -> dict[str, Any]:
        """Post a turn's outcome with ``chat.postMessage`` (``receive()`` calls it).

        ``target``: ``channel_id`` and optionally ``thread_ts``. A turn that parked posts its
        prompt with Approve / Deny buttons. Returns ``{"channel", "ts"}`` of the post.

        Raises:
            ValueError: no ``channel_id`` in ``target``.
            SlackApiError: Slack refused the post (after its 429 retries).
        """
        channel = target.get("channel_id")
        if not channel:
            raise ValueError("a Slack target needs channel_id")
        thread = target.get("thread_ts")
        last: TurnEvent | None = None
        async for e in events:
            if e.ends_turn:  # its own end or park, not a subagent's
                last = e
        if last is None:
            raise ValueError("the turn has not ended: nothing to deliver")
        if last.type == "input.requested":
            req = last.to_dict()["request"]
            text, blocks = req["prompt"], prompt_blocks(last.session, last.turn_id, req)
        else:
            text, blocks = outcome(last), None
        kw: dict[str, Any] = {"channel": channel, "text": text}
        if thread:
            kw["thread_ts"] = thread
        if blocks:
            kw["blocks"] = blocks
        posted = await self.client.chat_postMessage(**kw)
        return {"channel": posted["channel"], "ts": posted["ts"]}


def _prompt_text(payload: Mapping[str, Any]) -> str:
    message = payload.get("message") or {}
    for block in message.get("blocks") or ():
        if block.get("type") == "section":
            return str((block.get("text") or {}).get("text") or "")
    return str(message.get("text") or "")


def _strip_mentions(text: str, bots: set[Any]) -> str:
    for bot in bots:
        text = text.replace(f"<@{bot}>", " ")
    if not bots:
        text = re.sub(r"^\s*<@[A-Z0-9]+>", " ", text)
    return " ".join(text.split())


def _refuse(status: int, message: str) -> Response:
    # A refusal Slack should not resend (a bad signature stays bad); a 500 it should.
    headers = {"X-Slack-No-Retry": "1"} if status < 500 else None
    return JSONResponse({"error": {"type": "SlackRequestRefused", "message": message}},
                        status_code=status, headers=headers)


__all__ = ["APPROVE", "DENY", "SUPERSEDED", "SlackChannel", "slack_channel"]
