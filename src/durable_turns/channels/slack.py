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

Outbound, each turn's reply streams into the thread. What is the same on every platform
with threads (the lifecycle, the turns, the clicks' answerer rules, the delivery and its
recovery) is :class:`~durable_turns.channels.thread_channel.ThreadChannel`'s; this module is
Slack's routes and its calls (``chat.startStream`` / ``appendStream`` / ``stopStream``, the
tool timeline as ``task_update`` chunks; the blocks in :mod:`.slack_thread`). What was
delivered is stored on the turn's chain entry (``AgentSession.set_turn_data``, name
``"slack"``): the stream's message ts, the event seq delivered up to, the approval prompts
posted. After a restart a half-streamed reply is
finished with ``chat.update``, and a click on a prompt posted before the restart resumes the
turn (the button carries the routing; the clicker's id comes from the signed payload).

One process should serve ``/slack/*`` (workers that drive turns may be many): deliveries
are deduplicated within the serving process.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs

try:
    # slack_sdk's AsyncWebClient needs aiohttp, which slack_sdk does not declare: fail here,
    # naming the extra, rather than at the first call to Slack.
    import aiohttp  # noqa: F401
    from slack_sdk.errors import SlackApiError
    from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
    from slack_sdk.signature import SignatureVerifier
    from slack_sdk.web.async_client import AsyncWebClient
    from slack_sdk.webhook.async_client import AsyncWebhookClient
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import BaseRoute, Route
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        "the Slack channel needs slack_sdk, aiohttp and starlette: "
        "pip install 'durable-turns[slack]'") from e

from .._input_limits import HttpError, loads, read_limited
from ..access import Authorize
from ..errors import ConfigurationError
from ..events import InputRequested, TurnEvent
from ..records import InputRequest
from ..runtime import Runtime
from ._slack_thread import APPROVE, DENY, chunk_json, prompt_blocks, text_blocks
from .thread_channel import Click, Said, ThreadChannel
from .threads import STREAM_IDLE, SUPERSEDED, Chunk, StreamEnded, Thread, outcome

log = logging.getLogger("durable_turns.slack")

MAX_BODY = 1 << 20
"""The largest request body read (1 MiB); Slack's are far smaller."""


def slack_channel(*, signing_secret: str, bot_token: str, agent: str | None = None,
                  replace_in_flight: bool = False, base_url: str | None = None,
                  stream_idle: float = STREAM_IDLE, rate_limit_retries: int = 3,
                  clock: Any = None, authorize: Authorize | None = None,
                  steer_in_flight: bool = False) -> SlackChannel:
    """A Slack channel for ``create_app(runtime, channels=[...])`` and ``receive()``.

    Args:
        signing_secret: the app's signing secret (Basic Information → App Credentials).
        bot_token: the bot token (``xoxb-…``).
        agent: the runtime's agent that answers (default: its only one).
        replace_in_flight: a message in a busy thread supersedes the running turn instead of
            queueing behind it (a parked approval is never superseded).
        steer_in_flight: a message in a busy thread joins the running turn at its next model
            call instead (F25); the turn's reply answers both.
        base_url: the Web API's base URL (default Slack's); point it at a test double.
        stream_idle: seconds without output after which a streamed reply is stopped.
        rate_limit_retries: how often a call answered 429 is retried after its
            ``Retry-After``.
        clock: ``slack_sdk.signature.Clock`` for the signature check (tests freeze time).
        authorize: the host's rule (``access.Authorize``), asked with the Slack user as the
            principal (``{"id": "U…", "source": "slack", "team": "T…"}``, attested by Slack's
            signature) before a message starts a turn (``turn``) and before a click answers
            (``resume``); refused, the user gets an ephemeral note and nothing is stored.
            Without it, anyone the bot hears in a thread may talk to it, and a request is
            answered by its answerers only (as always, after this rule too).

    Raises:
        ValueError: an empty secret or token, or both ``replace_in_flight`` and
            ``steer_in_flight``.
    """
    if not signing_secret or not bot_token:
        raise ValueError("slack_channel needs signing_secret and bot_token")
    return SlackChannel(signing_secret, bot_token, agent=agent,
                        replace_in_flight=replace_in_flight, base_url=base_url,
                        stream_idle=stream_idle, rate_limit_retries=rate_limit_retries,
                        clock=clock, authorize=authorize, steer_in_flight=steer_in_flight)


def slack_from_env(env: Mapping[str, str]) -> SlackChannel:
    """The Slack channel of ``durable-turns serve --channel slack`` and ``receive``:
    ``SLACK_BOT_TOKEN``, ``SLACK_SIGNING_SECRET`` (needed to serve Slack's requests, not to
    deliver) and ``SLACK_API_URL`` (optional) from ``env``.

    Raises:
        ConfigurationError: no ``SLACK_BOT_TOKEN``.
    """
    token = env.get("SLACK_BOT_TOKEN")
    if not token:
        # Only the token: delivering (receive) needs nothing else, and serving Slack's
        # requests says it needs the signing secret when it is mounted.
        raise ConfigurationError("the Slack channel needs SLACK_BOT_TOKEN in the environment")
    return SlackChannel(env.get("SLACK_SIGNING_SECRET") or None, token, agent=None,
                        replace_in_flight=False, base_url=env.get("SLACK_API_URL") or None,
                        stream_idle=STREAM_IDLE, rate_limit_retries=3, clock=None)


class SlackChannel(ThreadChannel):
    """A Slack app's two request URLs and its Web API calls, on the thread-channel base: a
    :class:`~durable_turns.channels.Channel`.

    Make one with :func:`slack_channel`.
    """

    name = "slack"
    """The event source of its turns (it selects ``surfaces={"slack": …}``, F10)."""

    def __init__(self, signing_secret: str | None, bot_token: str, *, agent: str | None,
                 replace_in_flight: bool, base_url: str | None, stream_idle: float,
                 rate_limit_retries: int, clock: Any,
                 authorize: Authorize | None = None, steer_in_flight: bool = False) -> None:
        super().__init__(agent=agent, replace_in_flight=replace_in_flight,
                         stream_idle=stream_idle, authorize=authorize, log=log,
                         steer_in_flight=steer_in_flight)
        kw: dict[str, Any] = {} if clock is None else {"clock": clock}
        # No secret: a channel that only delivers (receive); mount() refuses to serve.
        self.verifier = SignatureVerifier(signing_secret, **kw) if signing_secret else None
        self.client = AsyncWebClient(token=bot_token,
                                     base_url=base_url or "https://slack.com/api/")
        self.client.retry_handlers.append(
            AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries))

    def mount(self, runtime: Runtime) -> list[BaseRoute]:
        """Bind the channel to ``runtime``'s agent; returns its routes, ``POST /slack/events``
        and ``POST /slack/actions`` (``create_app`` calls it).

        Raises:
            ConfigurationError: no signing secret, ``agent`` is not the runtime's, or none
                was named and the runtime has more than one.
        """
        if self.verifier is None:
            raise ConfigurationError("serving Slack's requests needs its signing secret "
                                     "(SLACK_SIGNING_SECRET)")
        return super().mount(runtime)

    def routes(self) -> list[BaseRoute]:
        return [Route("/slack/events", self.events, methods=["POST"]),
                Route("/slack/actions", self.actions, methods=["POST"])]

    # -- inbound: the Events API -----------------------------------------------------------

    async def _verified(self, request: Request) -> bytes | Response:
        try:
            body = await read_limited(request.stream(), MAX_BODY)
        except HttpError as e:
            return _refuse(e.status, e.message)
        except ClientDisconnect:
            return _refuse(400, "the client left before its body came")
        stamp = request.headers.get("x-slack-request-timestamp", "")
        signature = request.headers.get("x-slack-signature", "")
        # What slack_sdk's check would choke on is refused first: a timestamp that is not a
        # whole number of seconds, a body that is not UTF-8 (Slack sends neither).
        if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12) or not signature:
            return _refuse(401, "invalid or stale Slack signature")
        try:
            body.decode()
            valid = self.verifier is not None and self.verifier.is_valid(body, stamp, signature)
        except (UnicodeDecodeError, ValueError):
            valid = False
        if not valid:
            return _refuse(401, "invalid or stale Slack signature")
        return body

    async def events(self, request: Request) -> Response:
        """``POST /slack/events``: verify, store the turn, acknowledge; reply in the
        background."""
        body = await self._verified(request)
        if isinstance(body, Response):
            return body
        try:
            envelope = loads(body)
            if not isinstance(envelope, dict):
                raise ValueError("not an object")
            message, bots = _message_event(envelope), _bots(envelope)
        except (HttpError, ValueError) as e:
            # Signed by Slack, but not what this app understands: sending it again changes
            # nothing.
            return _refuse(400, f"not an event this app takes: {e}")
        if envelope.get("type") == "url_verification":
            return JSONResponse({"challenge": envelope.get("challenge")})
        try:
            if message is not None and message["user"] not in bots:
                await self._on_event(envelope, message, bots)
        except Exception:
            log.exception("slack: event %s failed", envelope.get("event_id"))
            # Slack resends it (the turn id dedupes whatever was stored).
            return _refuse(500, "the event could not be stored; resend it")
        return Response(status_code=200)

    async def _on_event(self, envelope: dict[str, Any], event: dict[str, str],
                        bots: set[str]) -> None:
        channel, ts, user = event["channel"], event["ts"], event["user"]
        team = str(event.get("team") or envelope.get("team_id") or "")
        thread = event.get("thread_ts") or ts
        session = f"slack:{team}:{channel}:{thread}"
        if event["type"] == "message":
            in_thread = event.get("thread_ts") not in (None, ts)
            is_dm = event.get("channel_type") == "im"
            found = await self.ctx.session(session).summary() if in_thread else None
            if not is_dm and not (found is not None and found.exists and self.made(found)):
                return  # not a thread the bot is in (a session it made)
        text = _strip_mentions(event.get("text") or "", bots) or "(empty message)"
        await self.message(Said(
            session, f"slack:{channel}:{ts}", user, text, raw=envelope,
            route={"team": team, "channel": channel, "thread_ts": thread, "ts": ts,
                   "event_id": envelope.get("event_id")},
            principal={"team": team}))

    # -- inbound: interactivity (button clicks) --------------------------------------------

    async def actions(self, request: Request) -> Response:
        """``POST /slack/actions``: a click on Approve or Deny. Acknowledged at once; the
        answer and the message's update follow in the background."""
        body = await self._verified(request)
        if isinstance(body, Response):
            return body
        try:
            payload = loads(parse_qs(body.decode())["payload"][0])
            action = payload["actions"][0]
            route = loads(action["value"])
            clicker = _text(payload["user"]["id"])
            answer = {APPROVE: True, DENY: False}[action["action_id"]]
            session, turn_id, input_id = (_text(route[k]) for k in "sti")
            response_url = _text(payload["response_url"])
            prompt = _prompt_text(payload)
            team = str(_object(payload.get("team")).get("id") or "")
        except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError, HttpError):
            return _refuse(400, "not a durable_turns button click")
        self.click(Click(session, turn_id, input_id, answer, clicker,
                         reply={"response_url": response_url, "prompt": prompt},
                         principal={"team": team}))
        return Response(status_code=200)

    # -- the platform's calls --------------------------------------------------------------

    async def start_stream(self, thread: Thread, chunks: Sequence[Chunk]) -> str:
        kw: dict[str, Any] = {}
        if thread.user:
            kw.update(recipient_user_id=thread.user)
        if thread.route.get("team"):
            kw.update(recipient_team_id=str(thread.route["team"]))
        started = await self.client.chat_startStream(
            channel=_channel(thread), thread_ts=_thread_ts(thread),
            chunks=[chunk_json(c) for c in chunks], task_display_mode="timeline", **kw)
        return str(started["ts"])

    async def append_stream(self, thread: Thread, message: str,
                            chunks: Sequence[Chunk]) -> None:
        try:
            await self.client.chat_appendStream(channel=_channel(thread), ts=message,
                                                chunks=[chunk_json(c) for c in chunks])
        except SlackApiError as e:
            raise StreamEnded(str(e.response.get("error"))) from e

    async def stop_stream(self, thread: Thread, message: str,
                          chunks: Sequence[Chunk] = ()) -> None:
        try:
            await self.client.chat_stopStream(
                channel=_channel(thread), ts=message,
                chunks=[chunk_json(c) for c in chunks] if chunks else None)
        except SlackApiError as e:
            raise StreamEnded(str(e.response.get("error"))) from e

    async def post(self, thread: Thread, text: str) -> str:
        posted = await self.client.chat_postMessage(
            channel=_channel(thread), thread_ts=_thread_ts(thread), text=text,
            blocks=text_blocks(text))
        return str(posted["ts"])

    async def update(self, thread: Thread, message: str, text: str) -> None:
        await self.client.chat_update(channel=_channel(thread), ts=message, text=text,
                                      blocks=text_blocks(text))

    async def post_prompt(self, thread: Thread, request: InputRequest) -> str:
        posted = await self.client.chat_postMessage(
            channel=_channel(thread), thread_ts=_thread_ts(thread), text=request.prompt,
            blocks=prompt_blocks(thread.session, thread.turn_id, request))
        return str(posted["ts"])

    async def note(self, said: Said, text: str) -> None:
        await self.client.chat_postEphemeral(channel=str(said.route["channel"]),
                                             user=said.user,
                                             thread_ts=str(said.route["thread_ts"]), text=text)

    async def refuse_click(self, click: Click, text: str) -> None:
        await AsyncWebhookClient(click.reply["response_url"]).send(
            response_type="ephemeral", replace_original=False, text=text)

    async def answered(self, click: Click) -> None:
        prompt = click.reply["prompt"]
        verdict = f"{'Approved' if click.value else 'Denied'} by <@{click.by}>"
        await AsyncWebhookClient(click.reply["response_url"]).send(
            replace_original=True, text=f"{prompt}\n{verdict}", blocks=[
                {"type": "section", "text": {"type": "mrkdwn", "text": prompt}},
                {"type": "context", "elements": [{"type": "mrkdwn", "text": verdict}]},
            ])

    async def post_outcome(self, target: Mapping[str, Any], end: TurnEvent) -> dict[str, Any]:
        """``chat.postMessage`` at ``target``: ``channel_id`` and optionally ``thread_ts``.
        Returns ``{"channel", "ts"}`` of the post.

        Raises:
            ValueError: no ``channel_id`` in ``target``.
            SlackApiError: Slack refused the post (after its 429 retries).
        """
        channel = target.get("channel_id")
        if not channel:
            raise ValueError("a Slack target needs channel_id")
        kw: dict[str, Any] = {"channel": channel}
        if isinstance(end, InputRequested):
            kw.update(text=end.request.prompt,
                      blocks=prompt_blocks(end.session, end.turn_id, end.request))
        else:
            kw.update(text=outcome(end))
        if target.get("thread_ts"):
            kw["thread_ts"] = target["thread_ts"]
        posted = await self.client.chat_postMessage(**kw)
        return {"channel": posted["channel"], "ts": posted["ts"]}


def _channel(thread: Thread) -> str:
    return str(thread.route.get("channel"))


def _thread_ts(thread: Thread) -> str:
    return str(thread.route.get("thread_ts"))


def _prompt_text(payload: Mapping[str, Any]) -> str:
    """The prompt of the clicked message (its first section's text).

    Raises:
        TypeError: the message is not shaped as Slack sends it.
    """
    message = _object(payload.get("message"))
    for block in message.get("blocks") or ():
        if _object(block).get("type") == "section":
            return str(_object(block.get("text")).get("text") or "")
    return str(message.get("text") or "")


def _message_event(envelope: Mapping[str, Any]) -> dict[str, str] | None:
    """The event of an ``event_callback`` this app takes (a mention or a message from a
    person), its fields checked; ``None`` for any other event (ignored).

    Raises:
        ValueError: an event of that kind with a field of the wrong type.
    """
    event = envelope.get("event")
    if envelope.get("type") != "event_callback" or not isinstance(event, dict):
        return None
    if event.get("type") not in ("app_mention", "message"):
        return None
    if event.get("subtype") or event.get("bot_id") or not event.get("user"):
        return None  # edits, deletions, joins, bots (ourselves included)
    out: dict[str, str] = {"type": event["type"]}
    for name in ("user", "channel", "ts", "thread_ts", "team", "text", "channel_type"):
        value = event.get(name)
        if value is None and name not in ("user", "channel", "ts"):
            continue
        if not isinstance(value, str) or (name != "text" and not value):
            raise ValueError(f"its {name} is not a string")
        out[name] = value
    return out


def _bots(envelope: Mapping[str, Any]) -> set[str]:
    """The user ids of the bots the event was delivered to (this app's own among them).

    Raises:
        ValueError: ``authorizations`` is not a list.
    """
    found = envelope.get("authorizations") or []
    if not isinstance(found, list):
        raise ValueError("its authorizations are not a list")
    return {a["user_id"] for a in found if isinstance(a, dict) and a.get("is_bot")
            and isinstance(a.get("user_id"), str)}


def _text(value: Any) -> str:
    """``value`` if it is a non-empty string.

    Raises:
        TypeError: it is not.
    """
    if not isinstance(value, str) or not value:
        raise TypeError(f"expected a string, not {type(value).__name__}")
    return value


def _object(value: Any) -> Mapping[str, Any]:
    """``value`` if it is an object, ``{}`` for nothing.

    Raises:
        TypeError: something else.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, not {type(value).__name__}")
    return value


def _strip_mentions(text: str, bots: set[str]) -> str:
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


__all__ = ["APPROVE", "DENY", "SUPERSEDED", "SlackChannel", "slack_channel", "slack_from_env"]
