"""Telling "the model could not be reached" apart from "the model did something else".

A demo turn that fails because the model's server is down, refuses the connection or is
overloaded says nothing about the model's behaviour; the demo must say what happened and
where. :class:`WatchedModel` remembers the last :class:`ModelError` its model raised, and
:func:`unreachable` turns such an error into one line::

    could not reach the model at http://127.0.0.1:9/v1/messages: connection failed: …

An error counts when calling again might succeed (``retryable``: a connection refused or
reset, a timeout, HTTP 408/409/429/5xx) or when a connection error caused it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from ..errors import ModelError
from ..model import Model, ModelEvent, ModelRequest

_CONNECTION_ERRORS = frozenset({"APIConnectionError", "ConnectError", "ConnectTimeout",
                                "TransportError", "NetworkError"})
"""Class names (anywhere in an exception's MRO) of the SDKs' and their transports'
connection failures; matched by name so that no SDK has to be imported."""


class WatchedModel:
    """A model that remembers the last :class:`ModelError` its stream raised."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.last_error: ModelError | None = None

    def __repr__(self) -> str:
        return repr(self.inner)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        async with aclosing(self.inner.stream(request)) as events:  # type: ignore[type-var]
            try:
                async for event in events:
                    yield event
            except ModelError as e:
                self.last_error = e
                raise

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


def _chain(e: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and all(cur is not s for s in seen):
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _is_connection_error(e: BaseException) -> bool:
    return isinstance(e, ConnectionError) or any(
        c.__name__ in _CONNECTION_ERRORS for c in type(e).__mro__
    )


def _url_of(e: BaseException) -> str | None:
    try:
        request = getattr(e, "request", None)  # the SDKs' errors and httpx's carry it
    except RuntimeError:  # httpx: "The .request property has not been set."
        return None
    url = getattr(request, "url", None)
    return str(url) if url else None


def _base_url(model: object) -> str | None:
    url = getattr(getattr(model, "client", None), "base_url", None)
    return str(url) if url else None


def unreachable(error: ModelError, model: object = None) -> str | None:
    """``could not reach the model at <url>: <reason>``, or ``None`` if the model was reached.

    Args:
        error: what the model's stream raised.
        model: the model (or a :class:`WatchedModel`); its client's ``base_url`` names the
            server when the error carries no request.
    """
    chain = _chain(error)
    if not error.retryable and not any(_is_connection_error(e) for e in chain):
        return None
    if isinstance(model, WatchedModel):
        model = model.inner
    url = next((u for u in map(_url_of, chain) if u), None) or _base_url(model)
    reason = str(error).removeprefix(f"{error.provider}: ")
    return f"could not reach the model at {url or 'its API'}: {reason}"


__all__ = ["WatchedModel", "unreachable"]
