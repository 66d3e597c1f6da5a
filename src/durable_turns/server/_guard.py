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
4. **May it?** ``authorize(principal, action, session)`` (``access``) decides the route's
   action; a session the store does not have is taken by the principal that starts it (a
   turn or a reset: never a ``GET``), atomically, and the decision is made again if another
   principal took it first. A refusal on a session the caller may not even read is a 404,
   as for a session that does not exist: a caller cannot tell whose sessions exist.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from .._input_limits import BODY_TIMEOUT, HttpError
from ..access import Action, Authorize, authorized, decide, listing
from ..errors import SessionAccessError
from ..records import SessionSummary, resume_entry_id
from ..runtime import Runtime
from ..sessions import AgentSession
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
                 body_timeout: float = BODY_TIMEOUT) -> None:
        self.rt = runtime
        self.authenticate = authenticate
        self.authorize = authorize
        self.origins = frozenset(o.rstrip("/").lower() for o in origins)
        self.body_timeout = body_timeout

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
                parsed = None
                if body is not None:
                    parsed = await read_body(request, body, timeout=self.body_timeout)
                if session is not None:
                    request.state.session = session(parsed)
                self.rt.require_open()
                act = action(parsed) if callable(action) else action
                if act is not None and self.authenticate is not None:
                    await self.check_action(request, act, request.method not in
                                            SAFE_METHODS and (claim or act in CLAIMS), parsed)
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
    host = host_name(request.headers.get("host") or "")
    if not is_loopback(host):
        raise HttpError(403, "DevelopmentMode",
                        f"no authenticate: this server answers requests for this machine "
                        f"only (localhost, 127.0.0.1, [::1]), not for Host {host!r} (a page "
                        "whose name resolves here, DNS rebinding, is refused)")


def host_name(host: str) -> str:
    """The name or address of a ``Host`` header, without its port (``[::1]:80`` → ``::1``)."""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


__all__ = [
    "CLAIMS",
    "SAFE_METHODS",
    "Guard",
    "Handler",
    "answered_by",
    "check_local",
    "host_name",
    "own_origin",
    "session_of",
]
