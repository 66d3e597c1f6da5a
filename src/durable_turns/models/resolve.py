"""Provider strings: ``"anthropic:claude-…"`` or ``"openai:gpt-…"`` → a :class:`Model`;
``"scripted"`` → the offline model (:mod:`durable_turns.models.offline`); ``"test"`` →
:class:`durable_turns.testing.TestModel` (it calls every tool once, then sums up).

The adapter module, and so its SDK, is imported only when a string names it.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ConfigurationError
from ..model import Model
from ._test_model import SPEC as TEST_SPEC
from ._test_model import TestModel
from .offline import SPEC, offline_model

PROVIDERS: dict[str, tuple[str, str, str]] = {
    "anthropic": ("anthropic_messages", "anthropic", "anthropic"),
    "openai": ("openai_compat", "openai_compatible", "openai"),
}
"""prefix → (module under ``durable_turns.models``, factory, install extra)."""


def resolve_model(spec: str | Model, **options: Any) -> Model:
    """The model a provider string names; a :class:`Model` is returned as it is.

    ``"anthropic:claude-sonnet-4-5"`` → ``anthropic(model="claude-sonnet-4-5", **options)``;
    ``"openai:gpt-4o"`` → ``openai_compatible(model="gpt-4o", **options)``;
    ``"scripted"`` → :func:`~durable_turns.models.offline.offline_model` (offline: it calls
    the agent's tools by name, no key needed); ``"test"`` →
    :class:`~durable_turns.testing.TestModel` (it calls each tool once with a generated
    input, then sums up what they returned). Credentials and base URLs come from
    ``options`` or from the SDK's environment variables.

    Raises:
        ConfigurationError: a malformed string, an unknown provider, or the provider's SDK
            is not installed (naming the extra to install).
    """
    if not isinstance(spec, str):
        return spec
    if spec.strip().lower() == SPEC:
        return offline_model()
    if spec.strip().lower() == TEST_SPEC:
        return TestModel()
    prefix, sep, name = spec.partition(":")
    if not sep or not prefix.strip() or not name.strip():
        raise ConfigurationError(
            f"model {spec!r}: expected 'scripted' or 'test' (offline) or "
            "'<provider>:<model>', e.g. 'anthropic:claude-sonnet-4-5' or 'openai:gpt-4o'"
        )
    entry = PROVIDERS.get(prefix.strip().lower())
    if entry is None:
        raise ConfigurationError(
            f"model {spec!r}: unknown provider {prefix!r}; known: {', '.join(PROVIDERS)} "
            "(pass a Model object for anything else)"
        )
    module_name, factory, extra = entry
    try:
        module = importlib.import_module(f"{__package__}.{module_name}")
    except ImportError as e:
        raise ConfigurationError(
            f"model {spec!r} needs the {extra} SDK: pip install 'durable-turns[{extra}]'"
        ) from e
    model: Model = getattr(module, factory)(name.strip(), **options)
    return model


__all__ = ["PROVIDERS", "resolve_model"]
