"""A local fake of the Bot Connector service (Teams' side of a bot), and of Bot Framework's
OpenID metadata, for the tests.

The connector answers as Teams does (per the Bot Connector REST API and Teams' streaming
protocol): ``POST /v3/conversations/{id}/activities`` creates an activity and answers
``{"id"}``; ``POST …/activities/{id}`` replies to one; ``PUT …/activities/{id}`` updates one;
``?isTargetedActivity=true`` creates one only its ``recipient`` sees. A ``typing`` activity
with a ``streaminfo`` entity opens a stream (its first answers the stream id) or appends to
it (its ``streamSequence`` must grow; its text is the whole text so far); a ``message``
with ``streamType: final`` ends it; ``informative`` updates (a status line) are taken
before the first text only. Streaming is refused (403) outside a 1:1 chat, and on a
stream that ended (``expire_streams``: 403 "exceeded streaming time", as Teams ends a stream
after two minutes). Every call must carry ``Authorization: Bearer TOKEN``; one-shot 429s with
``Retry-After``. Every call is logged, and a test waits on the log with
:meth:`TeamsFake.wait` (woken by each call, bounded by a timeout).

The same app serves the OpenID metadata document and its keys (``/v1/.well-known/…``); the
inbound helpers build activities the way Teams does and sign their tokens with the fake's
keys (or a stranger's, or none).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from jwt.algorithms import RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

APP_ID = "00000000-0000-0000-0000-0000000000b0"
"""The bot's app id (its tokens' audience)."""
TOKEN = "bot-access-token"
"""The bot's own token, which the connector requires."""
ISSUER = "https://api.botframework.com"
TENANT = "tenant-1"
BOT = {"id": f"28:{APP_ID}", "name": "Helper"}
PERSONAL = "a:1personal-chat"
"""A 1:1 chat with ALICE."""
CHANNEL = "19:general@thread.tacv2;messageid=1700000000001"
"""A reply chain of a team's channel."""
ALICE = "aad-alice"
BOB = "aad-bob"
WAIT = 30.0

_KEYS = itertools.count(1)


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class Activity:
    """An activity the fake holds (the bot's)."""

    conversation: str
    id: str
    type: str
    text: str = ""
    attachments: list[dict[str, Any]] = field(default_factory=list)
    reply_to: str | None = None
    streaming: bool = False
    sequence: int = 0
    edited: bool = False
    targeted_for: str | None = None
    texts: list[str] = field(default_factory=list)
    """Every text it showed, in order (a stream's each step)."""
    statuses: list[str] = field(default_factory=list)
    """A stream's informative updates (shown before its text)."""

    @property
    def card(self) -> dict[str, Any] | None:
        for a in self.attachments:
            if a.get("contentType") == "application/vnd.microsoft.card.adaptive":
                return dict(a["content"])
        return None


class TeamsFake:
    """The fake's state; ``app`` is its Starlette app; ``base`` its URL (set by the test)."""

    def __init__(self) -> None:
        self.key = new_key()
        self.kid = f"key-{next(_KEYS)}"
        self.base = ""
        self.conversations: dict[str, str] = {PERSONAL: "personal", CHANNEL: "channel"}
        self.activities: dict[str, Activity] = {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        """``(method, path, body)`` of every connector call."""
        self.rate_limits: list[int] = []
        self.metadata_reads = 0
        self.streaming_allowed = True
        """False: Teams refuses the bot's streams (403) in 1:1 chats too."""
        self.password = "bot-password"
        """The bot's client secret, which the login endpoint takes for ``TOKEN``."""
        self.token_requests: list[dict[str, str]] = []
        self._ids = itertools.count(1)
        self._changed: asyncio.Condition | None = None
        self.app = Starlette(routes=[
            Route("/v1/.well-known/openidconfiguration", self.metadata, methods=["GET"]),
            Route("/v1/.well-known/keys", self.keys, methods=["GET"]),
            Route("/{tenant}/v2.0/.well-known/openid-configuration", self.login_metadata,
                  methods=["GET"]),
            Route("/{tenant}/oauth2/v2.0/token", self.login_token, methods=["POST"]),
            Route("/v3/conversations/{cid}/activities", self.create, methods=["POST"]),
            Route("/v3/conversations/{cid}/activities/{aid}", self.reply, methods=["POST"]),
            Route("/v3/conversations/{cid}/activities/{aid}", self.update, methods=["PUT"]),
        ])

    # -- for the tests ---------------------------------------------------------------------

    @property
    def metadata_url(self) -> str:
        return f"{self.base}/v1/.well-known/openidconfiguration"

    def rate_limit(self, retry_after: int = 0, times: int = 1) -> None:
        """Answer the next ``times`` connector calls with 429 and ``Retry-After``."""
        self.rate_limits.extend([retry_after] * times)

    def expire_streams(self) -> int:
        live = [a for a in self.activities.values() if a.streaming]
        for a in live:
            a.streaming = False
        return len(live)

    def in_conversation(self, cid: str) -> list[Activity]:
        """The bot's activities everyone in the conversation sees, oldest first."""
        return [a for a in self.activities.values()
                if a.conversation == cid and a.targeted_for is None]

    def targeted(self, user_id: str) -> list[Activity]:
        return [a for a in self.activities.values() if a.targeted_for == user_id]

    def prompt(self, cid: str) -> Activity | None:
        return next((a for a in self.in_conversation(cid) if a.card and any(
            x.get("type") == "Action.Execute" for x in a.card.get("actions", []))), None)

    async def wait(self, cond: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        """Wait until ``cond()`` is truthy (checked after every call the fake answers)."""
        changed = self._condition()
        async with changed:
            try:
                async with asyncio.timeout(timeout):
                    while not (found := cond()):
                        await changed.wait()
            except TimeoutError:
                raise AssertionError(f"timed out waiting for {what}; calls: "
                                     f"{[(m, p) for m, p, _ in self.calls]}") from None
        return found

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        changed = self._condition()
        async with changed:
            changed.notify_all()

    # -- OpenID metadata -------------------------------------------------------------------

    async def metadata(self, request: Request) -> Response:
        self.metadata_reads += 1
        return JSONResponse({"issuer": ISSUER, "jwks_uri": f"{self.base}/v1/.well-known/keys",
                             "id_token_signing_alg_values_supported": ["RS256"],
                             "token_endpoint_auth_methods_supported": ["private_key_jwt"]})

    async def keys(self, request: Request) -> Response:
        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        jwk.update(kid=self.kid, use="sig", endorsements=["msteams"])
        return JSONResponse({"keys": [jwk]})

    # -- Entra ID's login endpoint (the bot's own token) ----------------------------------

    async def login_metadata(self, request: Request) -> Response:
        root = f"{str(request.base_url).rstrip('/')}/{request.path_params['tenant']}"
        return JSONResponse({"token_endpoint": f"{root}/oauth2/v2.0/token",
                             "authorization_endpoint": f"{root}/oauth2/v2.0/authorize",
                             "issuer": f"{root}/v2.0"})

    async def login_token(self, request: Request) -> Response:
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
        self.token_requests.append(form)
        if form.get("grant_type") != "client_credentials" or form.get("client_id") != APP_ID \
                or form.get("scope") != "https://api.botframework.com/.default":
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        if form.get("client_secret") != self.password:
            return JSONResponse({"error": "invalid_client",
                                 "error_description": "AADSTS7000215: Invalid client secret"},
                                status_code=401)
        return JSONResponse({"token_type": "Bearer", "expires_in": 3599,
                             "access_token": TOKEN})

    # -- the connector ---------------------------------------------------------------------

    async def _call(self, request: Request, handle: Callable[[str, dict[str, Any]], Response]
                    ) -> Response:
        body = json.loads(await request.body() or b"{}")
        self.calls.append((request.method, request.url.path, body))
        try:
            if self.rate_limits:
                return JSONResponse({"error": {"code": "TooManyRequests"}}, status_code=429,
                                    headers={"Retry-After": str(self.rate_limits.pop(0))})
            if request.headers.get("authorization") != f"Bearer {TOKEN}":
                return _error(401, "Unauthorized", "Authorization has been denied")
            cid = request.path_params["cid"]
            if cid not in self.conversations:
                return _error(404, "ConversationNotFound", "Conversation not found.")
            if request.query_params.get("isTargetedActivity") == "true":
                recipient = (body.get("recipient") or {}).get("id")
                if not recipient:
                    return _error(400, "BadArgument", "a targeted activity needs a recipient")
                body["_targeted"] = recipient
            return handle(cid, body)
        finally:
            await self._notify()

    def _new_id(self) -> str:
        return f"{int(time.time() * 1000)}{next(self._ids):04d}"

    def _stream(self, cid: str, body: dict[str, Any]) -> Response | None:
        info = next((e for e in body.get("entities") or [] if e.get("type") == "streaminfo"),
                    None)
        if info is None:
            return None
        if self.conversations[cid] != "personal" or not self.streaming_allowed:
            return _error(403, "BadArgument", "Message streaming is not allowed in this "
                                              "conversation")
        kind, sid = info.get("streamType"), info.get("streamId")
        if sid is None:
            if body.get("type") != "typing" or info.get("streamSequence") != 1:
                return _error(400, "BadArgument", "a stream starts with sequence 1")
            informative = kind == "informative"
            a = Activity(cid, self._new_id(), "message", "" if informative else
                         body.get("text") or "", reply_to=body.get("replyToId"),
                         streaming=True, sequence=1,
                         texts=[] if informative else [body.get("text") or ""],
                         statuses=[body.get("text") or ""] if informative else [])
            self.activities[a.id] = a
            return JSONResponse({"id": a.id}, status_code=201)
        s = self.activities.get(sid)
        if s is None:
            return _error(404, "NotFound", "no such stream")
        if not s.streaming:
            return _error(403, "ContentStreamNotAllowed",
                          "Content stream finished due to exceeded streaming time.")
        if kind == "final":
            if body.get("type") != "message":
                return _error(400, "BadArgument", "a stream ends with a message")
            s.text, s.streaming = body.get("text") or "", False
            s.attachments = list(body.get("attachments") or [])
            s.texts.append(s.text)
            return JSONResponse({"id": s.id}, status_code=201)
        seq = info.get("streamSequence")
        if not isinstance(seq, int) or seq <= s.sequence:
            return _error(400, "BadArgument", "streamSequence must grow")
        s.sequence = seq
        if kind == "informative":
            if s.texts:
                return _error(400, "BadArgument", "informative updates come before the text")
            s.statuses.append(body.get("text") or "")
        else:
            s.text = body.get("text") or ""
            s.texts.append(s.text)
        return JSONResponse({}, status_code=202)

    def _create(self, cid: str, body: dict[str, Any], reply_to: str | None = None
                ) -> Response:
        streamed = self._stream(cid, body)
        if streamed is not None:
            return streamed
        if body.get("type") == "typing":
            return JSONResponse({}, status_code=200)
        if body.get("type") != "message" or not (body.get("text") or body.get("attachments")):
            return _error(400, "BadArgument", "an activity needs text or attachments")
        a = Activity(cid, self._new_id(), "message", body.get("text") or "",
                     list(body.get("attachments") or []), reply_to or body.get("replyToId"),
                     targeted_for=body.get("_targeted"), texts=[body.get("text") or ""])
        self.activities[a.id] = a
        return JSONResponse({"id": a.id}, status_code=201)

    async def create(self, request: Request) -> Response:
        return await self._call(request, self._create)

    async def reply(self, request: Request) -> Response:
        aid = request.path_params["aid"]
        return await self._call(request, lambda cid, body: self._create(cid, body, aid))

    async def update(self, request: Request) -> Response:
        aid = request.path_params["aid"]

        def handle(cid: str, body: dict[str, Any]) -> Response:
            a = self.activities.get(aid)
            if a is None or a.conversation != cid:
                return _error(404, "ActivityNotFound", "Activity not found.")
            if not (body.get("text") or body.get("attachments")):
                return _error(400, "BadArgument", "an activity needs text or attachments")
            a.text, a.attachments = body.get("text") or "", list(body.get("attachments") or [])
            a.edited, a.streaming = True, False
            a.texts.append(a.text)
            return JSONResponse({"id": a.id})

        return await self._call(request, handle)

    # -- Teams' side of the inbound requests -----------------------------------------------

    def token(self, *, key: rsa.RSAPrivateKey | None = None, kid: str | None = None,
              alg: str = "RS256", **claims: Any) -> str:
        """A Bot Connector token for the bot: valid unless ``claims`` (``aud``, ``iss``,
        ``exp``, ``serviceurl``, …) or ``key`` say otherwise; ``alg="none"``: unsigned."""
        now = int(time.time())
        body: dict[str, Any] = {"iss": ISSUER, "aud": APP_ID, "serviceurl": self.base,
                                "nbf": now - 5, "exp": now + 3600, "iat": now - 5, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        if alg == "none":
            return jwt.encode(body, "", algorithm="none", headers={"kid": kid or self.kid})
        return jwt.encode(body, key or self.key, algorithm=alg,
                          headers={"kid": kid or self.kid})

    def headers(self, **kw: Any) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(**kw)}",
                "Content-Type": "application/json"}

    def message(self, text: str, *, conversation: str = PERSONAL, aad: str = ALICE,
                mention: bool = True, activity_id: str | None = None) -> dict[str, Any]:
        """A message activity as Teams sends it (in a channel, the bot @mentioned)."""
        ctype = self.conversations[conversation]
        user = {"id": f"29:{aad}", "name": aad.removeprefix("aad-").title(), "aadObjectId": aad}
        entities: list[dict[str, Any]] = [{"type": "clientInfo", "locale": "en-US"}]
        if mention and ctype != "personal":
            text = f"<at>{BOT['name']}</at> {text}"
            entities.append({"type": "mention", "text": f"<at>{BOT['name']}</at>",
                             "mentioned": dict(BOT)})
        return {"type": "message", "id": activity_id or uuid.uuid4().hex[:13],
                "timestamp": "2026-12-02T12:00:00.000Z", "serviceUrl": self.base,
                "channelId": "msteams", "from": user,
                "conversation": {"id": conversation, "conversationType": ctype,
                                 "tenantId": TENANT, "isGroup": ctype != "personal"},
                "recipient": dict(BOT), "textFormat": "plain", "locale": "en-US",
                "text": text, "entities": entities,
                "channelData": {"tenant": {"id": TENANT}}}

    def click(self, prompt: Activity, *, aad: str, verb: str = "durable_turns.approve",
              value: str | None = None) -> dict[str, Any]:
        """The ``adaptiveCard/action`` invoke of a click on a posted card's button."""
        card = prompt.card or {}
        action = next(x for x in card["actions"] if x["verb"] == verb)
        data = dict(action["data"])
        if value is not None:
            data["durable_turns.value"] = value
        user = {"id": f"29:{aad}", "name": aad.removeprefix("aad-").title(), "aadObjectId": aad}
        ctype = self.conversations[prompt.conversation]
        return {"type": "invoke", "name": "adaptiveCard/action", "id": uuid.uuid4().hex[:13],
                "serviceUrl": self.base, "channelId": "msteams", "from": user,
                "conversation": {"id": prompt.conversation, "conversationType": ctype,
                                 "tenantId": TENANT},
                "recipient": dict(BOT), "replyToId": prompt.id,
                "value": {"action": {"type": "Action.Execute", "verb": verb, "data": data},
                          "trigger": "manual"},
                "channelData": {"tenant": {"id": TENANT}}}


def tls_files(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files (MSAL speaks to
    https only: its login endpoint is served with them)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
