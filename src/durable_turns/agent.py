"""An agent: a name, a system prompt, tools, and optional model and per-source policies."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .compaction import Compaction
from .errors import ConfigurationError
from .limits import Limits, Price
from .tools import Tool

if TYPE_CHECKING:
    from .model import Model

log = logging.getLogger("durable_turns")

AuthorizeAnswer = Callable[[Mapping[str, Any]], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class SurfacePolicy:
    """How turns from one source differ (F10).

    Attributes:
        mode: ``append`` adds ``instructions.<source>.md`` to the base prompt; ``replace``
            makes it the whole prompt.
        deny_tools: tools that source's turns may not use; enforced in code.
        instructions: the overlay text (the loader reads it from the app folder).
    """

    mode: Literal["append", "replace"] = "append"
    deny_tools: tuple[str, ...] = ()
    instructions: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "deny_tools": list(self.deny_tools),
                "instructions": self.instructions}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SurfacePolicy:
        return cls(data.get("mode", "append"), tuple(data.get("deny_tools", ())),
                   data.get("instructions"))


@dataclass(slots=True)
class Agent:
    """What a runtime drives.

    Args:
        name: how sessions address it.
        instructions: the base system prompt.
        tools: the tools the model may call (names must be unique).
        model: this agent's model; else the runtime's.
        surfaces: per-source policies keyed on an inbound event's ``source``.
        authorize_answer: decides ``{policy, scope}`` answerers at resume time (F6).
        model_retries: how often a transient model failure (connection reset, cut stream,
            408/429/5xx/529) is asked again before the turn fails (F2).
        model_retry_delay: the first backoff in seconds; it doubles per attempt, with jitter
            (a provider's ``retry-after`` wins, up to 60 s).
        max_result_bytes: a tool result whose JSON is larger becomes an error result naming
            its size and this limit (default 1 MiB).
        parallel_tools: run the remote calls of one assistant message at once (F15); each
            commits its own step as it finishes, the transcript keeps call order.
        limits: caps on each turn's spend (``durable_turns.limits``, F25); a turn's own
            (``start(…, limits=…)``) take their place.
        prices: what the models' tokens cost, by model name (the adapter's ``model``), for
            a ``cost_usd`` limit.
        context: how requests stay under the model's context window
            (``durable_turns.compaction.Compaction``, F23); ``None`` sends the whole
            transcript.
    """

    name: str
    instructions: str = ""
    tools: Iterable[Tool] = ()
    model: Model | None = None
    surfaces: Mapping[str, SurfacePolicy] = field(default_factory=dict)
    authorize_answer: AuthorizeAnswer | None = None
    model_retries: int = 3
    model_retry_delay: float = 0.5
    max_result_bytes: int = 1 << 20
    parallel_tools: bool = False
    limits: Limits | None = None
    prices: Mapping[str, Price] = field(default_factory=dict)
    context: Compaction | None = None
    tools_by_name: dict[str, Tool] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ConfigurationError(f"agent name {self.name!r} must be non-empty, without '/'")
        if not isinstance(self.model_retries, int) or self.model_retries < 0:
            raise ConfigurationError(f"agent {self.name!r}: model_retries must be an int >= 0")
        if self.model_retry_delay < 0:
            raise ConfigurationError(f"agent {self.name!r}: model_retry_delay must be >= 0")
        if self.max_result_bytes <= 0:
            raise ConfigurationError(f"agent {self.name!r}: max_result_bytes must be > 0")
        self.tools = tuple(self.tools)
        by_name: dict[str, Tool] = {}
        for t in self.tools:
            if not isinstance(t, Tool):
                raise ConfigurationError(f"agent {self.name!r}: {t!r} is not a Tool")
            if t.name in by_name:
                raise ConfigurationError(f"agent {self.name!r}: two tools named {t.name!r}")
            by_name[t.name] = t
        self.tools_by_name = by_name
        self.surfaces = dict(self.surfaces)
        for source, policy in self.surfaces.items():
            unknown = sorted(set(policy.deny_tools) - set(by_name))
            if unknown and by_name:
                raise ConfigurationError(
                    f"agent {self.name!r}: surfaces[{source!r}] denies unknown tools {unknown}"
                )
            if policy.mode == "replace" and not policy.instructions:
                raise ConfigurationError(
                    f"agent {self.name!r}: surfaces[{source!r}] replaces the prompt but has "
                    "no instructions"
                )


HOST_SOURCES = frozenset({"cli", "http"})
"""The sources the package's own hosts emit: the terminal (``chat``, ``approve``) and the
HTTP host (``serve``). An app run one way is run the other way too, so a policy for one of
them is never reported as unused (:func:`check_surfaces`)."""


def check_surfaces(agent: Agent, sources: Iterable[str]) -> list[str]:
    """Warn about the agent's policies for sources that none of ``sources`` is (F10).

    A host calls it once it knows every source it serves the agent on (the HTTP host:
    ``"http"`` and its channels' names), since such a policy never applies there. A policy
    for one of :data:`HOST_SOURCES` is not warned about: another command of the same app
    emits it.

    Returns:
        The sources with a policy that no host here emits, sorted.
    """
    emitted = set(sources)
    unused = sorted(s for s in agent.surfaces if s not in emitted | HOST_SOURCES)
    for source in unused:
        log.warning(
            "agent %r has a policy for source %r, but no mounted channel emits it "
            "(mounted: %s)", agent.name, source, sorted(emitted) or "none",
        )
    return unused


__all__ = ["HOST_SOURCES", "Agent", "AuthorizeAnswer", "SurfacePolicy", "check_surfaces"]
