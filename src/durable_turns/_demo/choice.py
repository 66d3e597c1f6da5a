"""Which model the demo's processes run on, and why — decided once, shown on screen.

- ``--model scripted``: the demo's scripted brain (offline, deterministic);
- ``--model PROVIDER:NAME`` (``anthropic:claude-sonnet-4-5``, ``openai:gpt-4o``): that
  provider, through :func:`~durable_turns.models.resolve.resolve_model`;
- no ``--model``: Anthropic (:data:`DEFAULT_ANTHROPIC`) when ``ANTHROPIC_API_KEY`` is set,
  else the scripted brain.

Every process of one demo (the parent and its children, ``refund`` and ``approve``) makes the
same choice from the same inputs; the parent passes its ``--model`` down explicitly, so a child
never guesses differently. Credentials and base URLs come from the SDK's own environment
variables (``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``, ``OPENAI_API_KEY``, …).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigurationError
from ..model import Model
from ..models.resolve import resolve_model
from .brain import ops_model

SCRIPTED = "scripted"
DEFAULT_ANTHROPIC = "anthropic:claude-sonnet-4-5"
"""The model the demo uses when ``ANTHROPIC_API_KEY`` is set and no ``--model`` is given."""


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """A decided model: what to pass to a child (``spec``) and what to tell the reader."""

    spec: str
    """``scripted`` or ``PROVIDER:NAME``."""
    why: str
    """Why this one, in words for the banner."""

    @property
    def scripted(self) -> bool:
        return self.spec == SCRIPTED

    @property
    def label(self) -> str:
        """One banner line: the model, its nature, and why it was chosen."""
        if self.scripted:
            return f"scripted (offline, deterministic): {self.why}"
        return f"{self.spec} (a real model, over the network): {self.why}"


def choose_model(spec: str | None, environ: Mapping[str, str]) -> ModelChoice:
    """Decide the model from ``--model`` (or its absence) and the environment.

    Raises:
        ConfigurationError: a malformed spec, an unknown provider, a missing SDK extra or
            missing credentials (the message says which and what to do).
    """
    if spec is not None:
        spec = spec.strip()
        if spec.lower() == SCRIPTED:
            choice = ModelChoice(SCRIPTED, "chosen with --model")
        else:
            choice = ModelChoice(spec, "chosen with --model")
    elif environ.get("ANTHROPIC_API_KEY"):
        choice = ModelChoice(DEFAULT_ANTHROPIC,
                             "ANTHROPIC_API_KEY is set (--model scripted runs offline)")
    else:
        choice = ModelChoice(SCRIPTED, "no ANTHROPIC_API_KEY is set (--model PROVIDER:NAME "
                                       "picks a real one)")
    build_model(choice)  # fail here, before any process starts, on a bad spec or no key
    return choice


def build_model(choice: ModelChoice) -> Model:
    """The :class:`Model` a choice names.

    Raises:
        ConfigurationError: as :func:`choose_model`.
    """
    if choice.scripted:
        return ops_model()
    if ":" not in choice.spec:
        raise ConfigurationError(
            f"model {choice.spec!r}: expected 'scripted' or '<provider>:<model>', e.g. "
            f"{DEFAULT_ANTHROPIC!r} or 'openai:gpt-4o'"
        )
    return resolve_model(choice.spec)


OFFLINE = ModelChoice(SCRIPTED, "the default")
"""The scripted model, for options that were not given a choice."""


__all__ = [
    "DEFAULT_ANTHROPIC",
    "OFFLINE",
    "SCRIPTED",
    "ModelChoice",
    "build_model",
    "choose_model",
]
