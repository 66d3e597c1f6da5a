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
import hashlib
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import jsonschema

from .agent import Agent, SurfacePolicy
from .errors import Cancelled, ConfigurationError, FatalToolError, ModelError, Parked
from .events import (
    ActionCompleted,
    ActionRequested,
    EventIds,
    InputRequested,
    MessageCompleted,
    MessageDelta,
    TurnCancelled,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
    TurnStarted,
)
from .hitl import InputRequest, default_answerers, input_step_id
from .inbound import InboundEvent
from .messages import Message, ToolCall, encode_json, owed_calls
from .models import ABNORMAL_STOPS, Model, ModelRequest, Stop, TextDelta
from .stores import Lease, Transaction, TurnRecord, TurnUpdate
from .tools import Tool, ToolContext, compile_schema

log = logging.getLogger("durable_turns")
T = TypeVar("T")

CANCEL_POLL = 0.25
"""Seconds between looks at the store for a cancel while a model streams."""

ERROR_LIMIT = 2000
"""A tool error's text is cut to this many characters before the model reads it."""

Publish = Callable[[list[TurnEvent]], None]


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    status: str
    text: str | None = None
    error: str | None = None
    reason: str | None = None
    request: dict[str, Any] | None = None


def error_text(e: BaseException) -> str:
    """What the model reads for a tool's exception: ``Class: message``, no traceback."""
    msg = str(e)
    name = type(e).__name__
    text = msg if type(e) is Exception else (f"{name}: {msg}" if msg else name)
    return text[:ERROR_LIMIT]


def idempotency_key(lease: Lease, turn_id: str, step_id: str) -> str:
    raw = f"{lease.key}#g{lease.generation}/{turn_id}/{step_id}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class ToolResultError(Exception):
    pass


def _encode_result(value: Any) -> Any:
    try:
        encode_json(value)
    except (TypeError, ValueError) as e:
        raise ToolResultError(
            f"the tool returned a {type(value).__name__}, which is not JSON-serialisable ({e}); "
            "return dicts, lists, strings, numbers, booleans or None"
        ) from None
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
        read_step: Callable[[str], Awaitable[str | None]],
    ) -> None:
        self.agent = agent
        self.model = model
        self.lease = lease
        self.transcript = transcript
        self._publish = publish
        self._read_step = read_step
        self.turn_id: str | None = None
        self._streaming: asyncio.Task[Any] | None = None
        self._interrupted = False

    def interrupt(self, turn_id: str) -> None:
        """Stop the model's stream if ``turn_id`` is streaming: a cancel was requested.

        Closing the stream closes the adapter's HTTP stream instead of reading it to the end.
        """
        if self.turn_id == turn_id and self._streaming is not None and not self._interrupted:
            self._interrupted = True
            self._streaming.cancel()

    async def _interruptible(self, stream: Awaitable[T], turn_id: str) -> T:
        """Await the model's reply in the driving task, so that :meth:`interrupt` can stop it.

        No task per step: ``interrupt()`` cancels the driving task itself, and the
        cancellation is taken back (``uncancel``) and turned into :class:`Cancelled`. While
        the reply streams, a timer looks for a cancel made by another process.
        """
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        self._streaming, self._interrupted = task, False
        timer: asyncio.TimerHandle | None = None

        def poll() -> None:
            nonlocal timer
            checker = loop.create_task(self._remote_cancel(turn_id))
            checker.add_done_callback(lambda t: t.cancelled() or t.exception())
            timer = loop.call_later(CANCEL_POLL, poll)

        timer = loop.call_later(CANCEL_POLL, poll)
        try:
            return await stream
        except asyncio.CancelledError:
            if self._interrupted and task.uncancel() == 0:
                raise Cancelled(await self.lease.cancel_requested(turn_id) or "cancelled") \
                    from None
            raise
        finally:
            assert timer is not None
            timer.cancel()
            self._streaming = None

    async def _remote_cancel(self, turn_id: str) -> None:
        if self._streaming is not None and await self.lease.cancel_requested(turn_id):
            self.interrupt(turn_id)

    # -- the loop --------------------------------------------------------------------------

    async def run(self, turn: TurnRecord) -> TurnOutcome:
        """Drive ``turn`` from wherever the transcript shows it to its end (or its park)."""
        policy = SurfacePolicy.from_dict(turn.policy) if turn.policy else None
        event = InboundEvent.from_dict(turn.event) if turn.event else None
        self.turn_id = turn.turn_id
        try:
            if not self._has_opening(turn.turn_id):
                await self._check_cancel(turn.turn_id)
                await self._open(turn)
            while True:
                await self._check_cancel(turn.turn_id)
                n, owed = owed_calls(self.transcript)
                last = self.transcript[n] if n >= 0 else None
                if owed:
                    parked = await self._tool_step(turn, n, owed[0], policy, event)
                    if parked is not None:
                        return parked
                elif last and last.role == "assistant" and not last.tool_calls \
                        and last.turn_id == turn.turn_id:
                    # The reply that ended the turn committed (with the turn's end, normally).
                    return await self._finish(turn.turn_id, TurnOutcome("completed", last.text))
                else:
                    done = await self._model_step(turn, policy)
                    if done is not None:
                        return done
        except Cancelled as c:
            return await self._finish(turn.turn_id, TurnOutcome("cancelled", reason=c.reason))
        except (ModelError, FatalToolError, ConfigurationError) as e:
            return await self._finish(turn.turn_id, TurnOutcome("failed", error=str(e)))
        except Exception as e:
            log.exception("turn %s of %s failed inside the engine", turn.turn_id, self.lease.key)
            error = f"internal error: {type(e).__name__}: {e}"
            return await self._finish(turn.turn_id, TurnOutcome("failed", error=error))
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

    async def _check_cancel(self, turn_id: str) -> None:
        reason = await self.lease.cancel_requested(turn_id)
        if reason is not None:
            raise Cancelled(reason)

    async def _commit(self, fill: Callable[[Transaction], Awaitable[list[TurnEvent]]]) -> None:
        """One transaction: ``fill(tx)`` buffers messages/steps/events; publish after commit."""
        async with self.lease.transaction() as tx:
            events = await fill(tx)
        self.transcript.extend(tx.writes.messages)
        self._publish(events)

    async def _open(self, turn: TurnRecord) -> None:
        opening = turn.opening

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.add_message(opening)
            tx.set_turn(turn.turn_id, TurnUpdate("running"))
            tx.set_status("running")
            return [tx.add_event(TurnStarted(**self._ids(turn.turn_id), text=opening.text))]

        await self._commit(fill)

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
                          ) -> TurnOutcome | None:
        turn_id = turn.turn_id
        n = len(self.transcript)
        request = ModelRequest(
            system=self._system(policy),
            messages=self.transcript,
            tools=[t.spec for t in self._tools(policy).values()],
            turn_id=turn_id,
        )
        text, calls, stop = await self._interruptible(self._stream(request), turn_id)
        if stop is None:
            raise ModelError("the model's stream ended without a stop", provider="engine")
        if stop.reason in ABNORMAL_STOPS and not text and not calls:
            raise ModelError(
                f"the model stopped ({stop.reason}) with an empty reply", provider="engine"
            )
        reply = Message("assistant", text, tuple(calls), turn_id=turn_id,
                        content=stop.content, usage=dict(stop.usage))
        memo = encode_json({"m": n, "stop": stop.reason})
        ids = self._ids(turn_id)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.add_message(reply)
            tx.add_step(f"model:{n}", turn_id, memo)
            out = [tx.add_event(MessageCompleted(**ids, text=text, tool_calls=tuple(calls),
                                                 stop_reason=stop.reason, usage=reply.usage))]
            out += [tx.add_event(ActionRequested(**ids, call=c)) for c in calls]
            if not calls:
                out += self._end(tx, turn_id, TurnOutcome("completed", text))
            return out

        await self._commit(fill)
        return None if calls else TurnOutcome("completed", text)

    async def _stream(self, request: ModelRequest) -> tuple[str, list[ToolCall], Stop | None]:
        turn_id = request.turn_id
        ids = self._ids(turn_id)
        parts: list[str] = []
        calls: list[ToolCall] = []
        stop: Stop | None = None
        async with aclosing(self.model.stream(request)) as stream:  # type: ignore[type-var]
            async for ev in stream:
                if isinstance(ev, TextDelta):
                    parts.append(ev.text)
                    self._publish([MessageDelta(**ids, seq=self.lease.last_seq, text=ev.text)])
                elif isinstance(ev, ToolCall):
                    calls.append(ev)
                elif isinstance(ev, Stop):
                    stop = ev
        return "".join(parts), calls, stop

    # -- tool step -------------------------------------------------------------------------

    async def _tool_step(self, turn: TurnRecord, n: int, call: ToolCall,
                         policy: SurfacePolicy | None, event: InboundEvent | None
                         ) -> TurnOutcome | None:
        """Run one owed call and commit its result; returns an outcome only if it parked."""
        turn_id = turn.turn_id
        step_id = f"tool:{n}:{call.id}"
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
        ctx = ToolContext(
            agent=self.lease.key.agent, session=self.lease.key.session, turn_id=turn_id,
            call_id=call.id, step_id=step_id,
            idempotency_key=idempotency_key(self.lease, turn_id, step_id),
            store=_NoHandle(), event=event, user=event.user if event else None,
        )
        if problem is not None or tool is None:
            await self._record(turn_id, n, call, step_id, {"error": problem}, problem)
        elif tool.remote:
            ctx.park = self._parker(turn_id, call.id, event)
            try:
                result = _encode_result(await tool.run(args, ctx))
                error = None
            except Parked as p:
                assert isinstance(p.request, InputRequest)
                out = TurnOutcome("suspended", request=p.request.to_dict())

                async def park(tx: Transaction) -> list[TurnEvent]:
                    return self._end(tx, turn_id, out)

                await self._commit(park)
                return out
            except (FatalToolError, ConfigurationError):
                raise
            except Exception as e:
                error = error_text(e)
                result = {"error": error}
            await self._record(turn_id, n, call, step_id, result, error)
        else:
            await self._record(turn_id, n, call, step_id, None, None, local=(tool, args, ctx))
        return None

    def _parker(self, turn_id: str, call_id: str, event: InboundEvent | None
                ) -> Callable[..., Awaitable[Any]]:
        async def park(input_id: str, prompt: str, schema: Any, answerers: Any) -> Any:
            stored = await self._read_step(input_step_id(turn_id, input_id))
            if stored is not None:
                return json.loads(stored)["value"]
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

    async def _record(self, turn_id: str, n: int, call: ToolCall, step_id: str, result: Any,
                      error: str | None, local: tuple[Tool, dict[str, Any], ToolContext] | None
                      = None) -> None:
        ids = self._ids(turn_id)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            nonlocal result, error
            if local is not None:
                tool, args, ctx = local
                ctx.store = tx
                try:
                    result = await tx.run_local(lambda _h: _run_local(tool, args, ctx))
                except (FatalToolError, ConfigurationError):
                    raise
                except Exception as e:
                    error = error_text(e)
                    result = {"error": error}
            msg = Message("tool", call_id=call.id, result=result, is_error=error is not None,
                          turn_id=turn_id)
            idx = tx.add_message(msg)
            tx.add_step(step_id, turn_id, f'{{"m":{idx}}}')
            return [tx.add_event(ActionCompleted(**ids, call=call, result=result, error=error))]

        await self._commit(fill)

    # -- the end ---------------------------------------------------------------------------

    def _end(self, tx: Transaction, turn_id: str, out: TurnOutcome) -> list[TurnEvent]:
        ids = self._ids(turn_id)
        tx.set_turn(turn_id, TurnUpdate(out.status, text=out.text, error=out.error,  # type: ignore[arg-type]
                                        reason=out.reason, request=out.request))
        tx.set_status("suspended" if out.status == "suspended" else "idle")
        if out.status == "completed":
            return [tx.add_event(TurnCompleted(**ids, text=out.text or ""))]
        if out.status == "failed":
            return [tx.add_event(TurnFailed(**ids, error=out.error or ""))]
        if out.status == "cancelled":
            return [tx.add_event(TurnCancelled(**ids, reason=out.reason or ""))]
        assert out.request is not None
        return [tx.add_event(InputRequested(**ids, request=InputRequest.from_dict(out.request)))]

    async def reset(self, entry: TurnRecord, parked: list[str]) -> TurnOutcome:
        """Archive the live generation now that the reset's place in the chain has come (F8).

        Args:
            entry: the reset's chain entry.
            parked: suspended turns the reset cancels (a stale park is archived too).
        """
        key, gen = self.lease.key, self.lease.generation
        done = TurnOutcome("completed", text=json.dumps(
            {"previous_session": f"{key.session}#g{gen}", "generation": gen + 1}))

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.set_turn(entry.turn_id, TurnUpdate("completed", text=done.text))
            tx.new_generation()
            return [tx.add_event(TurnCancelled(**self._ids(t), reason="reset")) for t in parked]

        await self._commit(fill)
        self.transcript.clear()
        return done

    async def _finish(self, turn_id: str, out: TurnOutcome) -> TurnOutcome:
        """Record a turn's end that no step committed (failure, cancellation, replay)."""

        async def fill(tx: Transaction) -> list[TurnEvent]:
            events: list[TurnEvent] = []
            if out.status == "cancelled":
                # Unrun calls of the batch get a synthetic result, so the transcript stays a
                # valid conversation for the next model call.
                n, owed = owed_calls(self.transcript)
                for c in owed if n >= 0 and self.transcript[n].turn_id == turn_id else []:
                    result = {"cancelled": True}
                    idx = tx.add_message(Message("tool", call_id=c.id, result=result,
                                                 turn_id=turn_id))
                    tx.add_step(f"tool:{n}:{c.id}", turn_id, f'{{"m":{idx}}}')
                    events.append(tx.add_event(ActionCompleted(
                        **self._ids(turn_id), call=c, result=result, error=None)))
            return events + self._end(tx, turn_id, out)

        await self._commit(fill)
        return out


class _NoHandle:
    """The store handle a remote tool sees: there is no transaction to join."""

    def unwrap(self) -> Any:
        raise FatalToolError(
            "ctx.store.unwrap() is only available to local tools (a plain def): an async "
            "tool runs outside the step's transaction"
        )


def _run_local(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> Any:
    out = tool.run(args, ctx)
    if inspect.isawaitable(out):
        close = getattr(out, "close", None)
        if close is not None:
            close()  # never awaited: don't leave a dangling coroutine behind
        raise ConfigurationError(
            f"tool {tool.name!r} is a plain def that returned an awaitable; declare it "
            "`async def` so the engine awaits it as a remote tool (its result would be lost)"
        )
    return _encode_result(out)
