"""The HTTP edges of the host: JSON errors, bounded bodies, callers, SSE framing.

Every failure leaves as ``{"error": {"type", "message"}}`` with the status F12 gives it;
exceptions of the engine are translated here, once.
"""

from __future__ import annotations

import inspect
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from .._input_limits import BODY_TIMEOUT, HttpError, blank_body, loads, read_limited
from ..access import principal_id
from ..errors import StoreError, error_kind
from ..events import TurnEvent

log = logging.getLogger("durable_turns.server")

MAX_BODY = 1 << 20
"""The largest request body accepted (1 MiB); a longer one is refused with 413."""

Authenticate = Callable[[Request], Any]
"""``authenticate(request)`` (sync or async) → the caller's principal (its ``id`` is ``by``),
or ``None`` (or an exception) to refuse with 401."""

B = TypeVar("B", bound=BaseModel)


RETRY_AFTER = 2
"""Seconds a 503's ``Retry-After`` asks a client to wait before it tries again."""

_UNAVAILABLE = {
    503: ("Unavailable", "the service cannot answer now (another process holds the "
                         "session); retry later"),
    504: ("Timeout", "the server gave up waiting; retry later"),
}
"""What a 5xx says in place of its exception's message (which may name a database)."""
_STORE_AWAY = (
    "StoreUnavailable",
    f"the session store cannot be used now (its database is away or failing); retry in "
    f"{RETRY_AFTER} s: a request that started a turn is safe to repeat with the same "
    "Idempotency-Key (or turn_id), which never starts a second one")
"""What a 503 of a store failure says: its cause, without the database's name."""


def error_response(exc: BaseException) -> JSONResponse:
    """The JSON answer for ``exc``: its status from ``errors.ERRORS``, the message of a 4xx;
    a 5xx says only what kind of failure it was (the error goes to the log). A 503 carries
    ``Retry-After``."""
    if isinstance(exc, HttpError):
        return _error(exc.status, exc.type, exc.message)
    kind = error_kind(exc)
    if kind is not None and (kind.status < 500 or kind.said):
        return _error(kind.status, type(exc).__name__, str(exc))
    status = kind.status if kind is not None else 500
    if isinstance(exc, StoreError):  # the database is away: expected, said in one line
        log.warning("request refused (%d): %s", status, exc)
        type_, message = _STORE_AWAY
    else:
        log.error("request failed (%d)", status, exc_info=exc)
        type_, message = _UNAVAILABLE.get(
            status, ("InternalError", "the server failed; the error is in its log"))
    return _error(status, type_, message)


def _error(status: int, type_: str, message: str) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER)} if status == 503 else None
    return JSONResponse({"error": {"type": type_, "message": message}}, status_code=status,
                        headers=headers)


async def read_body(request: Request, model: type[B], *,
                    timeout: float = BODY_TIMEOUT) -> B:
    """The request's JSON body as ``model``; an empty body is ``{}``. Read once: a second
    call for the same model (the handler, after the guard) returns the first one's.

    Raises:
        HttpError: 415 a body (or a ``Content-Type``) that is not ``application/json`` (what
            a form of another site cannot send); 413 over :data:`MAX_BODY`; 408 slower than
            ``timeout`` seconds (``_input_limits.BODY_TIMEOUT``); 400 not JSON, nested deeper than
            ``_input_limits.MAX_DEPTH``, or not the model's shape.
    """
    done = getattr(request.state, "json_body", None)
    if done is not None and isinstance(done, model):
        return done
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() \
            and int(declared) > MAX_BODY:
        raise HttpError(413, "PayloadTooLarge", f"the body is over {MAX_BODY} bytes")
    kind = request.headers.get("content-type")
    is_json = kind is not None and kind.split(";")[0].strip().lower() == "application/json"
    if kind is not None and not is_json:
        raise HttpError(415, "UnsupportedMediaType",
                        f"the body must be JSON sent as Content-Type: application/json, not "
                        f"{kind[:80]!r}")
    try:
        raw = await read_limited(request.stream(), MAX_BODY, timeout=timeout)
    except ClientDisconnect:  # nobody to answer; not a failure of the server either
        raise HttpError(400, "ClientDisconnect", "the client left before its body came") \
            from None
    empty = blank_body(raw)
    if not empty and not is_json:
        raise HttpError(415, "UnsupportedMediaType",
                        "the body must be JSON sent as Content-Type: application/json")
    data = {} if empty else loads(raw)
    try:
        body = model.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']}" for err in e.errors())
        raise HttpError(400, "MalformedBody", problems) from None
    request.state.json_body = body
    return body


async def principal_of(request: Request, authenticate: Authenticate | None,
                       dev_by: str | None) -> tuple[str | None, Any]:
    """Who calls: ``(by, principal)``. In development mode (no ``authenticate``) ``by`` is
    what the body says and there is no principal.

    Raises:
        HttpError: 401 when ``authenticate`` refuses.
    """
    if authenticate is None:
        return dev_by, None
    try:
        found = authenticate(request)
        if inspect.isawaitable(found):
            found = await found
    except Exception as e:
        # Not echoed: the refusal's words may quote what was sent (a token). The log has
        # its type only, for the same reason.
        log.info("authenticate refused a request (%s)", type(e).__name__)
        raise HttpError(401, "Unauthorized", "authentication refused") from None
    if found is None:
        raise HttpError(401, "Unauthorized", "authentication refused")
    who = principal_id(found)
    if who is None:
        raise HttpError(401, "Unauthorized", "the principal has no id")
    return who, found


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_durable(event: TurnEvent) -> bool:
    """Whether ``event`` is stored (and has an SSE ``id``): not one of the live-only types
    (text deltas, retry notices)."""
    return event.durable


def sse_fields(event: TurnEvent) -> dict[str, Any]:
    """An event's SSE fields: ``id`` (the durable seq; none for live-only events),
    ``event`` (its type), ``data`` (its JSON)."""
    return {"id": str(event.seq) if is_durable(event) else None, "event": event.type,
            "data": json.dumps(event.to_dict(), default=str)}


Handler = Callable[[Request], Awaitable[Any]]
