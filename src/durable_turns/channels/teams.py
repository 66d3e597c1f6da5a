"""The Microsoft Teams channel (F28): an agent people talk to in Teams chats and channels.

``teams_channel(...)`` gives a :class:`TeamsChannel`; ``create_app(runtime, channels=[teams])``
mounts it at ``/teams/messages`` (the bot's messaging endpoint). Every request's Bot
Framework token is checked before anything runs (:mod:`._teams_auth`: the OpenID metadata's
keys, issuer, audience = the app id, expiry, the ``serviceurl`` claim); an unverified one is
401. Outbound calls are the Teams SDK's (``microsoft-teams-api``'s ``ConversationClient``,
pointed at each conversation's ``serviceUrl``), a 429 retried after its ``Retry-After``.

Inbound, a message activity becomes a turn of session ``teams:<conversation id>`` (a 1:1
chat, a group chat, or one reply chain of a channel: its conversation id names the chain)
whose id is ``teams:<conversation id>:<activity id>``, spoken by the sender's Microsoft
Entra (AAD) object id. The turn is durable before the request is answered; the reply is
delivered in the background: streamed in a 1:1 chat (Teams' streaming protocol: ``typing``
activities with ``streaminfo``, informative ones while only tools run, then the text so far,
then the ``final`` message), posted and updated in place
elsewhere. A park posts an Adaptive Card; its ``Action.Execute`` click is an invoke, answered
in its own response (the card for the clicker, or a note only the clicker sees).

What is the same on every platform with threads is
:class:`~durable_turns.channels.thread_channel.ThreadChannel`'s; this module is Teams' route
and its calls (the cards in :mod:`._teams_cards`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

try:
    import httpx
    from microsoft_teams.api.activities import ActivityParams, TypingActivityInput
    from microsoft_teams.api.activities.message import MessageActivityInput
    from microsoft_teams.api.clients.conversation import ConversationClient
    from microsoft_teams.api.models import Account, Attachment, ChannelData
    from microsoft_teams.common import Client, ClientOptions
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import BaseRoute, Route

    from ._teams_auth import (
        LOGIN,
        OPENID_METADATA,
        BotFrameworkVerifier,
        BotToken,
        RetryAfter,
        Unverified,
    )
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("the Teams channel needs microsoft-teams-api, msal, PyJWT and starlette: "
                      "pip install 'durable-turns[teams]'") from e

from .._input_limits import HttpError, loads, read_limited
from ..access import Authorize
from ..errors import ConfigurationError
from ..events import InputRequested, TurnEvent
from ..records import InputRequest
from ..sessions import AgentSession
from ._teams_cards import (
    CARD,
    MESSAGE,
    Growing,
    answer_of,
    answered_card,
    prompt_card,
    verdict,
)
from .thread_channel import Click, Said, ThreadChannel
from .threads import STREAM_IDLE, Chunk, StreamEnded, Thread, outcome

log = logging.getLogger("durable_turns.teams")

MAX_BODY = 1 << 20
"""The largest request body read (1 MiB)."""
SERVICE_URL = "https://smba.trafficmanager.net/teams/"
"""The Bot Connector a proactive delivery goes to when its target names none."""
STREAM_INTERVAL = 1.0
"""Seconds between two updates of a streamed (or updated in place) reply, at least: Teams
throttles a bot that streams faster; the text is sent whole, so none is lost."""


def teams_channel(*, app_id: str, password: str | None = None,
                  certificate: Mapping[str, str] | None = None, tenant: str | None = None,
                  token: Any = None, agent: str | None = None,
                  replace_in_flight: bool = False, steer_in_flight: bool = False,
                  service_url: str = SERVICE_URL, openid_metadata_url: str = OPENID_METADATA,
                  login_url: str = LOGIN, stream_idle: float = STREAM_IDLE,
                  stream_interval: float = STREAM_INTERVAL, rate_limit_retries: int = 3,
                  authorize: Authorize | None = None) -> TeamsChannel:
    """A Teams channel for ``create_app(runtime, channels=[...])`` and ``receive()``.

    Args:
        app_id: the bot's Microsoft App ID (Azure Bot → Configuration).
        password: its client secret; or
        certificate: ``{"private_key": PEM, "thumbprint": hex}``; or
        token: the bot's token itself, a string or a callable that returns one (awaitable
            or not): a test double's, or your own token source.
        tenant: the bot's tenant id (a single-tenant bot); default ``botframework.com``.
        agent: the runtime's agent that answers (default: its only one).
        replace_in_flight: a message in a busy conversation supersedes the running turn
            instead of queueing behind it (a parked approval is never superseded).
        steer_in_flight: a message in a busy conversation joins the running turn instead.
        service_url: the Bot Connector of a proactive delivery whose target names none.
        openid_metadata_url: Bot Framework's OpenID metadata (point it at a test double).
        login_url: Entra ID's login endpoint (the bot's token).
        stream_idle: seconds without output after which a streamed reply is stopped.
        stream_interval: seconds between two updates of a reply being written, at least.
        rate_limit_retries: how often a call answered 429 is retried after ``Retry-After``.
        authorize: the host's rule (``access.Authorize``), asked with the Teams user as the
            principal (``{"id": AAD object id, "source": "teams", "tenant", "teams_id"}``)
            before a message starts a turn and before a click answers.

    Raises:
        ValueError: no app id, or no password, certificate nor token.
    """
    if not app_id:
        raise ValueError("teams_channel needs app_id")
    if token is None:
        if not password and not certificate:
            raise ValueError("teams_channel needs password, certificate or token")
        token = BotToken(app_id, password=password, certificate=certificate,
                         tenant=tenant or "botframework.com", login=login_url)
    return TeamsChannel(app_id, token, agent=agent, replace_in_flight=replace_in_flight,
                        steer_in_flight=steer_in_flight, service_url=service_url,
                        openid_metadata_url=openid_metadata_url, stream_idle=stream_idle,
                        stream_interval=stream_interval, rate_limit_retries=rate_limit_retries,
                        authorize=authorize)


def teams_from_env(env: Mapping[str, str]) -> TeamsChannel:
    """The Teams channel of ``durable-turns serve --channel teams`` and ``receive``, from
    ``TEAMS_APP_ID``, ``TEAMS_APP_PASSWORD`` (or ``TEAMS_BOT_TOKEN``, a fixed token: a test
    double's), ``TEAMS_TENANT_ID``, ``TEAMS_SERVICE_URL``, ``TEAMS_OPENID_METADATA_URL`` and
    ``TEAMS_LOGIN_URL`` (all but the first two optional).

    Raises:
        ConfigurationError: no ``TEAMS_APP_ID``, or neither a password nor a token.
    """
    app_id = env.get("TEAMS_APP_ID")
    if not app_id or not (env.get("TEAMS_APP_PASSWORD") or env.get("TEAMS_BOT_TOKEN")):
        raise ConfigurationError("the Teams channel needs TEAMS_APP_ID and TEAMS_APP_PASSWORD "
                                 "in the environment")
    return teams_channel(
        app_id=app_id, password=env.get("TEAMS_APP_PASSWORD") or None,
        token=env.get("TEAMS_BOT_TOKEN") or None, tenant=env.get("TEAMS_TENANT_ID") or None,
        service_url=env.get("TEAMS_SERVICE_URL") or SERVICE_URL,
        openid_metadata_url=env.get("TEAMS_OPENID_METADATA_URL") or OPENID_METADATA,
        login_url=env.get("TEAMS_LOGIN_URL") or LOGIN)


class TeamsChannel(ThreadChannel):
    """A Teams bot's messaging endpoint and its Bot Connector calls, on the thread-channel
    base: a :class:`~durable_turns.channels.Channel`. Make one with :func:`teams_channel`."""

    name = "teams"
    """The event source of its turns (it selects ``surfaces={"teams": …}``, F10)."""

    def __init__(self, app_id: str, token: Any, *, agent: str | None, replace_in_flight: bool,
                 steer_in_flight: bool, service_url: str, openid_metadata_url: str,
                 stream_idle: float, stream_interval: float, rate_limit_retries: int,
                 authorize: Authorize | None) -> None:
        super().__init__(agent=agent, replace_in_flight=replace_in_flight,
                         stream_idle=stream_idle, authorize=authorize, log=log,
                         steer_in_flight=steer_in_flight)
        self.app_id = app_id
        self.service_url = service_url
        self.stream_interval = stream_interval
        self.verifier = BotFrameworkVerifier(app_id, metadata_url=openid_metadata_url)
        self.token = token
        self.http = Client(ClientOptions(token=token))
        """The Teams SDK's HTTP client: the bot's token on every call, a 429 retried after
        its ``Retry-After``."""
        self.http.use(RetryAfter(rate_limit_retries))
        self._conversations: dict[str, ConversationClient] = {}
        self._growing: dict[str, Growing] = {}  # this process's open streams, by message id

    def routes(self) -> list[BaseRoute]:
        return [Route("/teams/messages", self.messages, methods=["POST"])]

    async def stop(self) -> None:
        """Let deliveries finish for a few seconds, end them, and close the connections."""
        try:
            await super().stop()
        finally:
            await self.http.http.aclose()
            await self.verifier.http.aclose()
            if isinstance(self.token, BotToken):
                self.token.close()

    # -- inbound -----------------------------------------------------------------------------

    async def messages(self, request: Request) -> Response:
        """``POST /teams/messages``: verify, then store a message's turn (or answer a card's
        click) and answer; the reply follows in the background."""
        try:
            body = await read_limited(request.stream(), MAX_BODY)
            activity = loads(body)
        except (HttpError, ClientDisconnect, ValueError):
            activity = None
        service_url = activity.get("serviceUrl") if isinstance(activity, dict) else None
        try:
            await self.verifier.verify(request.headers.get("authorization", ""),
                                       service_url if isinstance(service_url, str) else "")
        except Unverified as e:
            log.info("teams: refused a request: %s", e)
            return _refuse(401, "the request's Bot Framework token does not verify")
        if not isinstance(activity, dict):
            return _refuse(400, "not an activity")
        try:
            click = activity.get("type") == "invoke" and activity.get(
                "name") == "adaptiveCard/action"
            if click:
                return JSONResponse(await self._on_click(activity))
            said = self._said(activity) if activity.get("type") == "message" else None
        except (KeyError, TypeError, ValueError) as e:
            return _refuse(400, f"not an activity this bot takes: {e}")
        except Exception:
            log.exception("teams: the click %s failed", activity.get("id"))
            return _refuse(500, "the click could not be answered; click again")
        if said is not None:
            try:
                await self.message(said)
            except Exception:
                log.exception("teams: activity %s failed", activity.get("id"))
                return _refuse(500, "the activity could not be stored; send it again")
        return Response(status_code=200)

    def _said(self, activity: Mapping[str, Any]) -> Said | None:
        conversation, sender = _object(activity["conversation"]), _object(activity["from"])
        cid, aid = _text(conversation["id"]), _text(activity["id"])
        aad = sender.get("aadObjectId")
        if not isinstance(aad, str) or not aad or sender.get("id") == _bot(activity).get("id"):
            return None  # no verified person behind it (the bot itself, a connector)
        text = _strip_mentions(activity, str(activity.get("text") or ""))
        tenant = str(conversation.get("tenantId") or _object(
            _object(activity.get("channelData")).get("tenant")).get("id") or "")
        route = {"service_url": _text(activity["serviceUrl"]), "conversation_id": cid,
                 "conversation_type": str(conversation.get("conversationType") or "personal"),
                 "activity_id": aid, "tenant_id": tenant, "user": _text(sender["id"]),
                 "bot": dict(_bot(activity))}
        return Said(self.session_of(cid), f"teams:{cid}:{aid}", aad, text or "(empty message)",
                    route, principal={"tenant": tenant, "teams_id": sender["id"]}, raw=activity)

    async def _on_click(self, activity: Mapping[str, Any]) -> dict[str, Any]:
        action = _object(_object(activity.get("value")).get("action"))
        data = _object(action.get("data"))
        session, turn_id, input_id = (_text(data[k]) for k in "sti")
        aad = _object(activity["from"]).get("aadObjectId")
        if not isinstance(aad, str) or not aad:
            return _note("This click came from nobody Teams could name.")
        rec = await self.ctx.session(session).entry(turn_id)
        if rec is None or (rec.event or {}).get("source") != self.name:
            # The card's data is the client's to send: it never reaches another source's turns.
            return _note("This card answers no request of this bot.")
        schema = next((r.schema for r in (rec.request.all if rec.request else ())
                       if r.id == input_id), None)
        try:
            value = answer_of(str(action.get("verb")), data, schema)
        except ValueError as e:
            return _note(f"That answer doesn't fit the request: {e}")
        out: dict[str, Any] = {}
        await self.answer_click(Click(
            session, turn_id, input_id, value, aad,
            reply={"out": out, "service_url": _text(activity["serviceUrl"]),
                   "conversation_id": _text(_object(activity["conversation"])["id"]),
                   "activity_id": activity.get("replyToId"),
                   "prompt": str(data.get("p") or ""),
                   "name": str(_object(activity["from"]).get("name") or aad)},
            principal={"tenant": str(_object(activity["conversation"]).get("tenantId") or ""),
                       "teams_id": _object(activity["from"]).get("id")}))
        return out.get("response") or _note("Answered.")

    # -- the platform's calls ----------------------------------------------------------------

    def conversations(self, service_url: str) -> ConversationClient:
        """The Teams SDK's client of a conversation's Bot Connector (its ``serviceUrl``)."""
        if service_url not in self._conversations:
            self._conversations[service_url] = ConversationClient(service_url, self.http)
        return self._conversations[service_url]

    async def _create(self, route: Mapping[str, Any], activity: ActivityParams) -> str:
        activity.reply_to_id = route.get("activity_id") or None
        client = self.conversations(str(route["service_url"]))
        try:
            return (await client.create_activity(str(route["conversation_id"]), activity)).id
        except httpx.HTTPStatusError as e:
            if e.response.status_code == 403 and activity.entities:
                raise StreamEnded(e.response.text) from e  # Teams ends streams with a 403
            raise

    async def _update(self, route: Mapping[str, Any], message: str,
                      activity: ActivityParams) -> None:
        await self.conversations(str(route["service_url"])).update_activity(
            str(route["conversation_id"]), message, activity)

    async def start_stream(self, thread: Thread, chunks: Sequence[Chunk]) -> str:
        grow = Growing()
        grow.add(chunks)
        grow.streams = thread.route.get("conversation_type") == "personal"  # 1:1 chats only
        message = ""
        if grow.streams:
            grow.sequence = 1
            try:
                message = await self._create(thread.route, _streamed(grow))
            except StreamEnded as e:  # streaming refused (for this user, this tenant)
                log.warning("teams: streaming refused (%s); updating in place instead", e)
                grow.streams = grow.streaming = False
        if not message:
            message = await self._create(thread.route, MessageActivityInput(text=grow.render()))
        grow.sent = time.monotonic()
        self._growing[message] = grow
        return message

    async def append_stream(self, thread: Thread, message: str,
                            chunks: Sequence[Chunk]) -> None:
        grow = self._growing.get(message)
        if grow is None:
            raise StreamEnded("not a stream of this process")
        grow.add(chunks)
        if time.monotonic() - grow.sent < self.stream_interval:
            return  # sent whole with the next one, or the last
        grow.sent = time.monotonic()
        if grow.streams:
            grow.sequence += 1
            await self._create(thread.route, _streamed(grow, message))
        else:
            await self._update(thread.route, message, MessageActivityInput(text=grow.render()))

    async def stop_stream(self, thread: Thread, message: str,
                          chunks: Sequence[Chunk] = ()) -> None:
        grow = self._growing.pop(message, None)
        if grow is None:
            raise StreamEnded("not a stream of this process")
        grow.add(chunks)
        final = MessageActivityInput(text=grow.render())
        if grow.streams:
            await self._create(thread.route, final.with_id(message).add_stream_final())
        else:
            await self._update(thread.route, message, final)

    async def post(self, thread: Thread, text: str) -> str:
        return await self._create(thread.route, MessageActivityInput(text=text))

    async def update(self, thread: Thread, message: str, text: str) -> None:
        self._growing.pop(message, None)
        await self._update(thread.route, message, MessageActivityInput(text=text))

    async def post_prompt(self, thread: Thread, request: InputRequest) -> str:
        return await self._create(thread.route, _card_message(
            prompt_card(thread.session, thread.turn_id, request)))

    async def note(self, said: Said, text: str) -> None:
        """In a 1:1 chat, a reply; elsewhere a targeted message only the speaker sees."""
        if said.route.get("conversation_type") == "personal":
            await self._create(said.route, MessageActivityInput(text=text))
            return
        activity = MessageActivityInput(text=text).with_recipient(
            Account(id=str(said.route["user"])))
        url = (f"{str(said.route['service_url']).rstrip('/')}/v3/conversations/"
               f"{said.route['conversation_id']}/activities?isTargetedActivity=true")
        await self.http.post(
            url, json=activity.model_dump(by_alias=True, exclude_none=True))

    async def refuse_click(self, click: Click, text: str) -> None:
        click.reply["out"]["response"] = _note(text)

    async def answered(self, click: Click) -> None:
        said = verdict(click.value, click.reply["name"])
        card = answered_card(click.reply["prompt"], said)
        click.reply["out"]["response"] = {"statusCode": 200, "type": CARD, "value": card}
        if click.reply.get("activity_id"):  # everyone else sees the card updated too
            try:
                await self._update(click.reply, str(click.reply["activity_id"]),
                                   _card_message(card))
            except httpx.HTTPError as e:  # answered all the same; the clicker sees it
                log.warning("teams: updating the card %s failed: %s",
                            click.reply["activity_id"], e)

    async def post_outcome(self, target: Mapping[str, Any], end: TurnEvent) -> dict[str, Any]:
        """A proactive message in the conversation ``target`` names: ``conversation_id`` (or
        ``channel_id``) and ``service_url`` (default the channel's). Returns ``{"service_url",
        "conversation_id", "id"}``.

        Raises:
            ValueError: no conversation in ``target``.
            httpx.HTTPStatusError: the Bot Connector refused (after its 429 retries).
        """
        conversation = target.get("conversation_id") or target.get("channel_id")
        if not conversation:
            raise ValueError("a Teams target needs conversation_id")
        route = {"service_url": target.get("service_url") or self.service_url,
                 "conversation_id": conversation}
        if isinstance(end, InputRequested):
            activity: ActivityParams = _card_message(
                prompt_card(end.session, end.turn_id, end.request))
        else:
            activity = MessageActivityInput(text=outcome(end))
        return {**route, "id": await self._create(route, activity)}

    async def reference(self, session: AgentSession) -> dict[str, Any] | None:
        """The conversation reference of a session this channel heard (its last turn's):
        a ``deliver()`` / ``receive()`` target that posts there proactively."""
        for rec in reversed(await session.chain()):
            route = (rec.event or {}).get("meta") or {}
            if (rec.event or {}).get("source") == self.name and route.get("conversation_id"):
                return {"conversation_id": route["conversation_id"],
                        "service_url": route["service_url"],
                        "tenant_id": route.get("tenant_id", "")}
        return None


def _streamed(grow: Growing, message: str | None = None) -> TypingActivityInput:
    """The next activity of a stream: informative (a status line) until there is text, then
    the text so far."""
    grow.streaming = grow.streaming or bool(grow.text.strip())
    activity = TypingActivityInput().with_text(grow.render() if grow.streaming
                                               else grow.status())
    if not grow.streaming:
        activity.with_channel_data(ChannelData(stream_type="informative"))
    if message is not None:
        activity.with_id(message)
    return activity.add_stream_update(grow.sequence)


def _card_message(card: Mapping[str, Any]) -> MessageActivityInput:
    return MessageActivityInput().add_attachments(
        Attachment(content_type=CARD, content=dict(card)))


def _note(text: str) -> dict[str, Any]:
    return {"statusCode": 200, "type": MESSAGE, "value": text}


def _bot(activity: Mapping[str, Any]) -> Mapping[str, Any]:
    return _object(activity.get("recipient"))


def _strip_mentions(activity: Mapping[str, Any], text: str) -> str:
    """The text without the mentions of the bot (``<at>Bot</at>``)."""
    bot = _bot(activity).get("id")
    for entity in activity.get("entities") or ():
        if isinstance(entity, dict) and entity.get("type") == "mention" and _object(
                entity.get("mentioned")).get("id") == bot and isinstance(entity.get("text"), str):
            text = text.replace(entity["text"], " ")
    return " ".join(text.split())


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"expected a string, not {type(value).__name__}")
    return value


def _object(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, not {type(value).__name__}")
    return value


def _refuse(status: int, message: str) -> Response:
    return JSONResponse({"error": {"type": "TeamsRequestRefused", "message": message}},
                        status_code=status)


__all__ = ["SERVICE_URL", "STREAM_INTERVAL", "TeamsChannel", "teams_channel", "teams_from_env"]
