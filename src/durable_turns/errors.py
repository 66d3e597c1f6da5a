"""Every exception durable_turns raises, in one place.

Failures (subclasses of ``Exception``, names ending in ``Error``)::

    DurableTurnsError
    ├── ConfigurationError          an agent, tool or app folder is declared wrongly
    │   ├── ToolDeclarationError    a tool's declaration contradicts what it does
    │   └── RuntimeNotOpenError     the runtime was used before it was opened
    ├── UnknownAgentError           runtime.session() names an agent the runtime lacks
    ├── UnknownTurnError            a turn id the session never accepted
    ├── SessionBusyError            the session cannot take this turn now
    ├── SessionExistsError          a fork's new address has a session already
    ├── ForkRerunsToolsError        a fork would run local tools again; say how (409)
    ├── TurnSuspendedError          turn() parked; resume it instead
    ├── ResumeConflictError         resume() of a turn that is not parked on that input (409)
    ├── ResumeAuthorizationError    the resumer may not answer that input (403)
    ├── SessionAccessError          the caller may not do that to that session (403)
    ├── AuthorizeAnswerError        the app's authorize_answer failed; nothing was applied
    ├── InvalidInputError           an answer that does not fit the request's schema
    ├── LeaseTimeoutError           another process drives the session and did not let go
    ├── LeaseLostError              another holder took the session over; nothing was written
    ├── StoreError                  the store cannot be opened or used
    ├── TurnConflictError           a turn id redelivered with other text, or not retryable
    ├── ModelError                  the model call failed (carries provider and status)
    ├── ToolCrashedError            a tool raised KeyboardInterrupt/SystemExit: step abandoned
    └── FatalToolError              raised *by a tool* to fail the turn on purpose

Control-flow signals (subclasses of ``BaseException``, so a tool's ``except Exception``
cannot swallow them): :class:`Parked`, :class:`Cancelled` and :class:`RetryStep` (a step run
for one attempt, ``Runtime.step(key, attempt=n)``, failed in a way its scheduler retries).

:data:`RUNTIME_FAILURES` (``StoreError``, ``LeaseLostError``, ``LeaseTimeoutError``) are the
runtime's own failures: a step that meets one is abandoned and driven again, whatever a tool
that met it through its context did with it.

How hosts answer them is one table, :data:`ERRORS` (looked up with :func:`error_kind`): the
HTTP status the server answers with and the exit status of the command line, for these and
for the builtins hosts meet (``ValueError``, ``LookupError``, ``TimeoutError``).
"""

from __future__ import annotations

from dataclasses import dataclass


class DurableTurnsError(Exception):
    """Base class of every failure this package raises."""


class ConfigurationError(DurableTurnsError):
    """An agent, a tool or an app folder is declared wrongly."""


class ToolDeclarationError(ConfigurationError):
    """A tool's declaration contradicts what it does (e.g. a plain ``def`` that awaits)."""


class RuntimeNotOpenError(ConfigurationError):
    """A runtime was read or written before it was opened: ``async with Runtime(...)``,
    ``await runtime.open()`` or a server's lifespan opens it (nothing opens lazily)."""

    def __init__(self) -> None:
        super().__init__("the runtime is not open: use 'async with Runtime(...) as runtime:' "
                         "or 'await runtime.open()' first (a server's lifespan opens it)")


class UnknownAgentError(DurableTurnsError, LookupError):
    """The runtime has no agent of that name."""

    def __init__(self, agent: str, known: list[str]) -> None:
        super().__init__(f"unknown agent {agent!r}; this runtime has {known or 'none'}")
        self.agent = agent


class UnknownTurnError(DurableTurnsError, LookupError):
    """The session never accepted a turn with that id."""

    def __init__(self, session: str, turn_id: str) -> None:
        super().__init__(f"session {session!r} has no turn {turn_id!r}")
        self.session = session
        self.turn_id = turn_id


class SessionExistsError(DurableTurnsError):
    """A new session (a fork) was asked for under an address that has a session already.

    Attributes:
        session: the address (``agent/session``).
    """

    def __init__(self, session: str) -> None:
        super().__init__(f"session {session!r} exists already: a fork needs a new address")
        self.session = session


class ForkRerunsToolsError(DurableTurnsError):
    """A fork at a checkpoint inside a turn would run that turn's owed local tool calls again,
    for real, in the app's tables: the fork says how (``tools="live"`` runs them,
    ``tools="recorded"`` answers them from the source's recording); nothing was written.

    Attributes:
        session: the source (``agent/session``).
        calls: ``(call_id, tool name)`` of each local call the fork would run.
    """

    def __init__(self, session: str, calls: list[tuple[str, str]]) -> None:
        named = ", ".join(f"{name} (call {call_id})" for call_id, name in calls)
        super().__init__(
            f"a fork of {session} here would run local tool calls again, for real, in the "
            f"app's tables: {named}; fork with tools='recorded' to answer them from the "
            "recording, or tools='live' to run them")
        self.session = session
        self.calls = calls


class SessionBusyError(DurableTurnsError):
    """The session cannot accept this turn now: it is parked on a person.

    Attributes:
        session: the session (``agent/session``).
        turn_id: the parked turn.
    """

    def __init__(self, session: str, turn_id: str) -> None:
        super().__init__(
            f"session {session} is parked on turn {turn_id!r} waiting for input; "
            "resume it (or reset the session) before starting another turn"
        )
        self.session = session
        self.turn_id = turn_id


class TurnSuspendedError(DurableTurnsError):
    """``turn()`` is non-interactive: the turn parked waiting for input."""

    def __init__(self, turn_id: str, request: object, session: str = "") -> None:
        super().__init__(f"turn {turn_id!r} is parked waiting for input; use start() and resume()")
        self.session = session
        self.turn_id = turn_id
        self.request = request


class ResumeConflictError(DurableTurnsError):
    """``resume()`` does not match the park: wrong turn, wrong input id, not suspended, a
    reset is pending, or another answer was given already (HTTP 409).

    Attributes:
        session: the session (``agent/session``).
        turn_id: the turn the resume named.
        input_id: the input the resume named.
    """

    def __init__(self, message: str, *, session: str = "", turn_id: str = "",
                 input_id: str = "") -> None:
        super().__init__(message)
        self.session = session
        self.turn_id = turn_id
        self.input_id = input_id


class InvalidInputError(DurableTurnsError, ValueError):
    """An answer that does not fit the input request's schema; nothing was stored.

    Attributes:
        input_id: the request the answer was for.
    """

    def __init__(self, message: str, *, input_id: str = "") -> None:
        super().__init__(message)
        self.input_id = input_id


class LeaseTimeoutError(DurableTurnsError):
    """Another process holds the session's lease and did not release it in time."""

    def __init__(self, session: str, timeout: float | None) -> None:
        super().__init__(
            f"session {session} is being driven by another holder; gave up after {timeout}s"
        )
        self.session = session


class LeaseLostError(DurableTurnsError):
    """A commit was refused: another holder took the session over (a newer epoch).

    Nothing of the refused step was written; the driver stops driving the session.

    Attributes:
        session: the session (``agent/session``).
        epoch: the lost lease's fencing token.
    """

    def __init__(self, session: str, epoch: int) -> None:
        super().__init__(
            f"lease on session {session} (epoch {epoch}) was taken over by another holder; "
            "the step was not written"
        )
        self.session = session
        self.epoch = epoch


class StoreError(DurableTurnsError):
    """The store cannot be opened or used (corrupt file, foreign database, bad schema)."""


class ModelError(DurableTurnsError):
    """A model call failed; nothing of it was committed.

    Attributes:
        provider: which adapter failed (``"anthropic"``, ``"scripted"``, …).
        status: the HTTP status when there was one.
        retryable: whether calling again might succeed (a transient failure).
        retry_after: seconds the provider asked to wait before calling again, if it did.
        context_overflow: the provider refused the request as over its context window
            (Anthropic's 400 "prompt is too long", OpenAI's ``context_length_exceeded``).
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        context_overflow: bool = False,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.context_overflow = context_overflow


class TurnConflictError(DurableTurnsError):
    """A turn id the session has already accepted, delivered again with other text; or a
    ``retry()`` of a turn that cannot be re-opened (HTTP 409).

    Attributes:
        session: the session (``agent/session``).
        turn_id: the turn.
    """

    def __init__(self, message: str, *, session: str, turn_id: str) -> None:
        super().__init__(message)
        self.session = session
        self.turn_id = turn_id


class ToolCrashedError(DurableTurnsError):
    """A tool raised ``KeyboardInterrupt`` or ``SystemExit``: treated as a crash of its step.

    Nothing of the step was committed and the turn stays unfinished: ``Runtime.recover()``
    (or a redelivery) runs the step again.

    Attributes:
        tool: the tool's name.
        session: the session (``agent/session``).
        turn_id: the turn.
        call_id: the call the tool was running.
    """

    def __init__(self, tool: str, exc: BaseException, *, session: str, turn_id: str,
                 call_id: str) -> None:
        super().__init__(
            f"tool {tool!r} raised {type(exc).__name__}{f': {exc}' if str(exc) else ''}; "
            f"its step (call {call_id!r} of turn {turn_id!r}) was abandoned and nothing of it "
            "committed; the turn stays unfinished for Runtime.recover()"
        )
        self.tool = tool
        self.session = session
        self.turn_id = turn_id
        self.call_id = call_id


class LimitExceeded(DurableTurnsError):
    """A turn reached one of its limits (``durable_turns.limits``, F25): its message names the
    limit, the cap in force and what was spent; a turn that ends on it is ``failed`` with
    that message as its ``error``."""

    def __init__(self, limit: str, allowed: float, spent: str) -> None:
        self.limit = limit
        self.allowed = allowed
        super().__init__(f"LimitExceeded: the turn reached its {limit} limit ({allowed:g}); "
                         f"spent {spent}")


class OutputInvalid(DurableTurnsError):
    """A turn's final answer did not match its output schema (``turn(output=…)``, F25) after
    its retries: its message names the validation error; a turn that ends on it is ``failed``
    with that message as its ``error``."""

    def __init__(self, error: str, retries: int) -> None:
        self.retries = retries
        super().__init__(f"OutputInvalid: the final answer did not match the output schema "
                         f"after {retries} retries: {error}")


class FatalToolError(DurableTurnsError):
    """Raise from a tool to fail the whole turn instead of reporting an error to the model.

    Use it for a mistake the model cannot fix: a misconfigured deployment, a broken invariant.
    """


class ResumeAuthorizationError(DurableTurnsError):
    """The resumer is not an allowed answerer of the pending input request (HTTP 403).

    Attributes:
        input_id: the request.
        by: the refused resumer.
    """

    def __init__(self, message: str, *, input_id: str = "", by: str | None = None) -> None:
        super().__init__(message)
        self.input_id = input_id
        self.by = by


class SessionAccessError(DurableTurnsError):
    """A host's ``authorize`` refused the caller this action on this session (HTTP 403):
    nothing was done.

    Attributes:
        session: the session (``agent/session``; empty for a listing).
        action: what was asked (``read``, ``turn``, ``cancel``, ``reset``, ``resume``,
            ``list``, ``inbox``).
        by: the caller's id.
    """

    def __init__(self, *, session: str, action: str, by: str | None) -> None:
        doing = {"turn": "start a turn in", "cancel": "cancel turns of",
                 "resume": "answer requests of", "list": "list the sessions",
                 "inbox": "read the inbox"}.get(action, action)
        where = f" session {session}" if session else ""
        super().__init__(f"{by!r} may not {doing}{where}")
        self.session = session
        self.action = action
        self.by = by


class AuthorizeAnswerError(DurableTurnsError):
    """The app's ``authorize_answer`` failed deciding a policy-restricted answer; nothing was
    applied, so the resume may be tried again later.

    Attributes:
        input_id: the request.
        by: the resumer.
    """

    def __init__(self, message: str, *, input_id: str = "", by: str | None = None) -> None:
        super().__init__(message)
        self.input_id = input_id
        self.by = by


RUNTIME_FAILURES: tuple[type[DurableTurnsError], ...] = (StoreError, LeaseLostError,
                                                         LeaseTimeoutError)
"""Failures of the runtime's own machinery (its store, its lease), never of a tool. Met by
anything a tool calls on its context (``request_input``, a subagent's child session, a
checkpoint), one abandons the step: nothing of it commits, it is never the tool's
``{"error": …}`` result, a tool's ``retries`` do not retry it, and the turn is driven again."""


def runtime_failure(exc: BaseException) -> BaseException | None:
    """The runtime failure behind ``exc``: ``exc`` itself, or the first of its causes (``raise
    … from``) or contexts that is one of :data:`RUNTIME_FAILURES`; ``None`` when there is none.

    Args:
        exc: what a call raised.

    Returns:
        The failure, or ``None``.
    """
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, RUNTIME_FAILURES):
            return found
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return None


class Parked(BaseException):
    """Signal: the running tool parked the turn to wait for a person (F6)."""

    def __init__(self, request: object) -> None:
        super().__init__(request)
        self.request = request


class Cancelled(BaseException):
    """Signal: the turn was cancelled at a checkpoint boundary (F7)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RetryStep(BaseException):
    """Signal: one attempt of a step (``Runtime.step(key, attempt=n)``) failed in a way its
    policy retries — a remote tool's error within its ``retries``, a transient model failure
    within the agent's ``model_retries`` — so nothing of the step was written; its scheduler
    runs the step again after :attr:`delay` seconds with the next attempt number.

    Args:
        message: what failed, for the scheduler's log and UI.
        delay: seconds the scheduler should wait (the failing call's backoff, with jitter,
            or the provider's ``retry-after``).
        attempt: the attempt that failed (1-based).
    """

    def __init__(self, message: str, *, delay: float, attempt: int) -> None:
        super().__init__(message)
        self.delay = delay
        self.attempt = attempt


# -- how hosts answer them -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ErrorKind:
    """How a host answers one kind of exception."""

    status: int
    """The HTTP status. A 5xx is answered without the exception's message (it may name a
    database or a file), unless :attr:`said`; the error goes to the server's log."""
    exit_code: int
    """The command line's exit status: 2 bad input (what the caller gave must change), 1 the
    command ran and failed."""
    said: bool = False
    """A 5xx whose message is ours alone (it names nothing of the machine): it is answered
    with its type and message."""


ERRORS: tuple[tuple[type[BaseException], ErrorKind], ...] = (
    (InvalidInputError, ErrorKind(422, 2)),
    (UnknownAgentError, ErrorKind(404, 2)),
    (UnknownTurnError, ErrorKind(404, 2)),
    (ResumeAuthorizationError, ErrorKind(403, 2)),
    (SessionAccessError, ErrorKind(403, 2)),
    (ResumeConflictError, ErrorKind(409, 2)),
    (SessionBusyError, ErrorKind(409, 1)),
    (SessionExistsError, ErrorKind(409, 2)),
    (ForkRerunsToolsError, ErrorKind(409, 2)),
    (TurnConflictError, ErrorKind(409, 1)),
    (TurnSuspendedError, ErrorKind(409, 1)),
    (StoreError, ErrorKind(503, 2)),
    (AuthorizeAnswerError, ErrorKind(503, 1, said=True)),
    (LeaseTimeoutError, ErrorKind(503, 1)),
    (RuntimeNotOpenError, ErrorKind(500, 2, said=True)),
    (ConfigurationError, ErrorKind(500, 2)),
    (TimeoutError, ErrorKind(504, 1)),
    (LookupError, ErrorKind(404, 2)),
    (ValueError, ErrorKind(400, 2)),
    (DurableTurnsError, ErrorKind(500, 1)),
)
"""Each exception class hosts answer, with its :class:`ErrorKind`; a subclass comes before
its bases (``InvalidInputError`` is a ``ValueError``, ``UnknownTurnError`` a
``LookupError``), so the first entry that matches is the one."""


def error_kind(exc: BaseException) -> ErrorKind | None:
    """How hosts answer ``exc``: the first entry of :data:`ERRORS` it is an instance of.

    Args:
        exc: the exception a request or a command raised.

    Returns:
        Its kind, or ``None`` for an exception the table does not know (a bug, or a
        foreign failure such as an SDK's): the server answers 500, the CLI lets it show.
    """
    for cls, kind in ERRORS:
        if isinstance(exc, cls):
            return kind
    return None


__all__ = [
    "ERRORS",
    "RUNTIME_FAILURES",
    "AuthorizeAnswerError",
    "Cancelled",
    "ConfigurationError",
    "DurableTurnsError",
    "ErrorKind",
    "FatalToolError",
    "ForkRerunsToolsError",
    "InvalidInputError",
    "LeaseLostError",
    "LeaseTimeoutError",
    "LimitExceeded",
    "ModelError",
    "OutputInvalid",
    "Parked",
    "ResumeAuthorizationError",
    "ResumeConflictError",
    "RetryStep",
    "RuntimeNotOpenError",
    "SessionAccessError",
    "SessionBusyError",
    "SessionExistsError",
    "StoreError",
    "ToolCrashedError",
    "ToolDeclarationError",
    "TurnConflictError",
    "TurnSuspendedError",
    "UnknownAgentError",
    "UnknownTurnError",
    "error_kind",
    "runtime_failure",
]
