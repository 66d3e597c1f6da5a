"""The headers every response of the HTTP host carries: what a browser may do with it.

- ``Content-Security-Policy``: the console's page runs its own script and style only (no
  inline code, nothing from elsewhere: an injected ``<script>`` would not run), talks to its
  own origin only, and may not be framed (``frame-ancestors 'none'``);
- ``X-Frame-Options: DENY``: the same, for browsers before ``frame-ancestors`` (no page of
  any site may show the console, with its Approve buttons, in a frame: clickjacking);
- ``Referrer-Policy: no-referrer``: a link out of the console does not tell where it came
  from (a session's address);
- ``X-Content-Type-Options: nosniff``: a response is what its ``Content-Type`` says;
- ``Cross-Origin-Resource-Policy: same-origin``: no page of another origin may load a response
  as an image or a script.

A header a route set itself is left as it is.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CSP", "SECURITY_HEADERS", "SecurityHeaders", "with_security_headers"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
"""The console's page may load its own files and talk to its own origin, nothing else."""

SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Resource-Policy": "same-origin",
}
"""The headers, by name."""

_RAW = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]


def with_security_headers(send: Send) -> Send:
    """``send`` that adds :data:`SECURITY_HEADERS` to a response's start (those it lacks)."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            have = {name.lower() for name, _ in headers}
            headers += [(k, v) for k, v in _RAW if k not in have]
            message = {**message, "headers": headers}
        await send(message)

    return sending


class SecurityHeaders:
    """ASGI middleware: every HTTP response of ``app`` carries :data:`SECURITY_HEADERS`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            send = with_security_headers(send)
        await self.app(scope, receive, send)
