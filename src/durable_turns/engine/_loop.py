"""The turn's steps: read the position off the transcript, run the next step, commit it.

A turn is stepped under the session's lease, one step per :meth:`TurnEngine.step`. Its
position is read off the message log, which is authoritative: every step commits its memo
row and its message in one transaction, so a step with a stored result is always visible in
the transcript, and the next step simply is the first one the transcript does not show yet.

- no assistant message after the opening (or the last calls all answered) → model step
  ``model:<n>``, ``n`` = the index the reply will get;
- the last assistant message has calls with no tool message → tool steps ``tool:<n>:<id>``
  (``_tool_steps.py``: one at a time, or a parallel batch), ``n`` = that assistant message's index;
- the last assistant message has no calls → the turn is complete (committed with it).

How a step commits is ``_commits.py``; what the chain's commands do, ``commands/``. The
engine imports seams only (stores, models, events): never an adapter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._tracing import TurnTrace, begin_turn
from ..agent import SurfacePolicy
from ..errors import (
    RUNTIME_FAILURES,
    Cancelled,
    ConfigurationError,
    FatalToolError,
    ModelError,
    ToolCrashedError,
)
from ..events import (
    ActionCompleted,
    ActionRequested,
    InputRequested,
    MessageCompleted,
    MessageDelta,
    MessageRetry,
    MessageThinking,
    TurnCancelled,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
    TurnSleeping,
    TurnStarted,
)
from ..inbound import InboundEvent
from ..messages import Message, owed_calls
from ..model import ABNORMAL_STOPS, ModelRequest
from ..records import (
    OUTPUT,
    CallOutcome,
    ChainEntry,
    ModelMemo,
    ModelStepId,
    ToolMemo,
    ToolStepId,
    TurnResult,
    TurnStatus,
)
from ..stores import Lease, Transaction
from ..tools import Tool
from ._commits import TRACE, StepCommits
from ._compaction import Compactor
from ._limits import over_limit
from ._model_step import Reply, RetryPolicy, ask
from ._output import settle, system_with
from ._step_context import StepContext
from ._tool_message import tool_message
from ._tool_steps import ERROR_LIMIT, CancelReason, ToolCalls

log = logging.getLogger("durable_turns")
_ABANDONED: tuple[type[BaseException], ...] = (*RUNTIME_FAILURES, ToolCrashedError)
"""What abandons a step without ending its turn: it is driven again."""
T = TypeVar("T")


class TurnEngine:
    """Steps the turns of one session while one lease of it is held.

    Args:
        ctx: the runtime's collaborators (the store, the agents and their models, the host,
            the publish callbacks).
        lease: the session's lease: every commit is fenced by it.
        transcript: the live message log (kept current across the lease's steps).
        cancel_reason: the reason a turn was asked to cancel, if it was (the driver's).

    Raises:
        ConfigurationError: the session's agent has no model, nor has the runtime.
    """

    def __init__(self, ctx: StepContext, lease: Lease, transcript: list[Message],
                 cancel_reason: CancelReason) -> None:
        key = lease.key
        self.agent = agent = ctx.agents[key.agent]
        self.model = ctx.model_for(agent)
        self.lease = lease
        self.commits = StepCommits(lease, transcript, ctx.publish)
        self.transcript = transcript
        """The live message log: one list for the lease's steps (a reset clears it in place)."""
        self._publish_live = ctx.publish_live
        self._wants_live = ctx.wants_live
        self._retry = RetryPolicy(agent.model_retries, agent.model_retry_delay)
        self.compactor = None if agent.context is None else Compactor(
            agent.context, self.model, ctx.store, self.commits, self._retry)
        self.calls = ToolCalls(ctx, agent, self.commits, cancel_reason,
                               self._interruptible)
        self._cancel_reason = self.calls.reason
        self.turn_id: str | None = None
        """The turn being stepped, from its first step here until its end (or park)."""
        self._turn: tuple[SurfacePolicy | None, InboundEvent | None, dict[str, Tool]] | None = None
        self._trace: TurnTrace | None = None
        self._streaming: asyncio.Task[Any] | None = None
        self._interrupted = False
        self.before_model: Callable[[ChainEntry], Awaitable[None]] | None = None
        """Called at each model-call boundary of a turn, before its model step (the
        driver's: joining commands join there, F25)."""

    @property
    def attempt(self) -> int | None:
        """The one attempt this drive runs of its step (``Runtime.step(attempt=)``: its
        scheduler retries the step, as Temporal does), or ``None``: a model call and a
        remote call run all their attempts within the step."""
        return self.calls.attempt

    @attempt.setter
    def attempt(self, attempt: int | None) -> None:
        self.calls.attempt = attempt

    def interrupt(self, turn_id: str) -> None:
        """Stop the model's stream (and a batch's interruptible calls) if ``turn_id`` runs:
        a cancel was requested.

        Closing the stream closes the adapter's HTTP stream instead of reading it to the end.
        """
        if self.turn_id != turn_id:
            return
        self.calls.interrupt()
        if self._streaming is not None and not self._interrupted:
            self._interrupted = True
            self._streaming.cancel()

    async def _interruptible(self, stream: Awaitable[T], turn_id: str) -> T:
        """Await the model's reply (or an interruptible call) in the driving task, so that
        :meth:`interrupt` can stop it.

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

    # -- the steps -------------------------------------------------------------------------

    async def step(self, turn: ChainEntry) -> TurnResult | None:
        """Run ``turn``'s next step (its opening goes with its first), and commit it.

        Returns:
            The turn's end (or park) once a step ended it, else ``None``: the transcript
            says what its next step is.
        """
        if self.turn_id != turn.turn_id:
            self.pause()  # (a turn left mid-way by a command that ran first: a new stretch)
            self._trace = begin_turn(self.lease.key, turn, self.transcript, self.model)
        trace = self.commits.trace = self._trace
        try:
            out = await self._step(turn)
        except BaseException as e:
            if trace is not None:
                trace.abandon(e)
            self._trace = self.commits.trace = None
            raise
        if out is not None:
            if trace is not None:
                trace.end(out)
            self._trace = self.commits.trace = None
        return out

    def pause(self) -> None:
        """The lease's steps stop with a turn under way (its scheduler steps it on later):
        its trace's stretch ends here."""
        if self._trace is not None:
            self._trace.pause()
        self._trace = self.commits.trace = None
        self.turn_id = self.commits.turn_id = None

    async def _step(self, turn: ChainEntry) -> TurnResult | None:
        turn_id = turn.turn_id
        fresh = self.turn_id != turn_id or self._turn is None
        if fresh:
            policy = SurfacePolicy.from_dict(turn.policy) if turn.policy else None
            event = InboundEvent.from_dict(turn.event) if turn.event else None
            self._turn = (policy, event, self._tools(policy))
            self.turn_id = self.commits.turn_id = turn_id
        assert self._turn is not None
        policy, event, tools = self._turn
        going_on = False
        try:
            if fresh and not self._has_opening(turn_id):
                self._check_cancel(turn_id)
                await self._open(turn)
            transcript = self.transcript
            self._check_cancel(turn_id)
            n, owed = owed_calls(transcript)
            last = transcript[n] if n >= 0 else None
            if owed:
                if self.agent.parallel_tools and len(owed) > 1:
                    request = await self.calls.batch(turn_id, n, owed, tools, event)
                    self._check_cancel(turn_id)
                else:
                    request = await self.calls.one(turn_id, n, owed[0], tools, event)
                if request is not None:
                    return await self._finish(TurnResult(turn_id, TurnStatus.SUSPENDED,
                                                         request=request), owed=False)
                await self.calls.cancelled(turn_id)  # after a local tool's step: the store too
                going_on = True
                return None
            if last and last.role == "assistant" and not last.tool_calls \
                    and last.turn_id == turn_id:
                # The reply that ended the turn committed (with the turn's end, normally);
                # one its output schema refused is handed back as a step of its own (F25).
                end = settle(turn, transcript, last.text)
                if isinstance(end, TurnResult):
                    return await self._finish(end)
                back: Message = end
                await self.commits.commit(lambda tx: self._hand_back(tx, back))
                going_on = True
                return None
            if self.before_model is not None:
                await self.before_model(turn)
            stop = await over_limit(self.agent, self.model, turn, self.transcript, event,
                                    self.calls.read_step)  # its limits (F25)
            if stop is not None:
                return await self._finish(stop, owed=False)
            done = await self._model_step(turn, policy, tools)
            going_on = done is None
            return done
        except Cancelled as c:
            return await self._finish(TurnResult(turn_id, TurnStatus.CANCELLED,
                                                 reason=c.reason))
        except _ABANDONED:
            raise  # nothing of the step was written: the turn stays for another drive
        except (ModelError, FatalToolError, ConfigurationError) as e:
            return await self._finish(TurnResult(turn_id, TurnStatus.FAILED, error=str(e)))
        except Exception as e:
            log.exception("turn %s of %s failed inside the engine", turn_id, self.lease.key)
            error = f"internal error: {type(e).__name__}: {e}"
            return await self._finish(TurnResult(turn_id, TurnStatus.FAILED, error=error))
        finally:
            if not going_on:
                self.turn_id = self.commits.turn_id = None
                self._turn = None
                self.calls.found.pop(turn_id, None)

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

    async def _open(self, turn: ChainEntry) -> None:
        opening = turn.opening
        assert opening is not None, "a turn always has an opening message"
        cp = self.commits

        async def fill(tx: Transaction) -> list[TurnEvent]:
            cp.add(tx, opening)
            tx.set_turn(TurnResult(turn.turn_id, TurnStatus.RUNNING))
            tx.set_status("running")
            return [tx.add_event(TurnStarted(**cp.ids(turn.turn_id), text=opening.text))]

        await cp.commit(fill)

    # -- the model step --------------------------------------------------------------------

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

    async def _hand_back(self, tx: Transaction, message: Message) -> list[TurnEvent]:
        self.commits.add(tx, message)
        return []

    async def _model_step(self, turn: ChainEntry, policy: SurfacePolicy | None,
                          tools: dict[str, Tool]) -> TurnResult | None:
        cp = self.commits
        n = len(self.transcript)
        turn_id = turn.turn_id
        system = system_with(self._system(policy), turn)
        specs = [t.spec for t in tools.values()]
        ids = cp.ids(turn_id)
        span = cp.trace.model_step(str(ModelStepId(n))) if cp.trace is not None else None

        key = self.lease.key

        def on_text(text: str) -> None:
            if self._wants_live(key):
                self._publish_live(MessageDelta(**ids, seq=self.lease.last_seq, text=text))

        def on_thinking(text: str) -> None:
            if self._wants_live(key):
                self._publish_live(MessageThinking(**ids, seq=self.lease.last_seq, text=text))

        def on_retry(attempt: int, delay: float, error: ModelError) -> None:
            if span is not None:
                span.retry(attempt, delay, str(error))
            log.warning("turn %s of %s: model call failed (%s); attempt %d of %d in %.2fs",
                        turn_id, self.lease.key, error, attempt + 1, self._retry.retries + 1,
                        delay)
            self._publish_live(MessageRetry(**ids, seq=self.lease.last_seq, attempt=attempt,
                                            retries=self._retry.retries, delay=delay,
                                            error=str(error)))

        def call(messages: list[Message]) -> Awaitable[Reply]:
            request = ModelRequest(system, messages, specs, turn_id)
            return self._interruptible(
                ask(self.model, request, self._retry, on_text=on_text, on_retry=on_retry,
                    on_thinking=on_thinking, attempt=self.attempt), turn_id)

        got = await (call(self.transcript) if self.compactor is None else  # F23
                     self.compactor.within(call, turn_id, n, system, specs))
        text, calls, stop = got.text, got.calls, got.stop
        if stop.reason in ABNORMAL_STOPS and not text and not calls:
            raise ModelError(
                f"model {type(self.model).__name__} stopped ({stop.reason}) with an empty "
                "reply", provider=type(self.model).__name__,
            )
        reply = Message("assistant", text, tuple(calls), turn_id=turn_id,
                        content=stop.content, usage=dict(stop.usage))
        end = None if calls else settle(turn, self.transcript, text)  # (F25)
        done = end if isinstance(end, TurnResult) else None

        async def fill(tx: Transaction) -> list[TurnEvent]:
            cp.add(tx, reply)
            tx.add_step(ModelStepId(n), turn_id, ModelMemo(n, stop.reason))
            out = [tx.add_event(MessageCompleted(**ids, text=text, tool_calls=tuple(calls),
                                                 stop_reason=stop.reason, usage=reply.usage))]
            out += [tx.add_event(ActionRequested(**ids, call=c)) for c in calls]
            if done is not None:
                out += self._end(tx, done)
            return out

        await cp.commit(fill)
        self.calls.asked_at = n
        if span is not None:
            span.model_done(reply.usage or {}, stop.reason)
        return done

    # -- the end ---------------------------------------------------------------------------

    def _end(self, tx: Transaction, out: TurnResult) -> list[TurnEvent]:
        """Buffer a turn's end (or park) in ``tx``: its outcome, the session's status, its
        terminal event."""
        cp = self.commits
        ids = cp.ids(out.turn_id)
        tx.set_turn(out)
        if out.output is not None:  # (read back by ``result()``: never asked again)
            tx.set_turn_data(out.turn_id, OUTPUT, out.output)
        if cp.trace is not None:  # how the stretch ended: the next one links to it
            tx.set_turn_data(out.turn_id, TRACE, cp.trace.record(out.status))
        tx.set_status("suspended" if out.status == TurnStatus.SUSPENDED else "idle")
        if out.status == TurnStatus.COMPLETED:
            return [tx.add_event(TurnCompleted(**ids, text=out.text or ""))]
        if out.status == TurnStatus.FAILED:
            return [tx.add_event(TurnFailed(**ids, error=out.error or ""))]
        if out.status == TurnStatus.CANCELLED:
            return [tx.add_event(TurnCancelled(**ids, reason=out.reason or ""))]
        assert out.request is not None
        if all(r.sleep for r in out.request.all):  # only the clock wakes it (F24)
            until = min(r.expires or "" for r in out.request.all)
            return [tx.add_event(TurnSleeping(**ids, until=until, request=out.request))]
        return [tx.add_event(InputRequested(**ids, request=out.request))]

    async def _finish(self, out: TurnResult, *, owed: bool = True) -> TurnResult:
        """Commit a turn's end (or park) that no step committed: a failure, a cancellation,
        a park, a replay of an end. Unless it parks, calls the turn still owes get an answer
        in the same transaction, so the transcript stays a valid conversation for every
        provider: a parallel batch's committed outcome, else ``{"cancelled": true}`` or the
        failure."""
        turn_id = out.turn_id
        n, calls = owed_calls(self.transcript)
        calls = calls if owed and n >= 0 and self.transcript[n].turn_id == turn_id else []
        committed = await self.calls.committed(n, calls) if self.agent.parallel_tools else {}
        cp = self.commits

        async def fill(tx: Transaction) -> list[TurnEvent]:
            events: list[TurnEvent] = []
            for c in calls:
                done = committed.get(c.id)
                if done is not None:
                    cp.add(tx, tool_message(c, done, turn_id))
                    continue
                if out.status == TurnStatus.CANCELLED:
                    done = CallOutcome({"cancelled": True})
                else:
                    error = f"turn failed: {out.error}"[:ERROR_LIMIT]
                    done = CallOutcome({"error": error}, error)
                idx = cp.add(tx, tool_message(c, done, turn_id))
                tx.add_step(ToolStepId(n, c.id), turn_id, ToolMemo(idx))
                events.append(tx.add_event(ActionCompleted(
                    **cp.ids(turn_id), call=c, result=done.result, error=done.error)))
            return events + self._end(tx, out)

        await cp.commit(fill)
        return out


__all__ = ["TurnEngine"]
