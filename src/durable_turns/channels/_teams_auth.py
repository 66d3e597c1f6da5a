"""The Teams channel's two credentials: Bot Framework's token on each inbound request, the
bot's own token on each outbound call; and the 429 ``Retry-After`` its calls honour.

Inbound (Bot Framework's "authenticate requests from the Bot Connector service"): the
``Authorization: Bearer`` JWT is checked with PyJWT against the keys the OpenID metadata
document names (its ``jwks_uri``), fetched asynchronously and cached (a key id it does not
know makes it fetch them again, at most once a minute); RS256 only (an unsigned token is
refused), the issuer, the audience (the bot's app id), its expiry (five minutes' leeway, as
the Bot Framework SDKs allow), a key endorsed for the channel (``msteams``) when the key
lists endorsements, and the ``serviceurl`` claim equal to the activity's ``serviceUrl``.
The Teams SDK's own validator reads its keys with a blocking request on the event loop and
derives their URL from the metadata's by string replacement; this reads the metadata.

Outbound: :class:`BotToken` gets the bot's access token with MSAL's client credentials
(a password or a certificate), which MSAL caches and renews.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Mapping
from typing import Any

import httpx
import jwt
import msal  # type: ignore[import-untyped]  # MSAL ships no type hints
from microsoft_teams.common.http.client import MiddlewareContext, MiddlewareNext

BOT_ISSUER = "https://api.botframework.com"
"""The issuer of the Bot Connector's tokens (the public cloud's)."""
OPENID_METADATA = "https://login.botframework.com/v1/.well-known/openidconfiguration"
"""Bot Framework's OpenID metadata document (the public cloud's)."""
LOGIN = "https://login.microsoftonline.com"
"""Where the bot gets its own token (Microsoft Entra ID)."""
BOT_SCOPE = "https://api.botframework.com/.default"
"""The scope of the bot's token for the Bot Connector."""
LEEWAY = 300
"""Seconds of clock skew allowed on a token's times."""
REFETCH = 60.0
"""At most this often are the keys fetched again for a key id not among them."""


class Unverified(Exception):
    """An inbound request whose token does not pass: it is answered 401, nothing runs."""


class BotFrameworkVerifier:
    """Checks the Bot Connector's token on an inbound activity.

    Args:
        app_id: the bot's Microsoft App ID (the tokens' audience).
        metadata_url: the OpenID metadata document (point it at a test double).
        issuer: the tokens' issuer.
        channel: the channel id a key must be endorsed for, when it lists endorsements.
        http: the client the metadata and keys are fetched with (default: its own).
    """

    def __init__(self, app_id: str, *, metadata_url: str = OPENID_METADATA,
                 issuer: str = BOT_ISSUER, channel: str = "msteams",
                 http: httpx.AsyncClient | None = None) -> None:
        self.app_id = app_id
        self.metadata_url = metadata_url
        self.issuer = issuer
        self.channel = channel
        self.http = http or httpx.AsyncClient(timeout=10.0)
        self._keys: dict[str, Mapping[str, Any]] = {}
        self._fetched = -REFETCH
        self._lock = asyncio.Lock()

    async def verify(self, authorization: str, service_url: str) -> dict[str, Any]:
        """The token's claims, if ``authorization`` (the header) passes for an activity from
        ``service_url``.

        Raises:
            Unverified: it does not (the message says why, for the log).
        """
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unverified("no bearer token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as e:
            raise Unverified(f"not a JWT: {e}") from None
        if header.get("alg") != "RS256":
            raise Unverified(f"algorithm {header.get('alg')!r} is not RS256")
        jwk = await self._key(str(header.get("kid") or ""))
        endorsed = jwk.get("endorsements")
        if isinstance(endorsed, list) and self.channel not in endorsed:
            raise Unverified(f"the key is not endorsed for {self.channel}")
        try:
            claims: dict[str, Any] = jwt.decode(
                token, jwt.PyJWK(dict(jwk), "RS256").key, algorithms=["RS256"],
                audience=self.app_id, issuer=self.issuer, leeway=LEEWAY,
                options={"require": ["exp", "iss", "aud"]})
        except (jwt.InvalidTokenError, jwt.PyJWKError) as e:
            raise Unverified(str(e)) from None
        claimed = claims.get("serviceurl") or claims.get("serviceUrl")
        if not isinstance(claimed, str) or claimed.rstrip("/") != service_url.rstrip("/"):
            raise Unverified("the token's serviceurl is not the activity's serviceUrl")
        return claims

    async def _key(self, kid: str) -> Mapping[str, Any]:
        if kid in self._keys:
            return self._keys[kid]
        async with self._lock:
            if kid not in self._keys and time.monotonic() - self._fetched >= REFETCH:
                await self._fetch()
        if kid not in self._keys:
            raise Unverified("no key of the OpenID metadata signed it")
        return self._keys[kid]

    async def _fetch(self) -> None:
        try:
            meta = (await self.http.get(self.metadata_url)).raise_for_status().json()
            found = (await self.http.get(meta["jwks_uri"])).raise_for_status().json()
            keys: dict[str, Mapping[str, Any]] = {
                str(k["kid"]): k for k in found["keys"] if isinstance(k, dict) and k.get("kid")}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            raise Unverified(f"the OpenID metadata's keys could not be read: {e}") from None
        self._keys, self._fetched = keys, time.monotonic()


class BotToken:
    """The bot's access token for the Bot Connector, by MSAL's client credentials: a
    token source for the Teams SDK's ``ApiClient`` (called before each request).

    Args:
        app_id: the bot's Microsoft App ID.
        password: its client secret; or
        certificate: ``{"private_key": PEM, "thumbprint": hex}`` (MSAL's form).
        tenant: its tenant id (single-tenant bots), else ``botframework.com``.
        login: the Entra ID login endpoint.
    """

    def __init__(self, app_id: str, *, password: str | None = None,
                 certificate: Mapping[str, str] | None = None,
                 tenant: str = "botframework.com", login: str = LOGIN) -> None:
        credential: Any = password if password else dict(certificate or {})
        if not credential:
            raise ValueError("the bot's token needs its password or its certificate")
        self.app_id = app_id
        self.credential = credential
        self.authority = f"{login.rstrip('/')}/{tenant}"
        self._app: Any = None  # made at the first call: MSAL reads the authority's metadata

    def _acquire(self) -> dict[str, Any]:
        if self._app is None:
            self._app = msal.ConfidentialClientApplication(
                self.app_id, client_credential=self.credential, authority=self.authority,
                # Another login endpoint (a sovereign cloud's, a test double's) is taken as
                # given: instance discovery would ask the public cloud about it.
                instance_discovery=self.authority.startswith(f"{LOGIN}/"))
        got: dict[str, Any] = self._app.acquire_token_for_client(scopes=[BOT_SCOPE])
        return got

    def close(self) -> None:
        """Close MSAL's connections (a token asked for later opens new ones)."""
        if self._app is not None:
            self._app.http_client.close()

    async def __call__(self) -> str:
        """A valid token (MSAL's cache, else a new one).

        Raises:
            RuntimeError: Entra ID refused (its error and description).
        """
        got = await asyncio.to_thread(self._acquire)
        if "access_token" not in got:
            raise RuntimeError(f"the bot's token was refused: {got.get('error')}: "
                               f"{got.get('error_description')}")
        return str(got["access_token"])


class RetryAfter:
    """The Teams SDK's HTTP middleware that retries a call answered 429 after its
    ``Retry-After`` (seconds or a date; a second if absent), ``retries`` times."""

    def __init__(self, retries: int = 3, longest: float = 60.0) -> None:
        self.retries = retries
        self.longest = longest

    async def send(self, context: MiddlewareContext, next: MiddlewareNext) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                return await next()
            except httpx.HTTPStatusError as e:
                if e.response.status_code != 429 or attempt == self.retries:
                    raise
                await asyncio.sleep(min(self.longest, retry_after(e.response)))
        raise AssertionError("unreachable")  # pragma: no cover


def retry_after(response: httpx.Response) -> float:
    """The seconds a 429's ``Retry-After`` asks to wait (a second if it says nothing)."""
    value = response.headers.get("retry-after", "").strip()
    if value.replace(".", "", 1).isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 1.0
    return max(0.0, when.timestamp() - time.time())


__all__ = ["BOT_ISSUER", "BOT_SCOPE", "LOGIN", "OPENID_METADATA", "BotFrameworkVerifier",
           "BotToken", "RetryAfter", "Unverified", "retry_after"]
