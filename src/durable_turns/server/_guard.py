"""What every API request passes before its handler runs, in this order:

1. **Its origin** (CSRF): a browser's request from a page of another origin is refused (403)
   unless that origin is allowed. A state-changing request (``POST``) must carry an
   ``Origin`` equal to the app's own (``scheme://host``, as the browser addressed it) or one
   of ``origins``; without ``Origin``, a ``Sec-Fetch-Site`` other than ``same-origin`` or
   ``none`` is refused (a client that sends neither, such as ``curl``, is no browser). A
   read (``GET``) a page of another site makes (``fetch``, ``EventSource``, an image) is
   refused too, by its ``Sec-Fetch-Site``; following a link to the console is not. JSON
   bodies come only with ``Content-Type: application/json`` (``read_body``), which a form
   cannot send.
2. **Who calls**: with ``authenticate``, its principal (401 when refused). Without it
   (development mode), the request must have arrived on a loopback address *and* name a
   loopback host in its ``Host`` header: a page of ``attacker.example`` whose name was made
   to resolve to 127.0.0.1 (DNS rebinding) sends ``Host: attacker.example`` and is refused.
3. **Its body** (``POST``): within its size, its JSON depth and its shape (400, 413, 415).
4. **Its session's name**: a name with a control character (NUL, a line break), a bidi
   override or a lone surrogate, or a path that is not UTF-8 (``%ff``), is a 400. A name in
   another surface's name space — ``<source>:…`` of a channel the app serves (``slack:``,
   ``teams:``), or ``subagent:`` (a parent turn's child) — is never made or taken here: a
   route that would start or take it is refused (403 ``ReservedSessionName``), whether it
   exists or not, but for an administrator (or development mode) acting on one that
   exists; a fork or a replay into one is refused too.
5. **May it?** ``authorize(principal, action, session)`` (``access``) decides the route's
   action; a session the store does not have is taken by the principal that starts it (a
   turn or a reset: never a ``GET``), atomically, and the decision is made again if another
   principal took it first. A refusal on a session the caller may not even read is a 404,
   as for a session that does not exist: a caller cannot tell whose sessions exist.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Awaitable, Callable, Collection
from typing import Any
from urllib.parse import unquote_to_bytes

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from .._input_limits import BODY_TIMEOUT, HttpError
from ..access import Action, Authorize, authorized, decide, is_admin, listing
from ..errors import SessionAccessError
from ..records import SessionSummary, resume_entry_id
from ..runtime import Runtime
from ..sessions import AgentSession
from ..subagents import CHILD
from ._http import Authenticate, error_response, is_loopback, principal_of, read_body

Handler = Callable[[Request], Awaitable[Response]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CLAIMS: frozenset[Action] = frozenset({"turn"})
"""The actions that make a session the store does not have (and so take it)."""


class Guard:
    """Wraps the API's handlers in the checks of the module's docstring.

    Args:
        runtime: the runtime served.
        authenticate: the caller's principal; ``None`` for development mode.
        authorize: decides each action (``access.default_authorize`` by default).
        origins: other origins (``https://console.example``) whose pages may call the API
            from a browser, besides the app's own.
        body_timeout: seconds a request's body may take to arrive.
    """

    def __init__(self, runtime: Runtime, authenticate: Authenticate | None,
                 authorize: Authorize, origins: Collection[str] = (), *,
                 body_timeout: float = BODY_TIMEOUT, reserved: Collection[str] = ()) -> None:
        self.rt = runtime
        self.authenticate = authenticate
        self.authorize = authorize
        self.origins = frozenset(o.rstrip("/").lower() for o in origins)
        self.body_timeout = body_timeout
        self.reserved = frozenset(reserved) | {CHILD}
        """The name spaces (``slack``: names ``slack:…``) of the other surfaces: the
        channels served beside the API, and subagents' children."""

    def __call__(self, handler: Handler,
                 action: Action | Callable[[Any], Action] | None = None, *,
                 body: type[BaseModel] | None = None, claim: bool = False,
                 session: Callable[[Any], str] | None = None) -> Handler:
        """``handler`` behind the checks.

        Args:
            action: what the route does, for ``authorize`` (``None``: nothing of a session,
                such as the console's files); or a function of the route's body that says
                it (a protocol route that starts a turn or answers one, as its body says).
            body: the route's body model, read and checked before ``authorize`` runs (the
                handler's own ``read_body`` then returns it).
            claim: a ``POST`` that takes a session the store does not have, besides those
                of :data:`CLAIMS` (a ``GET`` never takes one).
            session: where the route's session is named when its path does not name it: a
                function of its body (a protocol's chat or thread id). The guard keeps it
                as ``request.state.session``.
        """

        async def guarded(request: Request) -> Response:
            try:
                self.check_origin(request)
                if self.authenticate is None:
                    check_local(request)
                else:
                    request.state.by, request.state.principal = await principal_of(
                        request, self.authenticate, None)
                check_path(request)
                parsed = None
                if body is not None:
                    parsed = await read_body(request, body, timeout=self.body_timeout)
                if session is not None:
                    request.state.session = session(parsed)
                self.rt.require_open()
                act = action(parsed) if callable(action) else action
                claims = request.method not in SAFE_METHODS and (claim or act in CLAIMS)
                named = named_session(request)
                if act is not None and named is not None:
                    check_name(named)
                    if claims:
                        await self.check_surface(request, named)
                if act is not None and self.authenticate is not None:
                    await self.check_action(request, act, claims, parsed)
                return await handler(request)
            except Exception as e:
                return error_response(e)

        return guarded

    def check_origin(self, request: Request) -> None:
        """Refuse a browser's request made by a page of another origin (see the module).

        Raises:
            HttpError: 403.
        """
        origin = request.headers.get("origin")
        site = request.headers.get("sec-fetch-site")
        if origin is not None:
            origin = origin.rstrip("/").lower()
            if origin == own_origin(request) or origin in self.origins:
                return
        if request.method in SAFE_METHODS:
            # A read: refused only when a page of another site made it (not a navigation,
            # such as a link to the console, which cannot read what it gets back anyway).
            if site in ("cross-site", "same-site") and \
                    request.headers.get("sec-fetch-mode") != "navigate":
                raise HttpError(403, "CrossOrigin",
                                f"a page of another site ({origin or 'unnamed'}) may not read "
                                "this; allow its origin with create_app(origins=[…])")
            return
        if origin is not None:
            raise HttpError(403, "CrossOrigin",
                            f"a request from {origin!r} (another origin than this server's "
                            f"{own_origin(request)!r}) may not change anything here; allow "
                            "that origin with create_app(origins=[…])")
        if site not in (None, "same-origin", "none"):
            raise HttpError(403, "CrossOrigin",
                            f"a {site} request may not change anything here")

    async def check_action(self, request: Request, action: Action, claim: bool,
                           body: Any = None) -> None:
        """Ask ``authorize`` about ``action``; take a new session for the caller if ``claim``.

        Raises:
            SessionAccessError: refused (403), on a session the caller may read.
            HttpError: refused on a session the caller may not read (404, as for none).
            UnknownAgentError: no such agent (404).
        """
        principal = request.state.principal
        agent = request.path_params["agent"]
        if action in ("list", "inbox"):
            self.rt.key(agent, "_")  # raises UnknownAgentError
            request.state.visible = await listing(self.authorize, principal, action)
            return
        s = self.rt.session(agent, session_of(request))
        found = await s.summary()
        if action == "resume" and await answered_by(s, body, request.state.by):
            return  # its answerer again: the same response as the first time (the handler)
        await self.decided(principal, action, found)
        # Taken atomically: of two principals starting one session, one owns it, and the
        # other is decided again against that owner.
        if claim and not found.exists and \
                await self.rt.queries.own(s.key, request.state.by) != request.state.by:
            await self.decided(principal, action, await s.summary())

    def space(self, name: str) -> str | None:
        """The other surface's name space ``name`` is in (``slack`` for ``slack:T1:C9:17``),
        or ``None``: a name of the API's."""
        head, sep, _ = name.partition(":")
        return head if sep and head in self.reserved else None

    def check_new(self, name: str) -> None:
        """Refuse to make a session ``name`` (a fork's, a replay's) in another surface's
        name space.

        Raises:
            HttpError: 403 ``ReservedSessionName``.
        """
        space = self.space(name)
        if space is not None:
            raise reserved_name(name, space)

    async def check_surface(self, request: Request, name: str) -> None:
        """Refuse to start or take a session in another surface's name space (see the
        module): only an administrator, or development mode, acts on one that exists.

        Raises:
            HttpError: 403 ``ReservedSessionName``.
            UnknownAgentError: no such agent (404).
        """
        space = self.space(name)
        if space is None:
            return
        s = self.rt.session(request.path_params["agent"], name)
        if (self.authenticate is None or is_admin(request.state.principal)) and \
                (await s.summary()).exists:
            return
        raise reserved_name(name, space)

    async def decided(self, principal: Any, action: Action, found: SessionSummary) -> None:
        """``authorize``'s decision on ``found``; a refusal is a 404 when the principal may
        not read the session either (its existence is none of its business).

        Raises:
            SessionAccessError: refused, on a session the principal may read.
            HttpError: 404, refused on a session it may not read.
        """
        try:
            await authorized(self.authorize, principal, action, found)
        except SessionAccessError:
            if found.exists and (action == "read" or await decide(
                    self.authorize, principal, "read", found) is not True):
                raise HttpError(404, "UnknownSession", f"no session {found.key}") from None
            raise

    async def check_follow(self, request: Request, found: SessionSummary) -> None:
        """After a stream of a session's events has subscribed: the session exists, and the
        caller may still read it (another principal may have started it meanwhile).

        Raises:
            HttpError: 404, no such session (or none the caller may read).
        """
        if not found.exists:
            raise HttpError(404, "UnknownSession", f"no session {found.key}: a stream of "
                            "its events opens once a turn has started it")
        if self.authenticate is not None:
            await self.decided(request.state.principal, "read", found)


async def answered_by(s: AgentSession, body: Any, by: str | None) -> bool:
    """Whether the request ``body`` answers (``turn_id``, ``input_id``) was answered already
    by ``by``: an answerer who is not the owner gives the same answer twice (a double click),
    and the resume then answers as it did the first time (or says another answer was given)."""
    turn_id, input_id = getattr(body, "turn_id", None), getattr(body, "input_id", None)
    if by is None or not isinstance(turn_id, str) or not isinstance(input_id, str):
        return False
    given = await s.entry(resume_entry_id(turn_id, input_id))
    return given is not None and (given.args or {}).get("by") == by


def reserved_name(name: str, space: str) -> HttpError:
    """The refusal of a name in another surface's name space."""
    whose = "a parent turn (its subagent's child)" if space == CHILD else \
        f"the {space} channel"
    return HttpError(403, "ReservedSessionName",
                     f"session {name!r} is in the name space {space + ':'!r}: only {whose} "
                     "makes such sessions; the API does not start or take one")


SESSION_NAME = r"^[^\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]+$"
"""A session name's pattern, as the OpenAPI document gives it: no control character, no bidi
control (:func:`check_name`)."""
BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""The bidirectional formatting characters (an RTL override shows ``abc`` as ``cba``)."""


def check_name(name: str) -> None:
    """Refuse a session name with a control character, a bidi control or a lone surrogate
    (a name shows in the console, a log, a terminal: it must show as what it is).

    Raises:
        HttpError: 400 ``InvalidSessionName``.
    """
    for i, ch in enumerate(name):
        if ch in BIDI or unicodedata.category(ch) in ("Cc", "Cs"):
            raise HttpError(400, "InvalidSessionName",
                            f"a session name holds no control character, bidi control or lone "
                            f"surrogate: character {i} is U+{ord(ch):04X}")


def check_path(request: Request) -> None:
    """Refuse a path whose escapes are not UTF-8 (``%ff`` and ``%fe`` would both read as
    U+FFFD, and so name one session).

    Raises:
        HttpError: 400 ``InvalidPath``.
    """
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes):
        try:
            unquote_to_bytes(raw.split(b"?", 1)[0]).decode("utf-8")
        except UnicodeDecodeError:
            raise HttpError(400, "InvalidPath", "the path's %-escapes are not UTF-8 text") \
                from None


def named_session(request: Request) -> str | None:
    """The session a request names (its body's, ``Guard(session=…)``, or its path's); ``None``
    for a route of no session."""
    named = getattr(request.state, "session", None)
    if isinstance(named, str):
        return named
    found = request.path_params.get("session")
    return None if found is None else str(found)


def session_of(request: Request) -> str:
    """The session a guarded request is about: the one its body names (``Guard(session=…)``),
    else the one its path names."""
    named = getattr(request.state, "session", None)
    return named if isinstance(named, str) else str(request.path_params["session"])


def own_origin(request: Request) -> str:
    """The origin a browser gives this server's pages: ``scheme://host[:port]`` of the
    request (its ``Host`` header), lower case."""
    host = request.headers.get("host") or ""
    return f"{request.url.scheme}://{host}".lower()


def check_local(request: Request) -> None:
    """Development mode serves this machine only: the request arrived on a loopback address
    and its ``Host`` header names one.

    Raises:
        HttpError: 403.
    """
    server = request.scope.get("server")
    if not server or not is_loopback(str(server[0])):
        raise HttpError(403, "DevelopmentMode", "no authenticate: serving loopback only")
    header = request.headers.get("host") or ""
    host = host_name(header)
    if not is_loopback(host):
        raise HttpError(403, "DevelopmentMode",
                        f"no authenticate: this server answers requests for this machine "
                        f"only (localhost, 127.0.0.1, [::1]), not for Host {header[:100]!r} "
                        "(a page whose name resolves here, DNS rebinding, is refused)")


HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::[0-9]{1,5})?")
"""A ``Host`` header: a name or an IPv4 address, or an IPv6 address in brackets, then maybe a
port; nothing else (no ``user@``, no unclosed bracket)."""


def host_name(host: str) -> str:
    """The name or address of a ``Host`` header, without its port (``[::1]:80`` → ``::1``);
    ``""`` for a header that is no host (``127.0.0.1:8702@evil.com``, ``[::1``)."""
    found = HOST.fullmatch(host)
    if found is None:
        return ""
    return found["v6"] or found["name"]


__all__ = [
    "BIDI",
    "CLAIMS",
    "HOST",
    "SAFE_METHODS",
    "SESSION_NAME",
    "Guard",
    "Handler",
    "answered_by",
    "check_local",
    "check_name",
    "check_path",
    "host_name",
    "named_session",
    "own_origin",
    "reserved_name",
    "session_of",
]
