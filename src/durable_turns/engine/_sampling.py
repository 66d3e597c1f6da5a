"""A remote tool's own question to the agent's model (F26: an MCP server's sampling request).

:meth:`~durable_turns.context.StepServices.sample` asks the agent's model one reply, outside
the turn's transcript, as a step of its own: ``input:<turn_id>:sample:<sample_id>``, an
:class:`~durable_turns.records.Answer` given ``by="model"`` whose value is the reply
(``{"text", "stop", "model"}``). It commits before the tool sees the reply, so a tool run again
(its call in doubt, or resumed after a park) is answered from the step and the model is not
asked twice. The model is asked as a model step is (the agent's retries on a transient
failure), one sample at a time per drive: a :class:`~durable_turns.Model` is never streamed
concurrently for one session.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Protocol

from ..agent import Agent
from ..context import Sampled
from ..events import TurnEvent
from ..messages import Message
from ..model import Model, ModelRequest
from ..records import Answer, InputStepId, StepId, StepResult
from ..stores import Transaction
from ._commits import StepCommits
from ._model_step import RetryPolicy, ask

_locks: weakref.WeakKeyDictionary[object, asyncio.Lock] = weakref.WeakKeyDictionary()


class Calls(Protocol):
    """What :func:`sample` needs of the drive's tool calls."""

    agent: Agent
    commits: StepCommits
    model: Model

    async def read_step(self, step: StepId) -> StepResult | None: ...


def step_of(turn_id: str, sample_id: str) -> InputStepId:
    """The step a sample of the turn is kept as."""
    return InputStepId(turn_id, f"sample:{sample_id}")


def _read(stored: StepResult | None) -> Sampled | None:
    if not isinstance(stored, Answer) or not isinstance(stored.value, dict):
        return None
    v = stored.value
    return Sampled(str(v.get("text", "")), str(v.get("stop", "")), str(v.get("model", "")))


async def sample(calls: Calls, turn_id: str, sample_id: str, system: str,
                 messages: list[Message]) -> Sampled:
    """The model's reply to ``system`` and ``messages``: the stored one, else asked and
    committed (module docstring).

    Raises:
        ModelError: the model failed (not transient, or too often).
    """
    step = step_of(turn_id, sample_id)
    lock = _locks.setdefault(calls, asyncio.Lock())
    async with lock:
        found = _read(await calls.read_step(step))
        if found is not None:
            return found
        agent = calls.agent
        reply = await ask(calls.model, ModelRequest(system, messages, [], turn_id),
                          RetryPolicy(agent.model_retries, agent.model_retry_delay),
                          on_text=lambda _: None, on_retry=lambda *_: None)
        name = getattr(calls.model, "model", None)
        made = Sampled(reply.text, reply.stop.reason,
                       name if isinstance(name, str) else type(calls.model).__name__)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.add_step(step, turn_id, Answer({"text": made.text, "stop": made.stop,
                                               "model": made.model}, "model"))
            return []

        await calls.commits.beside(fill, shielded=True)
        return made


__all__ = ["Calls", "sample", "step_of"]
