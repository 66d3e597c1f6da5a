"""A deadline for a request's headers: uvicorn's HTTP protocols, with the one timeout they lack.

uvicorn closes a keep-alive connection that stays idle between requests, but a connection
that sends the first bytes of a request and then trickles the rest (or nothing at all) is
kept open for as long as the client likes: a few hundred such connections hold a server's
sockets and file descriptors. These protocols give each request :data:`HEADER_TIMEOUT`
seconds from its first byte (or from the connection's start) to the end of its headers; past
it the client gets ``408 Request Timeout`` and the connection is closed. The body has its own
bound, in the app (``_input_limits.BODY_TIMEOUT``: ``read_body``, the Slack routes).

``serve`` runs uvicorn with :data:`HttpProtocol`; under uvicorn's own command line, pass it as
``--http durable_turns.server.deadlines:HttpProtocol``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HEADER_TIMEOUT", "H11Deadline", "HttpProtocol", "with_deadline"]

HEADER_TIMEOUT = 10.0
"""Seconds a request's headers may take to arrive, from its first byte (or the connection's
start)."""

_BODY = b'{"error": {"type": "RequestTimeout", "message": "the headers did not arrive in time"}}'
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
              b"connection: close\r\ncontent-length: " + str(len(_BODY)).encode() +
              b"\r\n\r\n" + _BODY)


class _Deadline:
    """The timer of one connection: armed while a request's headers are awaited."""

    header_timeout: float = HEADER_TIMEOUT
    """Seconds a request's headers may take (a subclass may change it)."""
    _deadline: asyncio.TimerHandle | None = None
    transport: asyncio.Transport

    def _arm(self) -> None:
        if self._deadline is None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.write(_TIMED_OUT)
            self.transport.close()


class H11Deadline(_Deadline, H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # h11 leaves IDLE once a request's headers are all in.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def _httptools_deadline() -> type[asyncio.Protocol] | None:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools comes with uvicorn[standard]
        return None

    class HttpToolsDeadline(_Deadline, HttpToolsProtocol):
        """uvicorn's httptools protocol with a deadline for each request's headers."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HttpToolsDeadline


HttpProtocol: type[asyncio.Protocol] = _httptools_deadline() or H11Deadline
"""The protocol ``serve`` runs: httptools' (what uvicorn takes when it is installed) or h11's,
with the headers' deadline."""


def with_deadline(base: type[asyncio.Protocol], seconds: float) -> type[asyncio.Protocol]:
    """``base`` (:data:`HttpProtocol` or :class:`H11Deadline`) with another deadline.

    Args:
        base: one of this module's protocols.
        seconds: the headers' deadline.

    Returns:
        A subclass to pass as uvicorn's ``http``.
    """
    attrs: dict[str, Any] = {"header_timeout": seconds}
    return type(f"{base.__name__}{seconds:g}s", (base,), attrs)
