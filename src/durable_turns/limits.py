"""Limits on a turn's spend (F25): model calls, tool calls, tokens and cost.

``Agent(limits=Limits(…), prices={model: Price(…)})`` caps every turn of the agent;
``session.start(…, limits=Limits(…))`` one turn (kept on its chain entry). The spend is
counted from what the turn's steps stored — each model reply and its ``usage``, each tool
result in the transcript — so a replay after a crash counts exactly what the first run did.

The engine checks the limits before each model call of the turn. A limit reached:

- ``on_exceed="fail"``: the turn ends ``failed`` with a :class:`~durable_turns.errors.
  LimitExceeded` message naming the limit (every call of the turn is answered: the
  transcript stays a valid conversation);
- ``on_exceed="ask"``: the turn parks on a yes/no request ``limit:<n>`` (the n-th ask of the
  turn; the limit and the spend in its prompt; answered under the turn's answerer rules, as
  any request). ``True`` grants each limit its amount once more; ``False`` ends the turn as
  ``fail`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from .errors import ConfigurationError
from .messages import Message

__all__ = ["LIMITS", "Limits", "Price", "Spend", "spend_of"]

LIMITS = "limits"
"""The name a turn's own limits are kept under on its chain entry's data."""


@dataclass(frozen=True, slots=True)
class Price:
    """What a model's tokens cost, in US dollars per million."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


@dataclass(frozen=True, slots=True)
class Spend:
    """What a turn has spent so far, as its stored steps say."""

    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def describe(self) -> str:
        cost = f", ${self.cost_usd:.4f}" if self.cost_usd else ""
        return (f"{self.model_calls} model calls, {self.tool_calls} tool calls, "
                f"{self.input_tokens} input and {self.output_tokens} output tokens{cost}")


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps on one turn's spend (``None``: no cap); see the module docstring.

    Raises:
        ConfigurationError: a cap that is not a number > 0, or an unknown ``on_exceed``.
    """

    model_calls: int | None = None
    tool_calls: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    on_exceed: Literal["fail", "ask"] = "fail"

    def __post_init__(self) -> None:
        if self.on_exceed not in ("fail", "ask"):
            raise ConfigurationError(f"Limits(on_exceed=…) is 'fail' or 'ask', not "
                                     f"{self.on_exceed!r}")
        for name, cap in self.caps():
            if isinstance(cap, bool) or not isinstance(cap, int | float) or cap <= 0:
                raise ConfigurationError(f"Limits({name}=…) must be a number > 0, not {cap!r}")

    def caps(self) -> Iterable[tuple[str, float]]:
        """The caps set, by name."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "on_exceed" and value is not None:
                yield f.name, value

    def reached(self, spend: Spend, grants: int = 0) -> tuple[str, float] | None:
        """The first cap ``spend`` has reached, each raised by ``grants`` more of its amount
        (``(name, the cap in force)``), or ``None``."""
        for name, cap in self.caps():
            allowed = cap * (1 + grants)
            if getattr(spend, name) >= allowed:
                return name, allowed
        return None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Limits:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def spend_of(transcript: list[Message], turn_id: str, price: Price | None) -> Spend:
    """What turn ``turn_id`` spent, from its messages in ``transcript`` (a turn's messages
    are at the log's end while it runs; its usage as each reply stored it)."""
    calls = tools = inp = out = 0
    for m in reversed(transcript):
        if m.turn_id != turn_id:
            break
        if m.role == "assistant":
            calls += 1
            inp += int(m.usage.get("input_tokens", 0))
            out += int(m.usage.get("output_tokens", 0))
        elif m.role == "tool":
            tools += 1
    cost = price.cost(inp, out) if price is not None else 0.0
    return Spend(calls, tools, inp, out, cost)
