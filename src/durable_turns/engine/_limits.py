"""A turn's limits at its model-call boundary (F25): go on, fail, or park on ``limit:<n>``.

Read off what the turn stored — its spend from the transcript, the answers to its earlier
asks from its ``input:<turn>:limit:<n>`` steps — so a replay decides as the first run did.
What the limits are and how the spend is counted is ``durable_turns.limits``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .._hitl import default_answerers
from ..agent import Agent
from ..errors import ConfigurationError, LimitExceeded
from ..inbound import InboundEvent
from ..limits import LIMITS, Limits, Price, spend_of
from ..messages import Message
from ..model import Model
from ..records import (
    Answer,
    ChainEntry,
    InputRequest,
    InputStepId,
    StepId,
    StepResult,
    TurnResult,
    TurnStatus,
)

__all__ = ["over_limit", "turn_limits"]

ReadStep = Callable[[StepId], Awaitable[StepResult | None]]


def turn_limits(agent: Agent, turn: ChainEntry) -> Limits | None:
    """The turn's own limits (``start(limits=…)``), else its agent's."""
    own = (turn.data or {}).get(LIMITS)
    return Limits.from_dict(own) if isinstance(own, dict) else agent.limits


def _price(agent: Agent, model: Model) -> Price:
    name = getattr(model, "model", None)
    price = agent.prices.get(name) if isinstance(name, str) else None
    if price is None:
        raise ConfigurationError(
            f"agent {agent.name!r} has a cost_usd limit but no price for its model {name!r}: "
            "Agent(prices={model: Price(input_per_mtok, output_per_mtok)})")
    return price


async def over_limit(agent: Agent, model: Model, turn: ChainEntry, transcript: list[Message],
                     event: InboundEvent | None, read_step: ReadStep) -> TurnResult | None:
    """What the turn's limits say before its next model call: ``None`` (go on), its failure
    (a limit reached under ``fail``, or an ask answered no), or its park on ``limit:<n>``.

    Raises:
        ConfigurationError: a ``cost_usd`` limit with no price for the agent's model.
    """
    limits = turn_limits(agent, turn)
    if limits is None:
        return None
    price = _price(agent, model) if limits.cost_usd is not None else None
    spend = spend_of(transcript, turn.turn_id, price)
    grants = 0
    while (hit := limits.reached(spend, grants)) is not None:
        name, allowed = hit
        failed = TurnResult(turn.turn_id, TurnStatus.FAILED,
                            error=str(LimitExceeded(name, allowed, spend.describe())))
        if limits.on_exceed == "fail":
            return failed
        input_id = f"limit:{grants + 1}"
        answer = await read_step(InputStepId(turn.turn_id, input_id))
        if not isinstance(answer, Answer):
            prompt = (f"The turn reached its {name} limit ({allowed:g}); it spent "
                      f"{spend.describe()}. Allow it as much again?")
            return TurnResult(turn.turn_id, TurnStatus.SUSPENDED, request=InputRequest(
                input_id, prompt, {"type": "boolean"},
                default_answerers(None, event, input_id), turn.turn_id))
        if answer.value is not True:
            return failed
        grants += 1
    return None
