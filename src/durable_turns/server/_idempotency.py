"""``Idempotency-Key`` on the routes that start a turn (``POST …/turn``, ``POST …/chat``).

A client that did not get an answer (a timeout, a 503 while the database was away, a
dropped connection) cannot know whether its turn was started. Repeating the request with the
same ``Idempotency-Key`` header is safe, with the semantics of the IETF draft "The
Idempotency-Key HTTP Header Field" (draft-ietf-httpapi-idempotency-key-header):

- the same key with the same body is the same turn: its stream again (``/turn``, from its
  first event) or its result (``/chat``), however often, whenever (a key names its turn for
  as long as the session keeps it);
- the same key with another body is refused with 422 (``IdempotencyKeyReused``), and
  nothing is started;
- keys are the caller's: the same key from two callers (two principals; in development mode,
  two ``by``) names two turns;
- a key is 1 to 255 printable ASCII characters (a UUID is the usual choice); another is
  400.

Requests that arrive together with one key start one turn (the store accepts an id once) and
both follow it. Without a key (or a ``turn_id`` in the body, which is a key of the client's
own making) a repeated request may start a second turn.

How: the key names the turn's id (``k-`` and a hash of the caller and the key) unless the body
gives a ``turn_id``; the fingerprint of the body (a hash of its JSON, every field) is kept in
the turn's data, ``idempotency``, written with the turn in the same statement
(``NewEntry.data``), so there is never a turn without it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from .._input_limits import HttpError
from ..channels import ChannelContext, TurnStream
from ..errors import TurnConflictError
from ..inbound import InboundEvent
from ..sessions import AgentSession, Mode

HEADER = "idempotency-key"
"""The request header (case does not matter)."""
DATA = "idempotency"
"""The name of the turn's data that keeps the body's fingerprint."""
_KEY = re.compile(r"^[ -~]{1,255}$")


@dataclass(frozen=True, slots=True)
class Idempotent:
    """What a request's ``Idempotency-Key`` makes of the turn it starts."""

    turn_id: str
    """The turn the key names."""
    fingerprint: str
    """The request body's fingerprint."""

    @property
    def data(self) -> dict[str, Any]:
        """What is kept with the turn (``AgentSession.start(data=…)``)."""
        return {DATA: self.fingerprint}

    def refused(self) -> HttpError:
        """The 422 of a key used again with another body."""
        return HttpError(422, "IdempotencyKeyReused",
                         "this Idempotency-Key was used with another request body; a key "
                         "names one request: use a new key for a new turn")

    async def check(self, session: AgentSession) -> None:
        """Refuse a key whose turn was started by another body.

        Raises:
            HttpError: 422, the turn's kept fingerprint is not this body's.
        """
        rec = await session.entry(self.turn_id)
        kept = (rec.data or {}).get(DATA) if rec is not None else None
        # None: the turn was started without a key (by its turn_id), with this text.
        if kept is not None and kept != self.fingerprint:
            raise self.refused()


def idempotent(key: str | None, body: dict[str, Any], by: str | None) -> Idempotent | None:
    """The turn a request's ``Idempotency-Key`` names, or ``None`` without one.

    Args:
        key: the header's value.
        body: the request's body, every field (its fingerprint).
        by: who asks (the principal's id; in development mode the body's ``by``).

    Raises:
        HttpError: 400, a key that is empty, too long, or not printable ASCII.
    """
    if key is None:
        return None
    if not _KEY.match(key):
        raise HttpError(400, "MalformedIdempotencyKey",
                        "an Idempotency-Key is 1 to 255 printable ASCII characters")
    print_ = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    fingerprint = hashlib.sha256(print_.encode()).hexdigest()
    turn_id = body.get("turn_id")
    if not isinstance(turn_id, str) or not turn_id:
        scope = json.dumps([by, key])
        turn_id = "k-" + hashlib.sha256(scope.encode()).hexdigest()[:40]
    return Idempotent(turn_id, fingerprint)


def conflict(e: TurnConflictError, idem: Idempotent | None) -> Exception:
    """What a turn id taken by other text means: with a key, that the key was reused (422)."""
    return idem.refused() if idem is not None else e


async def open_keyed(ch: ChannelContext, text: str, idem: Idempotent | None, *, session: str,
                     event: InboundEvent | None, replace: bool = False,
                     turn_id: str | None = None, mode: Mode = "queue",
                     data: dict[str, Any] | None = None) -> TurnStream:
    """Start a turn (``ChannelContext.open_turn``) as ``idem`` names it, or by ``turn_id``
    without a key, and return its stream once the key is known to be this request's.
    ``data``: names of the turn's data to set with it (beside the key's).

    Raises:
        HttpError: 422 the key was used with another body (nothing is started).
        TurnConflictError: ``turn_id`` (no key) was accepted with other text.
        SessionBusyError: the session is parked on another turn.
    """
    try:
        stream = await ch.open_turn(text, session=session, replace=replace, event=event,
                                    turn_id=idem.turn_id if idem else turn_id,
                                    data={**(idem.data if idem else {}), **(data or {})}
                                    or None, mode=mode)
    except TurnConflictError as e:
        raise conflict(e, idem) from None
    if idem is not None:
        try:
            await idem.check(stream.session)
        except BaseException:
            stream.close()
            raise
    return stream


__all__ = ["DATA", "HEADER", "Idempotent", "conflict", "idempotent", "open_keyed"]
