"""The turn loop: read the position off the transcript, run the next step, commit it.

A turn is driven under the session's lease. Its position is read off the message log, which
is authoritative: every step commits its memo row and its message in one transaction, so a
step with a stored result is always visible in the transcript, and the loop simply picks up
at the first step the transcript does not show yet.

- no assistant message after the opening (or the last calls all answered) → model step
  ``model:<n>``, ``n`` = the index the reply will get;
- the last assistant message has calls with no tool message → tool step ``tool:<n>:<id>``
  for the first owed call, ``n`` = that assistant message's index;
- the last assistant message has no calls → the turn is complete (committed with it).

The engine imports seams only (stores, models, events): never an adapter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import jsonschema

from .agent import Agent, SurfacePolicy
from .batch import BatchState
from .errors import (
    Cancelled,
    ConfigurationError,
    FatalToolError,
    LeaseLostError,
    ModelError,
    Parked,
    StoreError,
    ToolCrashedError,
)
from .events import (
    ActionCompleted,
    ActionRequested,
    ActionRetry,
    EventIds,
    InputRequested,
    MessageCompleted,
    MessageDelta,
    MessageRetry,
    TurnCancelled,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
    TurnStarted,
)
from .hitl import default_answerers
from .inbound import InboundEvent
from .messages import Message, ToolCall, encode_json, owed_calls
from .models import ABNORMAL_STOPS, Model, ModelRequest
from .records import (
    Answer,
    CallOutcome,
    ChildMemo,
    ChildStepId,
    InputRequest,
    InputStepId,
    ModelMemo,
    ModelStepId,
    StepId,
    StepResult,
    ToolMemo,
    ToolStepId,
    TurnRecord,
    TurnResult,
    TurnStatus,
)
from .replies import RetryPolicy, ask
from .stores import Lease, Transaction
from .tools import Tool, ToolContext, compile_schema
from .tracing import StepSpan, TurnTrace, begin_turn

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("durable_turns")

TRACE = "trace"
"""The name tracing keeps a turn's span context under, on the turn's chain entry."""
T = TypeVar("T")

ERROR_LIMIT = 2000
"""A tool error's text is cut to this many characters before the model reads it."""

Publish = Callable[[list[TurnEvent]], None]
"""Receives a step's events once its transaction committed."""
PublishLive = Callable[[TurnEvent], None]
"""Receives live events, never stored: text as it streams, model retries."""
CancelReason = Callable[[str], "str | None"]
"""The reason a turn was asked to cancel, if it was (kept current by the driver)."""
ReadStep = Callable[[StepId], Awaitable["StepResult | None"]]
"""Reads what a stored step keeps (a person's answer, a subagent's record), by its id."""


def error_text(e: BaseException) -> str:
    """What the model reads for a tool's exception: ``Class: message``, no traceback."""
    msg = str(e)
    name = type(e).__name__
    text = msg if type(e) is Exception else (f"{name}: {msg}" if msg else name)
    return text[:ERROR_LIMIT]


def _hashed(prefix: str, turn_id: str, step_id: str) -> str:
    """``ctx.idempotency_key``: stable per (session, generation, turn, step); ``prefix`` is
    ``<session key>#g<generation>/``."""
    return hashlib.sha256(f"{prefix}{turn_id}/{step_id}".encode()).hexdigest()[:32]


def _always() -> bool:
    return True


class ToolResultError(Exception):
    pass


def _encode_result(value: Any, limit: int) -> Any:
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


class TurnEngine:
    """Drives the turns of one session while its lease is held."""

    def __init__(
        self,
        agent: Agent,
        model: Model,
        lease: Lease,
        transcript: list[Message],
        publish: Publish,
        publish_live: PublishLive,
        read_step: ReadStep,
        cancel_reason: CancelReason,
        runtime: Runtime | None = None,
        wants_live: Callable[[], bool] | None = None,
    ) -> None:
        self.agent = agent
        self.runtime = runtime
        self.model = model
        self.lease = lease
        self.transcript = transcript
        self._publish = publish
        self._publish_live = publish_live
        self._wants_live = wants_live or _always
        """Whether anyone takes live text now (else a reply's deltas are not even built)."""
        self._retry = RetryPolicy(agent.model_retries, agent.model_retry_delay)
        self._read_step = read_step
        self._cancel_reason = cancel_reason
        self.turn_id: str | None = None
        self._streaming: asyncio.Task[Any] | None = None
        self._interrupted = False
        self._staged: list[Message] = []
        # Commits made beside the loop's own (a parallel batch's calls, a subagent's
        # forwarded events) take turns: one transaction of a lease at a time.
        self._lock = asyncio.Lock()
        self._on_interrupt: Callable[[], None] | None = None
        self._asked_at = -1  # the index of the last reply this engine committed
        self._failing: str | None = None  # why a batch is stopping its calls, if it fails
        self._trace: TurnTrace | None = None
        self._prefix: tuple[int, str] = (-1, "")

    def interrupt(self, turn_id: str) -> None:
        """Stop the model's stream if ``turn_id`` is streaming: a cancel was requested.

        Closing the stream closes the adapter's HTTP stream instead of reading it to the end.
        """
        if self.turn_id == turn_id and self._on_interrupt is not None:
            self._on_interrupt()
        if self.turn_id == turn_id and self._streaming is not None and not self._interrupted:
            self._interrupted = True
            self._streaming.cancel()

    async def _interruptible(self, stream: Awaitable[T], turn_id: str) -> T:
        """Await the model's reply in the driving task, so that :meth:`interrupt` can stop it.

        No task per step: ``interrupt()`` cancels the driving task itself, and the
        cancellation is taken back (``uncancel``) and turned into :class:`Cancelled`. The
        driver calls ``interrupt()`` for a cancel made here and for one its store's feed
        reports from another process.
        """
        task = asyncio.current_task()
        assert task is not None
        self._streaming, self._interrupted = task, False
        try:
            return await stream
        except asyncio.CancelledError:
            if self._interrupted and task.uncancel() == 0:
                raise Cancelled(self._cancel_reason(turn_id) or "cancelled") from None
            raise
        finally:
            self._streaming = None

    # -- the loop --------------------------------------------------------------------------

    async def run(self, turn: TurnRecord) -> TurnResult:
        """Drive ``turn`` from wherever the transcript shows it to its end (or its park)."""
        trace = begin_turn(self.lease.key, turn, self.transcript, self.model)
        if trace is None:
            return await self._run(turn)
        self._trace = trace
        try:
            out = await self._run(turn)
        except BaseException as e:
            trace.abandon(e)
            raise
        finally:
            self._trace = None
        trace.end(out)
        return out

    async def _run(self, turn: TurnRecord) -> TurnResult:
        policy = SurfacePolicy.from_dict(turn.policy) if turn.policy else None
        event = InboundEvent.from_dict(turn.event) if turn.event else None
        self.turn_id = turn.turn_id
        try:
            if not self._has_opening(turn.turn_id):
                self._check_cancel(turn.turn_id)
                await self._open(turn)
            while True:
                self._check_cancel(turn.turn_id)
                n, owed = owed_calls(self.transcript)
                last = self.transcript[n] if n >= 0 else None
                if owed:
                    if self.agent.parallel_tools and len(owed) > 1:
                        parked = await self._batch_step(turn, n, owed, policy, event)
                    else:
                        parked = await self._tool_step(turn, n, owed[0], policy, event)
                    if parked is not None:
                        return parked
                elif last and last.role == "assistant" and not last.tool_calls \
                        and last.turn_id == turn.turn_id:
                    # The reply that ended the turn committed (with the turn's end, normally).
                    return await self._finish(TurnResult(turn.turn_id, TurnStatus.COMPLETED,
                                                         last.text))
                else:
                    done = await self._model_step(turn, policy)
                    if done is not None:
                        return done
        except Cancelled as c:
            return await self._finish(TurnResult(turn.turn_id, TurnStatus.CANCELLED,
                                                 reason=c.reason))
        except (LeaseLostError, StoreError, ToolCrashedError):
            raise  # nothing of the step was written: the turn stays for another drive
        except (ModelError, FatalToolError, ConfigurationError) as e:
            return await self._finish(TurnResult(turn.turn_id, TurnStatus.FAILED, error=str(e)))
        except Exception as e:
            log.exception("turn %s of %s failed inside the engine", turn.turn_id, self.lease.key)
            error = f"internal error: {type(e).__name__}: {e}"
            return await self._finish(TurnResult(turn.turn_id, TurnStatus.FAILED, error=error))
        finally:
            self.turn_id = None

    def _has_opening(self, turn_id: str) -> bool:
        # Turns run in chain order, so this turn's messages are at the end of the log.
        for m in reversed(self.transcript):
            if m.turn_id != turn_id:
                return False
            if m.is_opening:
                return True
        return False

    def _check_cancel(self, turn_id: str) -> None:
        reason = self._cancel_reason(turn_id)
        if reason is not None:
            raise Cancelled(reason)

    async def _commit(self, fill: Callable[[Transaction], Awaitable[list[TurnEvent]]]) -> None:
        """One transaction: ``fill(tx)`` buffers messages (through :meth:`_add`), steps and
        events; the transcript and the observers learn of them after the commit."""
        self._staged.clear()
        async with self.lease.transaction() as tx:
            events = await fill(tx)
            if self._trace is not None and self._trace.pending and self.turn_id is not None:
                tx.set_turn_data(self.turn_id, TRACE, self._trace.record())
        self.transcript.extend(self._staged)
        self._staged.clear()
        self._publish(events)

    def _add(self, tx: Transaction, message: Message) -> int:
        self._staged.append(message)
        return tx.add_message(message)

    async def _open(self, turn: TurnRecord) -> None:
        opening = turn.opening
        assert opening is not None, "a turn always has an opening message"

        async def fill(tx: Transaction) -> list[TurnEvent]:
            self._add(tx, opening)
            tx.set_turn(TurnResult(turn.turn_id, TurnStatus.RUNNING))
            tx.set_status("running")
            return [tx.add_event(TurnStarted(**self._ids(turn.turn_id), text=opening.text))]

        await self._commit(fill)

    def _key_prefix(self) -> str:
        """What every idempotency key of the live generation starts with (built once)."""
        gen = self.lease.generation
        if self._prefix[0] != gen:
            self._prefix = (gen, f"{self.lease.key}#g{gen}/")
        return self._prefix[1]

    def _ids(self, turn_id: str) -> EventIds:
        return {"agent": self.lease.key.agent, "session": self.lease.key.session,
                "turn_id": turn_id}

    # -- model step ------------------------------------------------------------------------

    def _system(self, policy: SurfacePolicy | None) -> str:
        base = self.agent.instructions
        if policy is None or not policy.instructions:
            return base
        if policy.mode == "replace":
            return policy.instructions
        return f"{base}\n\n{policy.instructions}" if base else policy.instructions

    def _tools(self, policy: SurfacePolicy | None) -> dict[str, Tool]:
        tools = self.agent.tools_by_name
        if policy is None or not policy.deny_tools:
            return tools
        return {k: t for k, t in tools.items() if k not in policy.deny_tools}

    async def _model_step(self, turn: TurnRecord, policy: SurfacePolicy | None
                          ) -> TurnResult | None:
        turn_id = turn.turn_id
        n = len(self.transcript)
        request = ModelRequest(
            system=self._system(policy),
            messages=self.transcript,
            tools=[t.spec for t in self._tools(policy).values()],
            turn_id=turn_id,
        )
        ids = self._ids(turn_id)
        span = self._trace.model_step(str(ModelStepId(n))) if self._trace is not None else None

        def on_text(text: str) -> None:
            if self._wants_live():
                self._publish_live(MessageDelta(**ids, seq=self.lease.last_seq, text=text))

        def on_retry(attempt: int, delay: float, error: ModelError) -> None:
            if span is not None:
                span.retry(attempt, delay, str(error))
            log.warning("turn %s of %s: model call failed (%s); attempt %d of %d in %.2fs",
                        turn_id, self.lease.key, error, attempt + 1, self._retry.retries + 1,
                        delay)
            self._publish_live(MessageRetry(**ids, seq=self.lease.last_seq, attempt=attempt,
                                            retries=self._retry.retries, delay=delay,
                                            error=str(error)))

        got = await self._interruptible(
            ask(self.model, request, self._retry, on_text=on_text, on_retry=on_retry), turn_id)
        text, calls, stop = got.text, got.calls, got.stop
        if stop.reason in ABNORMAL_STOPS and not text and not calls:
            raise ModelError(
                f"model {type(self.model).__name__} stopped ({stop.reason}) with an empty "
                "reply", provider=type(self.model).__name__,
            )
        reply = Message("assistant", text, tuple(calls), turn_id=turn_id,
                        content=stop.content, usage=dict(stop.usage))
        memo = ModelMemo(n, stop.reason)
        done = None if calls else TurnResult(turn_id, TurnStatus.COMPLETED, text)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            self._add(tx, reply)
            tx.add_step(ModelStepId(n), turn_id, memo)
            out = [tx.add_event(MessageCompleted(**ids, text=text, tool_calls=tuple(calls),
                                                 stop_reason=stop.reason, usage=reply.usage))]
            out += [tx.add_event(ActionRequested(**ids, call=c)) for c in calls]
            if done is not None:
                out += self._end(tx, done)
            return out

        await self._commit(fill)
        self._asked_at = n
        if span is not None:
            span.model_done(reply.usage or {}, stop.reason)
        return done

    # -- tool step -------------------------------------------------------------------------

    async def _tool_step(self, turn: TurnRecord, n: int, call: ToolCall,
                         policy: SurfacePolicy | None, event: InboundEvent | None
                         ) -> TurnResult | None:
        """Run one owed call and commit its result; returns an outcome only if it parked."""
        turn_id = turn.turn_id
        step_id = ToolStepId(n, call.id)
        tool, args, problem, ctx = self._prepare(turn_id, n, call, policy, event)
        span = self._trace.tool_step(str(step_id), call) if self._trace is not None else None
        if problem is not None or tool is None:
            await self._record(turn_id, n, call, step_id, {"error": problem}, problem, span=span)
        elif tool.remote:
            running = self._call_remote(tool, args, ctx, call, turn_id, span)
            try:
                outcome = await (self._interruptible(running, turn_id) if tool.interruptible
                                 else running)
            except Parked as p:
                assert isinstance(p.request, InputRequest)
                out = TurnResult(turn_id, TurnStatus.SUSPENDED, request=p.request)
                if span is not None:
                    span.parked(p.request)

                async def park(tx: Transaction) -> list[TurnEvent]:
                    return self._end(tx, out)

                await self._commit(park)
                return out
            await self._record(turn_id, n, call, step_id, outcome.result, outcome.error,
                               span=span)
        else:
            await self._record(turn_id, n, call, step_id, None, None, local=(tool, args, ctx),
                               span=span)
        return None

    def _prepare(self, turn_id: str, n: int, call: ToolCall, policy: SurfacePolicy | None,
                 event: InboundEvent | None
                 ) -> tuple[Tool | None, dict[str, Any], str | None, ToolContext | None]:
        """The call's tool, its checked input (or the problem with it) and its context (None
        when nothing will read one: no tool runs, or it takes none)."""
        step_id = str(ToolStepId(n, call.id))
        tool = self._tools(policy).get(call.name)
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
        ctx = ToolContext(
            agent=self.lease.key.agent, session=self.lease.key.session, turn_id=turn_id,
            call_id=call.id, step_id=step_id,
            idempotency_key=_hashed(self._key_prefix(), turn_id, step_id),
            store=_NoHandle(), event=event, user=event.user if event else None,
        )
        if tool.remote:
            ctx.park = self._parker(turn_id, call.id, event)
            ctx.runtime = self.runtime
            ctx.record_child = self._child_recorder(turn_id, call.id)
            ctx.forward = self._forwarder(turn_id)
            ctx.forward_live = self._live_forwarder(turn_id)
            ctx.cancel_check = lambda: self._cancel_reason(turn_id) or self._failing
        return tool, args, problem, ctx

    async def _call_remote(self, tool: Tool, args: dict[str, Any], ctx: ToolContext | None,
                           call: ToolCall, turn_id: str, span: StepSpan | None = None
                           ) -> CallOutcome:
        """Run a remote tool: its result, or an error result for an exception it raised.

        Raises:
            Parked: the tool asked a person.
            FatalToolError, ConfigurationError: the turn fails.
            ToolCrashedError: the tool raised KeyboardInterrupt or SystemExit.
        """
        on_retry = self._on_tool_retry(tool, call, span)
        limit = self.agent.max_result_bytes

        async def run() -> Any:
            return _encode_result(await tool.call(args, ctx, on_retry), limit)

        return await self._outcome(run(), tool, call, turn_id)

    async def _outcome(self, running: Awaitable[Any], tool: Tool, call: ToolCall,
                       turn_id: str) -> CallOutcome:
        """What a tool's run comes to: its result, or an error result for an exception it
        raised; a crash (KeyboardInterrupt, SystemExit) abandons the step, a fatal error and
        a park go on up."""
        try:
            return CallOutcome(await running)
        except (KeyboardInterrupt, SystemExit) as e:
            raise self._crashed(tool, call, turn_id, e) from e
        except (FatalToolError, ConfigurationError):
            raise
        except Exception as e:
            error = error_text(e)
            return CallOutcome({"error": error}, error)

    def _on_tool_retry(self, tool: Tool, call: ToolCall, span: StepSpan | None
                       ) -> Callable[[int, float, BaseException], None] | None:
        if not tool.retries:
            return None
        ids = self._ids(self.turn_id or "")

        def on_retry(attempt: int, delay: float, e: BaseException) -> None:
            error = error_text(e)
            log.warning("turn %s of %s: tool %r failed (%s); attempt %d of %d in %.2fs",
                        ids["turn_id"], self.lease.key, tool.name, error, attempt + 1,
                        tool.retries + 1, delay)
            if span is not None:
                span.retry(attempt, delay, error)
            self._publish_live(ActionRetry(**ids, seq=self.lease.last_seq, call=call,
                                           attempt=attempt, retries=tool.retries, delay=delay,
                                           error=error))

        return on_retry

    def _crashed(self, tool: Tool, call: ToolCall, turn_id: str,
                 e: BaseException) -> ToolCrashedError:
        log.error("turn %s of %s: tool %r raised %s; the step is abandoned", turn_id,
                  self.lease.key, tool.name, type(e).__name__)
        return ToolCrashedError(tool.name, e, session=str(self.lease.key), turn_id=turn_id,
                                call_id=call.id)

    def _parker(self, turn_id: str, call_id: str, event: InboundEvent | None
                ) -> Callable[..., Awaitable[Any]]:
        async def park(input_id: str, prompt: str, schema: Any, answerers: Any) -> Any:
            step = InputStepId(turn_id, input_id)
            stored = await self._read_step(step)
            if isinstance(stored, Answer):
                if self._trace is not None:
                    self._trace.input(str(step), stored.by)
                return stored.value
            if schema is not None:
                try:
                    compile_schema(schema)
                except jsonschema.SchemaError as e:
                    raise ConfigurationError(
                        f"request_input({input_id!r}): invalid schema: {e.message}") from e
            request = InputRequest(input_id, prompt, dict(schema) if schema else None,
                                   default_answerers(answerers, event, input_id),
                                   turn_id, call_id)
            raise Parked(request)

        return park

    async def _record(self, turn_id: str, n: int, call: ToolCall, step_id: ToolStepId,
                      result: Any,
                      error: str | None,
                      local: tuple[Tool, dict[str, Any], ToolContext | None] | None = None,
                      span: StepSpan | None = None) -> None:
        ids = self._ids(turn_id)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            nonlocal result, error
            if local is not None:
                tool, args, ctx = local
                if ctx is not None:
                    ctx.store = tx
                limit = self.agent.max_result_bytes
                outcome = await self._outcome(
                    tx.run_local(lambda _h: _run_local(tool, args, ctx, limit)), tool, call,
                    turn_id)
                result, error = outcome.result, outcome.error
            msg = Message("tool", call_id=call.id, result=result, is_error=error is not None,
                          turn_id=turn_id)
            idx = self._add(tx, msg)
            tx.add_step(step_id, turn_id, ToolMemo(idx))
            return [tx.add_event(ActionCompleted(**ids, call=call, result=result, error=error))]

        await self._commit(fill)
        if span is not None:
            span.done(error)

    # -- parallel batch (F15) --------------------------------------------------------------

    async def _batch_outcomes(self, n: int, calls: list[ToolCall]) -> dict[str, CallOutcome]:
        """Outcomes of the calls that committed their step but are not in the transcript."""
        found: dict[str, CallOutcome] = {}
        for c in calls:
            outcome = await self._read_step(ToolStepId(n, c.id))
            if isinstance(outcome, CallOutcome):
                found[c.id] = outcome
        return found

    async def _batch_step(self, turn: TurnRecord, n: int, owed: list[ToolCall],
                          policy: SurfacePolicy | None, event: InboundEvent | None
                          ) -> TurnResult | None:
        """Run the owed calls of one assistant message at once (F15).

        Remote calls run concurrently and each commits its own step as it finishes; local
        calls (and calls with a problem) run one at a time, in call order, each in its own
        transaction. Tool messages are appended in call order (see ``batch.py``). Calls
        that park are collected: the turn parks on all of them at once. Returns an outcome
        only if the turn parked.
        """
        turn_id = turn.turn_id
        ids = self._ids(turn_id)
        # A batch this engine has just asked for has no committed calls yet: only a
        # replay (after a crash, a park) reads them.
        fresh = n == self._asked_at and len(owed) == len(self.transcript[n].tool_calls)
        self._asked_at = -1  # once: a batch that parks comes back as a replay
        state = BatchState(owed, {} if fresh else await self._batch_outcomes(n, owed))
        parked: dict[str, InputRequest] = {}
        interruptible: set[asyncio.Task[None]] = set()

        async def commit(call: ToolCall, outcome: CallOutcome | None,
                         local: tuple[Tool, dict[str, Any], ToolContext | None] | None = None,
                         shielded: bool = False, span: StepSpan | None = None) -> None:
            async def fill(tx: Transaction) -> list[TurnEvent]:
                nonlocal outcome
                if local is not None:
                    outcome = await self._run_local_in(tx, call, turn_id, *local)
                assert outcome is not None
                state.done[call.id] = outcome
                tx.add_step(ToolStepId(n, call.id), turn_id, outcome)
                ready = state.ready()
                for c, o in ready:
                    self._add(tx, Message("tool", call_id=c.id, result=o.result,
                                          is_error=o.error is not None, turn_id=turn_id))
                # Counted under the commit lock (the next commit reads it); a failed commit
                # ends the whole batch, so it never counts what was not written.
                state.listed += len(ready)
                return [tx.add_event(ActionCompleted(**ids, call=call, result=outcome.result,
                                                     error=outcome.error))]

            await self._guarded(fill, shielded)
            if span is not None and outcome is not None:
                span.done(outcome.error)

        async def remote(call: ToolCall, tool: Tool, args: dict[str, Any],
                         ctx: ToolContext | None, span: StepSpan | None) -> None:
            try:
                outcome = await self._call_remote(tool, args, ctx, call, turn_id, span)
            except Parked as p:
                assert isinstance(p.request, InputRequest)
                parked[call.id] = p.request
                if span is not None:
                    span.parked(p.request)
                return
            except asyncio.CancelledError:
                if tool.interruptible and self._cancel_reason(turn_id) is not None:
                    return  # interrupted by a cancel of the turn: it ends cancelled
                raise
            await commit(call, outcome, shielded=tool.interruptible, span=span)

        tasks: list[asyncio.Task[None]] = []
        one_by_one: list[tuple[ToolCall, Tool | None, dict[str, Any], str | None,
                               ToolContext | None, StepSpan | None]] = []
        for c in owed:
            if c.id in state.done:
                continue
            tool, args, problem, ctx = self._prepare(turn_id, n, c, policy, event)
            span = (self._trace.tool_step(str(ToolStepId(n, c.id)), c)
                    if self._trace is not None else None)
            if problem is None and tool is not None and tool.remote:
                task = asyncio.create_task(remote(c, tool, args, ctx, span))
                tasks.append(task)
                if tool.interruptible:
                    interruptible.add(task)
            else:
                one_by_one.append((c, tool, args, problem, ctx, span))

        def interrupt() -> None:
            # Once per call: a second cancel would cut short the call's own clean-up
            # (a subagent stopping its child).
            while interruptible:
                interruptible.pop().cancel()

        self._on_interrupt = interrupt
        try:
            for c, tool, args, problem, ctx, span in one_by_one:
                if self._cancel_reason(turn_id) is not None:
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
            if not isinstance(e, asyncio.CancelledError):
                # The turn fails: calls still running stop, a subagent's child with them.
                self._failing = f"turn failed: {e}"
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            self._on_interrupt = None
            self._failing = None
        self._check_cancel(turn_id)
        if parked:
            requests = [parked[c.id] for c in owed if c.id in parked]
            out = TurnResult(turn_id, TurnStatus.SUSPENDED,
                             request=dataclasses.replace(requests[0], more=tuple(requests[1:])))

            async def park(tx: Transaction) -> list[TurnEvent]:
                return self._end(tx, out)

            await self._commit(park)
            return out
        return None

    async def _run_local_in(self, tx: Transaction, call: ToolCall, turn_id: str, tool: Tool,
                            args: dict[str, Any], ctx: ToolContext | None) -> CallOutcome:
        """Run a local tool inside ``tx`` (its writes roll back if it raises)."""
        if ctx is not None:
            ctx.store = tx
        limit = self.agent.max_result_bytes
        return await self._outcome(tx.run_local(lambda _h: _run_local(tool, args, ctx, limit)),
                                   tool, call, turn_id)

    # -- subagents (F13) -------------------------------------------------------------------

    def _child_recorder(self, turn_id: str, call_id: str
                        ) -> Callable[[ChildMemo], Awaitable[ChildMemo]]:
        step_id = ChildStepId(turn_id, call_id)

        async def record(memo: ChildMemo) -> ChildMemo:
            stored = await self._read_step(step_id)
            if isinstance(stored, ChildMemo):
                return stored

            async def fill(tx: Transaction) -> list[TurnEvent]:
                tx.add_step(step_id, turn_id, memo)
                return []

            await self._guarded(fill, True)
            return memo

        return record

    def _forwarder(self, turn_id: str) -> Callable[[list[TurnEvent]], Awaitable[None]]:
        ids = self._ids(turn_id)

        async def forward(events: list[TurnEvent]) -> None:
            async def fill(tx: Transaction) -> list[TurnEvent]:
                # Each event names its child already; it joins this turn's stream.
                return [tx.add_event(dataclasses.replace(e, seq=0, **ids)) for e in events]

            await self._guarded(fill, True)

        return forward

    def _live_forwarder(self, turn_id: str) -> Callable[[TurnEvent], None]:
        ids = self._ids(turn_id)

        def forward_live(event: TurnEvent) -> None:
            # After this turn's last durable event, as every live event is.
            self._publish_live(dataclasses.replace(event, seq=self.lease.last_seq, **ids))

        return forward_live

    async def _guarded(self, fill: Callable[[Transaction], Awaitable[list[TurnEvent]]],
                       shielded: bool) -> None:
        """Commit beside the loop: one transaction of the lease at a time and, ``shielded``,
        never cut short by a cancel of the calling task (an interrupted subagent call).

        A transaction abandoned halfway could have committed in the database without the
        lease learning of it (its event numbers, its message count), and the turn goes on
        under that lease after an interrupt; so a cancel waits for the commit to end, then
        goes on. (Any other cancel ends the drive, and the lease with it.)
        """
        async def locked() -> None:
            async with self._lock:
                await self._commit(fill)

        if not shielded:
            return await locked()

        commit = asyncio.ensure_future(locked())
        interrupted = False
        while True:
            try:
                await asyncio.shield(commit)
                break
            except asyncio.CancelledError:
                if commit.done():
                    raise
                interrupted = True
        if interrupted:
            raise asyncio.CancelledError

    # -- the end ---------------------------------------------------------------------------

    def _end(self, tx: Transaction, out: TurnResult) -> list[TurnEvent]:
        ids = self._ids(out.turn_id)
        tx.set_turn(out)
        if self._trace is not None:
            tx.set_turn_data(out.turn_id, TRACE, self._trace.record(out.status))
        tx.set_status("suspended" if out.status == TurnStatus.SUSPENDED else "idle")
        if out.status == TurnStatus.COMPLETED:
            return [tx.add_event(TurnCompleted(**ids, text=out.text or ""))]
        if out.status == TurnStatus.FAILED:
            return [tx.add_event(TurnFailed(**ids, error=out.error or ""))]
        if out.status == TurnStatus.CANCELLED:
            return [tx.add_event(TurnCancelled(**ids, reason=out.reason or ""))]
        assert out.request is not None
        return [tx.add_event(InputRequested(**ids, request=out.request))]

    # -- chain commands --------------------------------------------------------------------

    async def reset(self, entry: TurnRecord, parked: list[TurnRecord]) -> TurnResult:
        """Archive the live generation now that the reset's place in the chain has come (F8).

        Args:
            entry: the reset's chain entry; its ``data`` gets ``{"archived": generation}``.
            parked: suspended turns the reset cancels (a stale park is archived too).
        """
        done = TurnResult(entry.turn_id, TurnStatus.COMPLETED)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.set_turn(done)
            tx.set_turn_data(entry.turn_id, "reset", {"archived": self.lease.generation})
            tx.new_generation()
            return [tx.add_event(TurnCancelled(**self._ids(t.turn_id), reason="reset"))
                    for t in parked]

        await self._commit(fill)
        self.transcript.clear()
        return done

    async def answer(self, entry: TurnRecord, parked: TurnRecord | None) -> TurnResult:
        """Store a person's answer now that the resume's place in the chain has come (F6).

        The answer becomes step ``input:<turn_id>:<input_id>`` and the parked turn runs
        again. If the session is no longer parked on that request (a reset came first), the
        resume fails with the reason and nothing else changes.
        """
        d = entry.args or {}
        turn_id, input_id = str(d.get("turn_id")), str(d.get("input_id"))
        request = parked.request if parked is not None else None
        if parked is None or request is None or parked.turn_id != turn_id or \
                input_id not in {r.id for r in request.all}:
            where = f"{parked.turn_id!r}" if parked is not None else "nothing"
            refused = TurnResult(entry.turn_id, TurnStatus.FAILED,
                                 error=f"the session is parked on {where}, not on input "
                                       f"{input_id!r} of turn {turn_id!r}")

            async def refuse(tx: Transaction) -> list[TurnEvent]:
                tx.set_turn(refused)
                return []

            await self._commit(refuse)
            return refused
        done = TurnResult(entry.turn_id, TurnStatus.COMPLETED)
        memo = Answer(d.get("value"), d.get("by"))

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.add_step(InputStepId(turn_id, input_id), turn_id, memo)
            tx.set_turn(done)
            tx.set_turn(TurnResult(turn_id, TurnStatus.RUNNING))
            tx.set_status("running")
            return []

        await self._commit(fill)
        return done

    async def reopen(self, entry: TurnRecord, target: TurnRecord | None) -> TurnResult:
        """Re-open a failed turn now that the retry's place in the chain has come (F2).

        The turn goes on from where its transcript stands: finished steps stay, a failed
        model call is asked again. Only the session's latest turn can be re-opened (a later
        turn has built on its failure).
        """
        turn_id = str((entry.args or {}).get("turn_id"))
        latest = next((m.turn_id for m in reversed(self.transcript) if m.is_opening), None)
        problem = None
        if target is None or target.kind != "turn":
            problem = f"the session has no turn {turn_id!r}"
        elif target.status != TurnStatus.FAILED:
            problem = f"turn {turn_id!r} is {target.status}, not failed"
        elif latest != turn_id:
            problem = (f"turn {turn_id!r} is not the session's latest turn ({latest!r} ran "
                       "after it); start a new turn instead")
        result = TurnResult(entry.turn_id, TurnStatus.FAILED if problem else
                            TurnStatus.COMPLETED, error=problem)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.set_turn(result)
            if problem is None:
                tx.set_turn(TurnResult(turn_id, TurnStatus.RUNNING))
                tx.set_status("running")
            return []

        await self._commit(fill)
        return result

    async def _finish(self, out: TurnResult) -> TurnResult:
        """Record a turn's end that no step committed (failure, cancellation, replay)."""
        turn_id = out.turn_id
        n, owed = owed_calls(self.transcript)
        owed = owed if n >= 0 and self.transcript[n].turn_id == turn_id else []
        # Calls of a parallel batch that committed their step keep their result.
        committed = await self._batch_outcomes(n, owed) if self.agent.parallel_tools else {}

        async def fill(tx: Transaction) -> list[TurnEvent]:
            events: list[TurnEvent] = []
            # Calls the turn still owes get a synthetic answer in the transaction that ends
            # it, so the transcript stays a valid conversation for every provider.
            for c in owed:
                if c.id in committed:
                    done = committed[c.id]
                    self._add(tx, Message("tool", call_id=c.id, result=done.result,
                                          is_error=done.error is not None, turn_id=turn_id))
                    continue
                error = None
                if out.status == TurnStatus.CANCELLED:
                    result: Any = {"cancelled": True}
                else:
                    error = f"turn failed: {out.error}"[:ERROR_LIMIT]
                    result = {"error": error}
                idx = self._add(tx, Message("tool", call_id=c.id, result=result,
                                            is_error=error is not None, turn_id=turn_id))
                tx.add_step(ToolStepId(n, c.id), turn_id, ToolMemo(idx))
                events.append(tx.add_event(ActionCompleted(
                    **self._ids(turn_id), call=c, result=result, error=error)))
            return events + self._end(tx, out)

        await self._commit(fill)
        return out


class _NoHandle:
    """The store handle a remote tool sees: there is no transaction to join."""

    def unwrap(self) -> Any:
        raise FatalToolError(
            "ctx.store.unwrap() is only available to local tools (a plain def): an async "
            "tool runs outside the step's transaction"
        )


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
    return _encode_result(out, limit)
