"""What crosses an agent object's boundary, host-neutral: the request it reads, the reply it
makes (JSON, or a stream of SSE frames), errors as the HTTP host answers them.

The object reads a request through four things every host's request has (``method``,
``url``, ``headers.get(name)``, ``await text()``): a JavaScript ``Request`` under Pyodide
(workerd's, or Node's in the tests), :class:`ObjectRequest` in CPython. Its answer is a
:class:`Reply`, which ``_workers`` turns into a JavaScript ``Response`` where there is one.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ValidationError

from .._input_limits import HttpError, blank_body, loads
from ..errors import StoreError, error_kind
from ..events import TurnEvent
from ._values import to_py

__all__ = ["MAX_BODY", "SSE_HEADERS", "ObjectRequest", "Reply", "Url", "error_reply",
           "frame", "json_reply", "read_body"]

log = logging.getLogger("durable_turns.cloudflare")

MAX_BODY = 1 << 20
"""The largest request body accepted (1 MiB), as the HTTP host's."""
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-store",
               "X-Accel-Buffering": "no"}
"""An event stream's headers."""

B = TypeVar("B", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class ObjectRequest:
    """A request as a test hands it to an object in CPython (what a JavaScript ``Request``
    has of it)."""

    method: str
    url: str
    """The whole URL: ``http://localhost/agents/ops/sessions/s1/turn?replace=1``."""
    body: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        """The header ``name`` (any case), or ``None``."""
        low = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == low), None)

    async def text(self) -> str:
        """The body."""
        return self.body


@dataclass(slots=True)
class Reply:
    """An object's answer: a status, headers, and a body that is bytes or a stream of
    chunks (an event stream, which goes on while the turn runs)."""

    status: int
    headers: dict[str, str]
    body: bytes | AsyncIterator[bytes]

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk."""
        if isinstance(self.body, bytes):
            yield self.body
            return
        async for chunk in self.body:
            yield chunk

    async def read(self) -> bytes:
        """The whole body (a stream: to its end)."""
        return b"".join([c async for c in self.chunks()])

    async def json(self) -> Any:
        """The body as JSON."""
        return json.loads(await self.read())

    async def close(self) -> None:
        """Stop a streamed body (its reader left): its generator's ``finally`` runs now."""
        aclose = getattr(self.body, "aclose", None)
        if aclose is not None:
            await aclose()


class Url:
    """The parts of a request the object reads: its method, path, query and headers."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.method = str(request.method).upper()
        parts = urlsplit(str(request.url))
        self.scheme = parts.scheme
        self.host = parts.hostname or ""
        self.origin = f"{parts.scheme}://{parts.netloc}".lower()
        self.path = parts.path
        self.query = {k: v[-1] for k, v in parse_qs(parts.query).items()}

    def header(self, name: str) -> str | None:
        """A header of the request, whichever host made it."""
        own = getattr(self.request, "header", None)
        found = own(name) if own is not None else to_py(self.request.headers.get(name))
        return None if found is None else str(found)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``wrangler dev`` serves ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def read_body(request: Url, model: type[B]) -> B:
    """The request's JSON body as ``model`` (an empty one is ``{}``).

    Raises:
        HttpError: 415 not sent as JSON; 413 over :data:`MAX_BODY`; 400 not JSON, too deep,
            or not the model's shape.
    """
    kind = request.header("content-type")
    is_json = kind is not None and kind.split(";")[0].strip().lower() == "application/json"
    if kind is not None and not is_json:
        raise HttpError(415, "UnsupportedMediaType",
                        f"the body must be JSON sent as Content-Type: application/json, not "
                        f"{kind[:80]!r}")
    raw = str(await request.request.text())
    if len(raw.encode()) > MAX_BODY:
        raise HttpError(413, "PayloadTooLarge", f"the body is over {MAX_BODY} bytes")
    empty = blank_body(raw)
    if not empty and not is_json:
        raise HttpError(415, "UnsupportedMediaType",
                        "the body must be JSON sent as Content-Type: application/json")
    data = {} if empty else loads(raw)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']}" for err in e.errors())
        raise HttpError(400, "MalformedBody", problems) from None


def json_reply(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    """``data`` as a JSON answer."""
    return Reply(status, {"Content-Type": "application/json", **(headers or {})},
                 json.dumps(data, default=str).encode())


def error_reply(exc: BaseException) -> Reply:
    """The JSON answer for ``exc``, as the HTTP host gives it: its status from
    ``errors.ERRORS``, the message of a 4xx; a 5xx says only what kind of failure it was
    (the error goes to the log)."""
    if isinstance(exc, HttpError):
        return _error(exc.status, exc.type, exc.message)
    kind = error_kind(exc)
    if kind is not None and (kind.status < 500 or kind.said):
        return _error(kind.status, type(exc).__name__, str(exc))
    status = kind.status if kind is not None else 500
    if isinstance(exc, StoreError):
        log.warning("request refused (%d): %s", status, exc)
        return _error(status, "StoreUnavailable",
                      "the object's storage cannot be used now; retry later")
    log.error("request failed (%d)", status, exc_info=exc)
    return _error(status, "InternalError", "the object failed; the error is in its log")


def _error(status: int, type_: str, message: str) -> Reply:
    return json_reply({"error": {"type": type_, "message": message}}, status)


def frame(event: TurnEvent) -> bytes:
    """``event`` as its SSE frame: ``id:`` (durable events only), ``event:``, ``data:``."""
    head = f"id: {event.seq}\n" if event.durable else ""
    data = json.dumps(event.to_dict(), default=str)
    return f"{head}event: {event.type}\ndata: {data}\n\n".encode()
