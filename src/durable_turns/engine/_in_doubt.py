"""A remote call in doubt (F26): its intent, and how a replay settles it.

A remote tool declared ``in_doubt="ask"`` or with a reconcile function (``_in_doubt.py`` at
the package root) runs through :func:`settle`:

1. no intent stored for the call (``intent:<n>:1:<call_id>``): one commits (tool, attempt 1,
   idempotency key, time) in a transaction of its own, then the tool runs;
2. an intent stored and the call still owed (its result never committed: the process died
   between the two, maybe after the remote effect): the call is **in doubt**. An
   ``action.in_doubt`` event commits, then
   - ``"ask"``: the turn parks on a yes/no request (``in_doubt:<call_id>:<attempt>``, schema
     ``{"type": "boolean"}``, the turn's answerers as any park); yes runs the call again, no
     gives it the result :data:`~durable_turns._in_doubt.SKIPPED`;
   - a reconcile function gets the input and ``ctx`` (the same idempotency key):
     ``Reconciled.ran(result)`` gives the call its result (the tool is not run),
     ``Reconciled.not_run()`` runs it.
   A call run again commits a new intent first (the next attempt,
   ``intent:<n>:<attempt>:<call_id>``), in the transaction of the event that says so: if
   that run dies too, its attempt is in doubt (and asks again).

The call's result then commits as every remote call's does (its step, its tool message), so a
parallel batch keeps its commit order. ``"rerun"`` tools never come here: nothing is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .._hitl import default_answerers
from .._in_doubt import SKIPPED, Reconciled
from ..context import ToolContext
from ..errors import ConfigurationError, Parked
from ..events import ActionInDoubt, TurnEvent
from ..messages import ToolCall
from ..records import (
    Answer,
    CallOutcome,
    InputRequest,
    InputStepId,
    Intent,
    IntentStepId,
    StepId,
    StepResult,
)
from ..stores import Transaction
from ..tools import Tool
from ._commits import StepCommits


class Calls(Protocol):
    """What :func:`settle` needs of the drive's tool calls."""

    commits: StepCommits

    async def read_step(self, step: StepId) -> StepResult | None: ...


def input_id(call_id: str, attempt: int) -> str:
    """The id of the yes/no request an ``in_doubt="ask"`` call in doubt parks on."""
    return f"in_doubt:{call_id}:{attempt}"


async def settle(calls: Calls, n: int, tool: Tool, args: dict[str, Any], ctx: ToolContext,
                 call: ToolCall, turn_id: str, run: Callable[[], Awaitable[CallOutcome]]
                 ) -> CallOutcome:
    """The call's outcome: run behind an intent, or settled as in doubt (module docstring).

    Raises:
        Parked: an ``"ask"`` call in doubt waits for a person's answer.
        ConfigurationError: a reconcile function returned something else than
            :class:`~durable_turns.Reconciled`.
    """
    stored = await calls.read_step(IntentStepId(n, 1, call.id))
    if not isinstance(stored, Intent):
        return await _run(calls, n, tool, ctx, call, turn_id, 1, None, run)
    attempt = 1
    while True:  # the latest attempt that began: its intent is stored, the next one's not
        later = await calls.read_step(IntentStepId(n, attempt + 1, call.id))
        if not isinstance(later, Intent):
            break
        attempt += 1
    if tool.in_doubt == "ask":
        answer = await calls.read_step(InputStepId(turn_id, input_id(call.id, attempt)))
        if not isinstance(answer, Answer):
            await _commit(calls, turn_id, None, None, _event(calls, turn_id, call, attempt))
            raise Parked(_request(tool, args, ctx, call, turn_id, attempt))
        again = answer.value is True
        outcome = None if again else CallOutcome(dict(SKIPPED))
        settled = "run" if again else "skipped"
    else:
        assert callable(tool.in_doubt)
        found = await tool.in_doubt(args, ctx)
        if not isinstance(found, Reconciled):
            raise ConfigurationError(
                f"tool {tool.name!r}: its in_doubt function returned a {type(found).__name__}; "
                "return Reconciled.ran(result) or Reconciled.not_run()")
        outcome = CallOutcome(found.result) if found.did_run else None
        settled = "reconciled" if found.did_run else "run"
    event = _event(calls, turn_id, call, attempt, settled)
    if outcome is not None:
        await _commit(calls, turn_id, None, None, event)
        return outcome
    return await _run(calls, n, tool, ctx, call, turn_id, attempt + 1, event, run)


async def _run(calls: Calls, n: int, tool: Tool, ctx: ToolContext, call: ToolCall,
               turn_id: str, attempt: int, event: ActionInDoubt | None,
               run: Callable[[], Awaitable[CallOutcome]]) -> CallOutcome:
    """Commit the attempt's intent (with ``event``), then run it."""
    intent = Intent(tool.name, attempt, ctx.idempotency_key, time.time())
    await _commit(calls, turn_id, IntentStepId(n, attempt, call.id), intent, event)
    return await run()


def _event(calls: Calls, turn_id: str, call: ToolCall, attempt: int,
           settled: str | None = None) -> ActionInDoubt:
    return ActionInDoubt(**calls.commits.ids(turn_id), call=call, attempt=attempt,
                         settled=settled)


async def _commit(calls: Calls, turn_id: str, step: IntentStepId | None, intent: Intent | None,
                  event: ActionInDoubt | None) -> None:
    """One transaction beside the loop: an intent, an event, or both."""
    async def fill(tx: Transaction) -> list[TurnEvent]:
        if step is not None and intent is not None:
            tx.add_step(step, turn_id, intent)
        return [tx.add_event(event)] if event is not None else []

    await calls.commits.beside(fill, shielded=True)


def _request(tool: Tool, args: dict[str, Any], ctx: ToolContext, call: ToolCall,
             turn_id: str, attempt: int) -> InputRequest:
    own = input_id(call.id, attempt)
    shown = json.dumps(args, default=str, sort_keys=True)[:300]
    prompt = (f"{tool.name}({shown}) began before the process stopped and its result was not "
              "recorded: it may or may not have taken effect. Run it again?")
    return InputRequest(own, prompt, {"type": "boolean"},
                        default_answerers(None, ctx.event, own), turn_id, call.id)


__all__ = ["Calls", "input_id", "settle"]
