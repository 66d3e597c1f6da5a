"""Asking the model for one reply: stream it, check what the model yields, retry what is
transient (F2, F11).

The ``Model`` seam is a promise the engine checks rather than trusts: a reply is a stream of
``TextDelta``/``ThinkingDelta`` and ``ToolCall`` events ending in exactly one ``Stop``; every
call has an id (unique in the reply), a name and an object as input. Anything else fails the
model step with a :class:`~durable_turns.errors.ModelError` naming the model class, before
anything is committed. An exception a model raises that is not a ``ModelError`` is reported
as that model's failure, never as the engine's; a builtin ``ConnectionError`` (refused, reset,
a broken pipe) or ``TimeoutError`` is a transient one.

Transient failures (``ModelError.retryable``: connection refused or reset, a cut stream,
HTTP 408/429/5xx/529 after the SDK's own retries) are asked again with exponential backoff
and jitter, honouring the provider's ``retry-after`` up to a cap. Nothing of a failed attempt
is committed; each retry is announced by a live ``message.retry`` event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from ..errors import Cancelled, ModelError, RetryStep
from ..messages import ToolCall
from ..model import Model, ModelRequest, Stop, TextDelta, ThinkingDelta
from ..tools import backoff

RETRY_AFTER_CAP = 60.0
"""The longest ``retry-after`` the engine honours, in seconds."""
BACKOFF_CAP = 30.0
"""The longest backoff between two attempts, in seconds."""


@dataclass(frozen=True, slots=True)
class Reply:
    """One checked reply of the model."""

    text: str
    calls: list[ToolCall]
    stop: Stop


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often, and after how long, a transient model failure is asked again."""

    retries: int = 3
    base_delay: float = 0.5
    """The first backoff in seconds; it doubles per attempt (with jitter), up to a cap."""

    def delay(self, attempt: int, error: ModelError) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based)."""
        if error.retry_after is not None:
            return min(float(error.retry_after), RETRY_AFTER_CAP)
        return backoff(self.base_delay, attempt, BACKOFF_CAP)


def _name(model: Model) -> str:
    return type(model).__name__


def _broken(model: Model, problem: str) -> ModelError:
    return ModelError(f"model {_name(model)} broke the Model seam: {problem}",
                      provider=_name(model))


def _checked_call(model: Model, ev: ToolCall, seen: set[str]) -> ToolCall:
    if not isinstance(ev.id, str) or not ev.id:
        raise _broken(model, f"a ToolCall has no id ({ev.id!r}); every call needs a unique id")
    if ev.id in seen:
        raise _broken(model, f"two ToolCalls share the id {ev.id!r}")
    if not isinstance(ev.name, str) or not ev.name:
        raise _broken(model, f"ToolCall {ev.id!r} has no name ({ev.name!r})")
    if not isinstance(ev.input, Mapping):
        raise _broken(model, f"ToolCall {ev.id!r} has input of type "
                             f"{type(ev.input).__name__}; it must be an object (a dict)")
    seen.add(ev.id)
    return ev if isinstance(ev.input, dict) else ToolCall(ev.id, ev.name, dict(ev.input))


def _checked_stop(model: Model, ev: Stop) -> Stop:
    if not isinstance(ev.reason, str) or not ev.reason:
        raise _broken(model, f"Stop.reason is {ev.reason!r}; it must be a non-empty string")
    usage: Any = ev.usage
    if usage is None:
        return Stop(ev.reason, {}, tuple(ev.content or ()))
    if not isinstance(usage, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) for k, v in usage.items()
    ):
        raise _broken(model, f"Stop.usage is {usage!r}; it must be None or a dict of ints")
    return ev


async def stream_reply(model: Model, request: ModelRequest,
                       on_text: Callable[[str], None],
                       on_thinking: Callable[[str], None] | None = None) -> Reply:
    """Stream one reply, handing text to ``on_text`` (and reasoning to ``on_thinking``) as it
    comes, and check it.

    Raises:
        ModelError: the model failed (its own ``ModelError``), raised anything else, or
            broke the seam.
    """
    parts: list[str] = []
    calls: list[ToolCall] = []
    ids: set[str] = set()
    stop: Stop | None = None
    try:
        async with aclosing(model.stream(request)) as stream:  # type: ignore[type-var]
            async for ev in stream:
                if stop is not None:
                    raise _broken(model, f"it yielded {type(ev).__name__} after its Stop")
                if isinstance(ev, TextDelta):
                    if not isinstance(ev.text, str):
                        raise _broken(model, f"TextDelta.text is a {type(ev.text).__name__}, "
                                             "not a str")
                    parts.append(ev.text)
                    on_text(ev.text)
                elif isinstance(ev, ToolCall):
                    calls.append(_checked_call(model, ev, ids))
                elif isinstance(ev, Stop):
                    stop = _checked_stop(model, ev)
                elif isinstance(ev, ThinkingDelta):
                    if on_thinking is not None and isinstance(ev.text, str):
                        on_thinking(ev.text)
                else:
                    raise _broken(model, f"it yielded a {type(ev).__name__} ({ev!r:.80}); a "
                                         "Model yields TextDelta, ThinkingDelta, ToolCall, Stop")
    except (ModelError, Cancelled, asyncio.CancelledError):
        raise
    except Exception as e:
        # A custom model's own I/O fails as an adapter's does: a connection refused, reset
        # or cut, or a timeout, may well succeed when asked again (F2).
        raise ModelError(f"model {_name(model)} raised {type(e).__name__}: {e}",
                         provider=_name(model),
                         retryable=isinstance(e, ConnectionError | TimeoutError)) from e
    if stop is None:
        raise _broken(model, "its stream ended without a Stop")
    return Reply("".join(parts), calls, stop)


async def ask(model: Model, request: ModelRequest, policy: RetryPolicy, *,
              on_text: Callable[[str], None],
              on_retry: Callable[[int, float, ModelError], None],
              on_thinking: Callable[[str], None] | None = None,
              attempt: int | None = None) -> Reply:
    """:func:`stream_reply`, asked again after transient failures.

    ``on_retry(attempt, delay, error)`` is told before each wait. With ``attempt`` (a
    scheduler that retries the step itself, as Temporal does), only that attempt is asked: a
    transient failure with attempts left raises :class:`~durable_turns.errors.RetryStep`
    with the backoff instead of waiting here.

    Raises:
        ModelError: a failure that is not transient, or the last of too many.
        RetryStep: ``attempt`` failed and the step should run again.
    """
    one = attempt is not None
    attempt = attempt or 1
    while True:
        try:
            return await stream_reply(model, request, on_text, on_thinking)
        except ModelError as e:
            if not e.retryable or attempt > policy.retries:
                if attempt > 1:
                    raise ModelError(f"{e} (gave up after {attempt} attempts)",
                                     provider=e.provider, status=e.status,
                                     retryable=e.retryable) from e
                raise
            delay = policy.delay(attempt, e)
            on_retry(attempt, delay, e)
            if one:
                raise RetryStep(f"model call failed on attempt {attempt} of "
                                f"{policy.retries + 1}: {e}", delay=delay,
                                attempt=attempt) from e
            await asyncio.sleep(delay)
            attempt += 1


__all__ = ["BACKOFF_CAP", "RETRY_AFTER_CAP", "Reply", "RetryPolicy", "ask", "stream_reply"]
