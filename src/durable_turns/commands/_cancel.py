"""Cancel (F7): ask a turn, or every unfinished turn, of a session to stop — at once.

Not a chain entry: a durable signal (``SessionStore.request_cancel``, which never waits
behind a running step) that takes effect at the next checkpoint boundary of the turns it
reaches — a running turn before its next model call or its batch's next call (a model
stream is closed), a queued one before it opens, and a parked one has its request withdrawn
and ends in its place in the chain, its owed calls answered ``{"cancelled": true}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import UnknownTurnError
from ..records import ChainEntry, SessionKey
from ._registry import Arg, Call, CommandSpec, Route, Verb

__all__ = ["SPEC", "Cancel", "CancelBody"]


@dataclass(frozen=True, slots=True)
class Cancel:
    """A cancel of one turn (``turn_id``) or of every unfinished one (``None``)."""

    turn_id: str | None = None
    reason: str = "cancelled by request"

    def check(self, key: SessionKey, target: ChainEntry | None) -> None:
        """Raises UnknownTurnError when ``turn_id`` names no turn of the session."""
        if self.turn_id is not None and target is None:
            raise UnknownTurnError(str(key), self.turn_id)


class CancelBody(BaseModel):
    """``POST /cancel``."""

    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types, not coerced
    turn_id: str | None = Field(default=None, min_length=1)
    reason: str = "cancelled by request"


async def _http(call: Call) -> Mapping[str, Any]:
    return {"cancelled": await call.session.cancel(call.body.turn_id, reason=call.body.reason)}


async def _cli(session: Any, args: Any) -> str:
    ids = await session.cancel(args.turn, reason=args.reason)
    return f"cancel requested for {', '.join(ids)}" if ids else "no unfinished turn"


SPEC = CommandSpec(
    "cancel", "cancel a turn or every unfinished one", "at once", "cancel",
    route=Route("cancel", CancelBody, "cancel a turn or every unfinished one", _http,
                answer={"type": "object", "required": ["cancelled"], "properties": {
                    "cancelled": {"type": "array", "items": {"type": "string"}}}},
                required=False, known_session=True),
    verb=Verb("request cancellation of a session's turn (or of every unfinished one)", (
        Arg(("--turn",), {"metavar": "TURN",
                          "help": "the turn to cancel (default: every unfinished one)"}),
        Arg(("--reason",), {"default": "cancelled by request", "help": "why"})), _cli),
)
"""Cancel, as the registry knows it."""
