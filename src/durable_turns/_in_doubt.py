"""What a remote tool does with a call found in doubt on a replay (F26): the declaration.

``Tool(in_doubt=…)`` / ``@tool(in_doubt=…)`` takes:

- ``"rerun"`` (the default): run the call again under the same idempotency key; nothing more
  is written (the remote side must dedupe on ``ctx.idempotency_key``);
- ``"ask"``: an **intent** commits before each run; a call with an intent and no result parks
  its turn asking a person whether to run it again;
- a reconcile function ``async (input, ctx) -> Reconciled``: the intent commits likewise; a
  call in doubt is settled by asking the remote system (by ``ctx.idempotency_key``) whether it
  ran: :meth:`Reconciled.ran` gives the call's result, :meth:`Reconciled.not_run` runs it.

The engine's side is ``engine/_in_doubt.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from .context import ToolContext
from .errors import ConfigurationError

SKIPPED: dict[str, Any] = {"in_doubt": True, "skipped": True}
"""The result a call in doubt gets when a person says not to run it again."""


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What a reconcile function found: whether the call in doubt ran on the remote side.

    Build it with :meth:`ran` or :meth:`not_run`.
    """

    did_run: bool
    result: Any = None
    """The call's result when it ran (what the model reads): JSON values."""

    @classmethod
    def ran(cls, result: Any) -> Reconciled:
        """The call ran; ``result`` is committed as its result and the tool is not called."""
        return cls(True, result)

    @classmethod
    def not_run(cls) -> Reconciled:
        """The call did not run: the tool runs now (a new intent, the same key)."""
        return cls(False)


Reconcile = Callable[[dict[str, Any], ToolContext], Awaitable[Reconciled]]
"""``async def reconcile(input, ctx) -> Reconciled``: ``input`` is the call's checked input,
``ctx`` its :class:`~durable_turns.ToolContext` (the same ``idempotency_key`` as the run's)."""
InDoubt = Literal["rerun", "ask"] | Reconcile
"""What ``Tool(in_doubt=…)`` takes; see the module docstring."""


SETTLED_WORDS: dict[str | None, str] = {
    None: "in doubt: it may have run before the process stopped",
    "run": "in doubt: run again",
    "skipped": "in doubt: not run again",
    "reconciled": "in doubt: it had run (reconciled)",
}
"""How a timeline says an ``action.in_doubt`` event's ``settled``, in words."""


def checked_in_doubt(name: str, value: Any, remote: bool) -> InDoubt:
    """``value`` as a tool's ``in_doubt``, checked.

    Raises:
        ConfigurationError: not ``"rerun"``, ``"ask"`` or an ``async`` function, or set on a
            local tool (it runs exactly once: it is never in doubt).
    """
    if value == "rerun":
        return "rerun"
    if value != "ask" and not (callable(value) and (
            inspect.iscoroutinefunction(value)
            or inspect.iscoroutinefunction(getattr(value, "__call__", None)))):  # noqa: B004
        raise ConfigurationError(
            f"tool {name!r}: in_doubt must be 'rerun', 'ask' or an async function "
            f"(input, ctx) -> Reconciled, not {value!r}")
    if not remote:
        raise ConfigurationError(
            f"tool {name!r}: in_doubt applies to remote tools (async def); a local tool "
            "runs inside its step's transaction, exactly once, and is never in doubt")
    return value  # type: ignore[no-any-return]


__all__ = ["SETTLED_WORDS", "SKIPPED", "InDoubt", "Reconcile", "Reconciled", "checked_in_doubt"]
