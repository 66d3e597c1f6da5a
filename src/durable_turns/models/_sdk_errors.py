"""One translation of the model SDKs' exceptions into :class:`ModelError`.

The ``anthropic`` and ``openai`` SDKs are generated from the same template (Stainless): the
same exception tree, the same retry headers, the same ``httpx2`` transport. So both adapters
translate at their boundary through :func:`translate`, which reads those shapes without
importing either SDK.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import httpx2

from ..errors import ModelError


def error_fields(body: object, fallback: str = "") -> tuple[str, str]:
    """``(type, message)`` of an error body ``{"error": {"type"|"code", "message"}}``."""
    err = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(err, dict):
        kind = err.get("type") or err.get("code") or "error"
        return str(kind), str(err.get("message") or fallback)
    return "error", str(body or fallback)


def _http_error(provider: str, e: Any) -> ModelError:
    kind, message = error_fields(e.body, e.message)
    status = e.status_code
    retries = e.response.request.headers.get("x-stainless-retry-count", "0")
    notes = []
    if retries.isdigit() and int(retries) > 0:
        notes.append(f"after {retries} {'retry' if retries == '1' else 'retries'}")
    if e.request_id:
        notes.append(f"request-id {e.request_id}")
    suffix = f" ({'; '.join(notes)})" if notes else ""
    return ModelError(
        f"{provider}: HTTP {status} {kind}: {message}{suffix}",
        provider=provider, status=status,
        retryable=status in (408, 409, 429) or status >= 500,
        retry_after=_retry_after(e.response.headers.get("retry-after")),
        context_overflow=status == 400 and _overflow(e.body, message),
    )


def _overflow(body: object, message: str) -> bool:
    """Anthropic's ``prompt is too long``, OpenAI's ``context_length_exceeded`` code."""
    err = body.get("error", body) if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code == "context_length_exceeded" or message.startswith("prompt is too long")


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``retry-after`` header (seconds only; an HTTP date is ignored)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def translate(provider: str, sdk: ModuleType, e: BaseException, *, midstream: str,
              retryable_types: frozenset[str]) -> ModelError:
    """The :class:`ModelError` for an exception raised while streaming a reply.

    Args:
        provider: the adapter's name, first in every message.
        sdk: the SDK module (its ``APIStatusError``, ``APITimeoutError``, …).
        e: what the SDK or its transport raised.
        midstream: what the provider calls an error sent after the 200 ("error event").
        retryable_types: error types of such mid-stream errors worth calling again for.
    """
    if isinstance(e, sdk.APIStatusError) and e.status_code != 200:
        return _http_error(provider, e)
    if isinstance(e, sdk.APITimeoutError):
        return ModelError(f"{provider}: the request timed out (or the stream stalled past the "
                          "read timeout)", provider=provider, retryable=True)
    if isinstance(e, sdk.APIConnectionError):
        return ModelError(f"{provider}: connection failed: {e.__cause__ or e}",
                          provider=provider, retryable=True)
    if isinstance(e, sdk.APIError):
        # An error sent in the stream after the 200: the SDK does not retry it.
        kind, message = error_fields(e.body, e.message)
        return ModelError(f"{provider}: {midstream} mid-stream: {kind}: {message}",
                          provider=provider, retryable=kind in retryable_types)
    if isinstance(e, httpx2.TimeoutException):
        # A stall mid-stream surfaces as httpx2's own timeout, not the SDK's.
        return ModelError(
            f"{provider}: the stream stalled past the read timeout ({type(e).__name__})",
            provider=provider, retryable=True)
    if isinstance(e, httpx2.TransportError):
        return ModelError(f"{provider}: the stream broke: {type(e).__name__}: {e}",
                          provider=provider, retryable=True)
    if isinstance(e, ValueError):
        return ModelError(f"{provider}: malformed stream: {type(e).__name__}: {e}",
                          provider=provider, retryable=True)
    return ModelError(f"{provider}: {type(e).__name__}: {e}", provider=provider)
