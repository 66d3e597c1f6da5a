"""Tool steps: run the calls a reply asked for, one at a time or a batch at once (F3, F15).

A call's step is ``tool:<n>:<call_id>`` (``n``: the transcript index of the assistant message
that made it). Its result and its tool message commit in one transaction:

- a **local** tool (a plain ``def``) runs inside that transaction, in a savepoint, on the
  store's raw handle: its writes commit with the step or not at all (exactly once);
- a **remote** tool (``async def``) runs first, then its result commits (at least once: key
  its effects on ``ctx.idempotency_key``);
- a call that names no tool, or whose input fails the schema, commits an error result the
  model reads; the tool is not run.

With ``Agent(parallel_tools=True)`` the owed calls of one reply run as a batch: remote calls
concurrently, each committing its own step as it finishes (its outcome in the step's memo),
local calls one at a time in call order; tool messages reach the transcript in call order
(``_tool_message.py``). Calls that park are collected: the turn parks on all of them at once.

A remote call gets :class:`CallServices` (its ``ToolContext``'s): to ask a person, see its
turn's cancel, record and follow durable child work; an intent first: ``_in_doubt.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .._tracing import StepSpan
from ..agent import Agent
from ..context import Sessions, ToolContext
from ..errors import (
    RUNTIME_FAILURES,
    ConfigurationError,
    FatalToolError,
    Parked,
    RetryStep,
    ToolCrashedError,
    runtime_failure,
)
from ..events import ActionCompleted, ActionRetry, TurnEvent
from ..inbound import InboundEvent
from ..messages import ToolCall, encode_json
from ..records import (
    CallOutcome,
    InputRequest,
    StepId,
    StepResult,
    ToolMemo,
    ToolStepId,
)
from ..stores import Transaction
from ..tools import Tool
from ._call_services import CallServices
from ._commits import StepCommits
from ._in_doubt import settle
from ._step_context import StepContext
from ._tool_message import BatchState, tool_message

log = logging.getLogger("durable_turns")
T = TypeVar("T")

ERROR_LIMIT = 2000
"""A tool error's text is cut to this many characters before the model reads it."""

CancelReason = Callable[[str], "str | None"]
"""The reason a turn was asked to cancel, if it was (kept current by the driver)."""
PublishLive = Callable[[TurnEvent], None]
"""Receives live events, never stored: text as it streams, retries."""
Interruptible = Callable[[Awaitable[Any], str], Awaitable[Any]]
"""Awaits a call in the driving task so that a cancel of the turn can stop it."""
Local = tuple[Tool, dict[str, Any], "ToolContext | None"]
"""A local tool to run in a step's transaction: the tool, its checked input, its context."""


def error_text(e: BaseException) -> str:
    """What the model reads for a tool's exception: ``Class: message``, no traceback."""
    msg = str(e)
    name = type(e).__name__
    text = msg if type(e) is Exception else (f"{name}: {msg}" if msg else name)
    return text[:ERROR_LIMIT]


class ToolResultError(Exception):
    """A tool returned what cannot be stored (not JSON, too large)."""


def _checked_result(value: Any, limit: int) -> Any:
    try:
        text = encode_json(value)
    except (TypeError, ValueError) as e:
        raise ToolResultError(
            f"the tool returned a {type(value).__name__}, which is not JSON-serialisable ({e}); "
            "return dicts, lists, strings, numbers, booleans or None"
        ) from None
    # A UTF-8 character is at most 4 bytes: only a long text needs its bytes counted.
    if len(text) * 4 > limit and (size := len(text.encode())) > limit:
        raise ToolResultError(
            f"the tool's result is {size:,} bytes of JSON, over the limit of {limit:,} "
            "(Agent(max_result_bytes=…)); return less, or a reference to where the data is"
        )
    return value


def _hashed(prefix: str, turn_id: str, step_id: str) -> str:
    """``ctx.idempotency_key``: per (session, generation, turn, step); ``prefix``: the gen's."""
    return hashlib.sha256(f"{prefix}{turn_id}/{step_id}".encode()).hexdigest()[:32]


class _NoHandle:
    """The store handle a remote tool sees: there is no transaction to join."""

    def unwrap(self) -> Any:
        raise FatalToolError("ctx.store.unwrap() is only available to local tools (a plain "
                             "def): an async tool runs outside the step's transaction")


def _run_local(tool: Tool, args: dict[str, Any], ctx: ToolContext | None, limit: int) -> Any:
    out = tool.call_local(args, ctx)
    if inspect.isawaitable(out):
        close = getattr(out, "close", None)
        if close is not None:
            close()  # never awaited: don't leave a dangling coroutine behind
        raise ConfigurationError(
            f"tool {tool.name!r} is a plain def that returned an awaitable; declare it "
            "`async def` so the engine awaits it as a remote tool (its result would be lost)"
        )
    return _checked_result(out, limit)


def _abandon_if_failed(services: Any) -> None:
    """Raise the runtime failure a tool met through its context, if it met one: its attempt
    is abandoned (nothing of the step commits) whatever it returned or raised."""
    if isinstance(services, CallServices) and services.failure is not None:
        raise services.failure


class ToolCalls:
    """Runs and commits the tool calls of one drive of a session.

    Args:
        ctx: the runtime's collaborators (the store, live events, the runtime's sessions
            for calls that start durable child work).
        agent: the session's agent (its tools, limits, parallelism).
        commits: how a step commits.
        cancel_reason: the reason a turn was asked to cancel, if it was; ``interruptible``
            awaits a call so that a cancel of its turn stops it at once.
    """

    def __init__(self, ctx: StepContext, agent: Agent, commits: StepCommits,
                 cancel_reason: CancelReason, interruptible: Interruptible) -> None:
        self.agent = agent
        self.commits = commits
        self.cancel_reason = cancel_reason
        self.publish_live: PublishLive = ctx.publish_live
        self.sessions: Sessions = ctx.sessions
        self._store = ctx.store
        self.clock = ctx.clock
        self._interruptible = interruptible
        self.asked_at = -1
        """The transcript index of the last reply this drive committed (a batch it asked
        for has no committed calls yet: only a replay reads them)."""
        self.failing: str | None = None
        """Why a batch is stopping its calls, while it fails."""
        self.attempt: int | None = None
        """The one attempt this drive runs of a remote call (``Runtime.step(attempt=)``), or
        ``None``: a call runs all its attempts here."""
        self._stop_batch: Callable[[], None] | None = None
        self._ran_local = False
        self.found: dict[str, str] = {}  # cancels looked up after a local tool's step

    def reason(self, turn_id: str) -> str | None:
        """The turn's cancel: flagged, or found in the store (:meth:`cancelled`)."""
        return self.cancel_reason(turn_id) or self.found.get(turn_id)

    async def cancelled(self, turn_id: str) -> str | None:
        """:meth:`reason` at a boundary; after a local tool's step (it held the write lock)
        it looks in the store too, for a cancel no flag has heard of yet (F7)."""
        if (reason := self.reason(turn_id)) is None and self._ran_local:
            self._ran_local = False
            if (reason := await self.commits.lease.cancel_requested(turn_id)) is not None:
                self.found[turn_id] = reason
        return reason

    async def read_step(self, step: StepId) -> StepResult | None:
        """What a stored step keeps (a batch's committed outcome, an answer), by its id."""
        step_id = str(step)
        steps = await self._store.read_steps(self.commits.lease.key, step_id=step_id)
        return steps[step_id].result if step_id in steps else None

    def interrupt(self) -> None:
        """The turn was asked to cancel: stop the batch's interruptible calls now."""
        if self._stop_batch is not None:
            self._stop_batch()

    # -- one call --------------------------------------------------------------------------

    async def one(self, turn_id: str, n: int, call: ToolCall, tools: Mapping[str, Tool],
                  event: InboundEvent | None) -> InputRequest | None:
        """Run one owed call and commit its result; returns what it parked on, if it did
        (nothing of it is committed then: the engine commits the park)."""
        step = ToolStepId(n, call.id)
        tool, args, problem, ctx = self._prepare(turn_id, step, call, tools, event)
        trace = self.commits.trace
        span = trace.tool_step(str(step), call) if trace is not None else None
        outcome: CallOutcome | None = None
        if problem is not None or tool is None:
            outcome = CallOutcome({"error": problem}, problem)
        elif tool.remote:
            running = self._call_remote(tool, args, ctx, call, turn_id, span, n)
            try:
                outcome = await (self._interruptible(running, turn_id) if tool.interruptible
                                 else running)
            except Parked as p:
                assert isinstance(p.request, InputRequest)
                if span is not None:
                    span.parked(p.request)
                return p.request
        local = None if outcome is not None or tool is None else (tool, args, ctx)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            nonlocal outcome
            if local is not None:
                outcome = await self._run_local_in(tx, call, turn_id, local)
            assert outcome is not None
            idx = self.commits.add(tx, tool_message(call, outcome, turn_id))
            tx.add_step(step, turn_id, ToolMemo(idx))
            return [tx.add_event(ActionCompleted(**self.commits.ids(turn_id), call=call,
                                                 result=outcome.result, error=outcome.error))]

        await self.commits.commit(fill)
        if span is not None and outcome is not None:
            span.done(outcome.error)
        return None

    def _prepare(self, turn_id: str, step: ToolStepId, call: ToolCall,
                 tools: Mapping[str, Tool], event: InboundEvent | None
                 ) -> tuple[Tool | None, dict[str, Any], str | None, ToolContext | None]:
        """The call's tool, its checked input (or the problem with it) and its context (None
        when nothing will read one: no tool runs, or it takes none)."""
        tool = tools.get(call.name)
        args: dict[str, Any] = {}
        problem: str | None = None
        if tool is None:
            problem = f"unknown tool: {call.name}"
        else:
            try:
                args = tool.validate(dict(call.input))
            except ValueError as e:
                problem = f"invalid input for {call.name}: {e}"[:ERROR_LIMIT]
        if tool is None or problem is not None or not tool.uses_context:
            return tool, args, problem, None
        key, step_id = self.commits.lease.key, str(step)
        ctx = ToolContext(
            agent=key.agent, session=key.session, turn_id=turn_id, call_id=call.id,
            step_id=step_id,
            idempotency_key=_hashed(self.commits.key_prefix(), turn_id, step_id),
            store=_NoHandle(), event=event, user=event.user if event else None,
            services=CallServices(self, turn_id, call.id, event) if tool.remote else None,
        )
        return tool, args, problem, ctx

    async def _call_remote(self, tool: Tool, args: dict[str, Any], ctx: ToolContext | None,
                           call: ToolCall, turn_id: str, span: StepSpan | None, n: int
                           ) -> CallOutcome:
        """Run a remote tool (behind an intent unless ``in_doubt="rerun"``: ``_in_doubt.py``):
        its result, or an error result for an exception it raised.

        Raises:
            Parked: the tool asked a person.
            FatalToolError, ConfigurationError: the turn fails.
            ToolCrashedError: the tool raised KeyboardInterrupt or SystemExit.
        """
        on_retry = self._on_retry(tool, call, turn_id, span)
        limit = self.agent.max_result_bytes

        async def run() -> Any:
            return _checked_result(await tool.call(args, ctx, on_retry, self.attempt), limit)

        def outcome_of() -> Awaitable[CallOutcome]:
            return self._outcome(run(), tool, call, turn_id)
        services = ctx.services if ctx is not None else None
        try:
            outcome = await (outcome_of() if tool.in_doubt == "rerun" or ctx is None else
                             settle(self, n, tool, args, ctx, call, turn_id, outcome_of))
        except Parked:
            _abandon_if_failed(services)
            raise
        _abandon_if_failed(services)
        return outcome

    async def _run_local_in(self, tx: Transaction, call: ToolCall, turn_id: str,
                            local: Local) -> CallOutcome:
        """Run a local tool inside ``tx`` (its writes roll back if it raises)."""
        tool, args, ctx = local
        self._ran_local = True
        if ctx is not None:
            ctx.store = tx
        limit = self.agent.max_result_bytes
        return await self._outcome(tx.run_local(lambda _h: _run_local(tool, args, ctx, limit)),
                                   tool, call, turn_id)

    async def _outcome(self, running: Awaitable[Any], tool: Tool, call: ToolCall,
                       turn_id: str) -> CallOutcome:
        """What a tool's run comes to: its result, or an error result for an exception it
        raised; a crash (KeyboardInterrupt, SystemExit) abandons the step, a fatal error and
        a park go on up."""
        try:
            return CallOutcome(await running)
        except (KeyboardInterrupt, SystemExit) as e:
            key = self.commits.lease.key
            log.error("turn %s of %s: tool %r raised %s; the step is abandoned", turn_id, key,
                      tool.name, type(e).__name__)
            raise ToolCrashedError(tool.name, e, session=str(key), turn_id=turn_id,
                                   call_id=call.id) from e
        except (FatalToolError, ConfigurationError):
            raise  # the turn fails
        except RUNTIME_FAILURES:
            raise  # the runtime's own failure (a tool's raised it on): the step is abandoned
        except Exception as e:
            error = error_text(e)
            return CallOutcome({"error": error}, error)

    def _on_retry(self, tool: Tool, call: ToolCall, turn_id: str, span: StepSpan | None
                  ) -> Callable[[int, float, BaseException], None] | None:
        if not tool.retries:
            return None
        ids = self.commits.ids(turn_id)
        lease = self.commits.lease

        def on_retry(attempt: int, delay: float, e: BaseException) -> None:
            error = error_text(e)
            log.warning("turn %s of %s: tool %r failed (%s); attempt %d of %d in %.2fs",
                        turn_id, lease.key, tool.name, error, attempt + 1, tool.retries + 1,
                        delay)
            if span is not None:
                span.retry(attempt, delay, error)
            self.publish_live(ActionRetry(**ids, seq=lease.last_seq, call=call,
                                          attempt=attempt, retries=tool.retries, delay=delay,
                                          error=error))

        return on_retry

    # -- a batch (F15) ---------------------------------------------------------------------

    async def committed(self, n: int, calls: list[ToolCall]) -> dict[str, CallOutcome]:
        """The batch's calls that committed their step, not in the transcript yet."""
        found: dict[str, CallOutcome] = {}
        for c in calls:
            outcome = await self.read_step(ToolStepId(n, c.id))
            if isinstance(outcome, CallOutcome):
                found[c.id] = outcome
        return found

    async def batch(self, turn_id: str, n: int, owed: list[ToolCall],
                    tools: Mapping[str, Tool], event: InboundEvent | None
                    ) -> InputRequest | None:
        """Run the owed calls of one reply at once (see the module docstring); returns the
        request the turn parks on if calls parked (the first, the others in ``more``)."""
        ids = self.commits.ids(turn_id)
        fresh = n == self.asked_at and len(owed) == len(self.commits.transcript[n].tool_calls)
        self.asked_at = -1  # once: a batch that parks comes back as a replay
        state = BatchState(owed, {} if fresh else await self.committed(n, owed))
        parked: dict[str, InputRequest] = {}
        retrying: list[RetryStep] = []
        interruptible: set[asyncio.Task[None]] = set()

        async def commit(call: ToolCall, outcome: CallOutcome | None, local: Local | None = None,
                         shielded: bool = False, span: StepSpan | None = None) -> None:
            async def fill(tx: Transaction) -> list[TurnEvent]:
                done = outcome if local is None else await self._run_local_in(tx, call,
                                                                              turn_id, local)
                assert done is not None
                state.done[call.id] = done
                tx.add_step(ToolStepId(n, call.id), turn_id, done)
                ready = state.ready()
                for c, o in ready:
                    self.commits.add(tx, tool_message(c, o, turn_id))
                # Counted under the commit lock (the next commit reads it); a failed commit
                # ends the whole batch, so it never counts what was not written.
                state.listed += len(ready)
                return [tx.add_event(ActionCompleted(**ids, call=call, result=done.result,
                                                     error=done.error))]

            await self.commits.beside(fill, shielded=shielded)
            if span is not None:
                span.done(state.done[call.id].error)

        async def remote(call: ToolCall, tool: Tool, args: dict[str, Any],
                         ctx: ToolContext | None, span: StepSpan | None) -> None:
            try:
                outcome = await self._call_remote(tool, args, ctx, call, turn_id, span, n)
            except Parked as p:
                assert isinstance(p.request, InputRequest)
                parked[call.id] = p.request
                if span is not None:
                    span.parked(p.request)
                return
            except RetryStep as r:
                # One attempt of the step: the batch's other calls go on and commit, so
                # the step's next attempt runs only the calls still owed.
                retrying.append(r)
                return
            except asyncio.CancelledError:
                if tool.interruptible and self.reason(turn_id) is not None:
                    return  # interrupted by a cancel of the turn: it ends cancelled
                raise
            await commit(call, outcome, shielded=tool.interruptible, span=span)

        tasks: list[asyncio.Task[None]] = []
        one_by_one: list[tuple[ToolCall, Tool | None, dict[str, Any], str | None,
                               ToolContext | None, StepSpan | None]] = []
        trace = self.commits.trace
        for c in owed:
            if c.id in state.done:
                continue
            step = ToolStepId(n, c.id)
            tool, args, problem, ctx = self._prepare(turn_id, step, c, tools, event)
            span = trace.tool_step(str(step), c) if trace is not None else None
            if problem is None and tool is not None and tool.remote:
                task = asyncio.create_task(remote(c, tool, args, ctx, span))
                tasks.append(task)
                if tool.interruptible:
                    interruptible.add(task)
            else:
                one_by_one.append((c, tool, args, problem, ctx, span))

        def stop() -> None:
            # Once per call: a second cancel would cut short its clean-up (a subagent's child).
            while interruptible:
                interruptible.pop().cancel()

        self._stop_batch = stop
        try:
            for c, tool, args, problem, ctx, span in one_by_one:
                if await self.cancelled(turn_id) is not None:
                    break  # a checkpoint boundary: the calls not run are cancelled
                if problem is not None or tool is None:
                    await commit(c, CallOutcome({"error": problem}, problem), span=span)
                else:
                    await commit(c, None, (tool, args, ctx), span=span)
            if tasks:
                # A call that fails the turn (FatalToolError, a crash, a lost lease) ends
                # the batch: the calls still running are stopped, their work is moot.
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
                for t in done:
                    if t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError) and runtime_failure(e) is None:
                # The turn fails: calls still running stop, a subagent's child with them. (A
                # runtime failure fails nothing: the step is driven again, children kept.)
                self.failing = f"turn failed: {e}"
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            self._stop_batch = None
            self.failing = None
        if retrying:
            raise max(retrying, key=lambda r: r.delay)  # each call's backoff is kept
        if not parked:
            return None
        requests = [parked[c.id] for c in owed if c.id in parked]
        return dataclasses.replace(requests[0], more=tuple(requests[1:]))


__all__ = ["ERROR_LIMIT", "CallServices", "CancelReason", "Interruptible", "Local",
           "PublishLive", "ToolCalls", "ToolResultError", "error_text"]
