"""Human in the loop (F6): input requests, who may answer them, and grants. Pure logic.

A remote tool parks its turn with ``await ctx.request_input(...)``. Who may answer:

- ``{"user": id}``: exactly that verified identity (the resumer's ``by``), qualified by
  where it was verified (``slack:U1``, ``http:alice``: ``inbound.identity``); a bare id the
  tool names is read in the source of the turn that asks (``{"user": "U1"}`` in a Slack turn
  is ``slack:U1``), and stored so;
- ``{"policy": p, "scope": s}``: only with a :class:`Grant` that :func:`grant_answer` issued
  after the agent's ``authorize_answer`` said yes — ``by`` alone never answers a policy, and
  a grant never answers a user;
- none named: the turn's speaker (``<source>:<id>``) if the channel attested them; an
  unattested speaker cannot park (name an answerer); a turn with no inbound event has no
  restriction.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError, InvalidInputError, ResumeAuthorizationError
from .inbound import InboundEvent, answers_as, identity, source_of
from .records import InputRequest
from .tools import compile_schema, schema_problem


def default_answerers(
    answerers: Mapping[str, Any] | None, event: InboundEvent | None, input_id: str
) -> dict[str, Any] | None:
    """The answerers a request gets: the named ones, else the attested speaker.

    Raises:
        ConfigurationError: nobody is named and the speaker is not attested.
    """
    if answerers is not None:
        answerers = dict(answerers)
        if set(answerers) == {"user"} and answerers["user"]:
            if event is not None and isinstance(answerers["user"], str) and \
                    source_of(answerers["user"]) is None:
                return {"user": identity(event.source, answerers["user"])}
            return answerers
        if "policy" in answerers and set(answerers) <= {"policy", "scope"}:
            return {"policy": answerers["policy"], "scope": answerers.get("scope")}
        raise ConfigurationError(
            f"request_input({input_id!r}): answerers must be {{'user': id}} or "
            f"{{'policy': p, 'scope': s}}, not {answerers!r}"
        )
    if event is None:
        return None  # programmatic or proactive turn: the app drives its own resume
    if event.user is not None and event.user.attested:
        return {"user": identity(event.source, event.user.id)}
    raise ConfigurationError(
        f"request_input({input_id!r}): the turn's speaker is not attested by its channel "
        f"({event.source!r}), so nobody could be trusted to answer; name an answerer "
        "(answerers={'user': …} or {'policy': …, 'scope': …})"
    )


def who_may_answer(answerers: Mapping[str, Any] | None) -> str:
    """Who may answer a request with these answerers, in words (what a host prints).

    Args:
        answerers: an :class:`~durable_turns.records.InputRequest`'s ``answerers``.
    """
    if not answerers:
        return "anyone may answer"
    if "user" in answerers:
        return f"only {answerers['user']} may answer"
    return (f"whoever the agent's policy {answerers.get('policy')!r} allows may answer "
            f"(scope {answerers.get('scope')!r})")


def validate_answer(request: InputRequest, value: Any) -> None:
    """Check an answer against the request's schema.

    Raises:
        InvalidInputError: saying what is wrong.
    """
    try:
        json.dumps(value, allow_nan=False)  # (NaN and infinities are no JSON)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"the answer to {request.id!r} is not JSON: {e}",
                                input_id=request.id) from None
    if request.schema is None:
        return
    problem = schema_problem(compile_schema(request.schema), value)
    if problem is not None:
        raise InvalidInputError(f"the answer to {request.id!r} does not fit its schema: {problem}",
                                input_id=request.id)


@dataclass(frozen=True, slots=True)
class Grant:
    """Permission for one resumer to answer one policy-restricted request.

    Only :func:`grant_answer` makes valid ones: the signature is keyed by a secret of the
    runtime, so a grant built by hand (or for another request) is refused.
    """

    session: str
    turn_id: str
    input_id: str
    policy: str
    scope: Any
    by: str | None
    signature: str = field(default="", repr=False)

    def payload(self) -> bytes:
        return json.dumps([self.session, self.turn_id, self.input_id, self.policy, self.scope,
                           self.by], separators=(",", ":")).encode()


def sign(grant: Grant, secret: bytes) -> Grant:
    sig = hmac.new(secret, grant.payload(), hashlib.sha256).hexdigest()
    return Grant(grant.session, grant.turn_id, grant.input_id, grant.policy, grant.scope,
                 grant.by, sig)


def check_answerer(
    request: InputRequest, session: str, by: str | None, granted: Grant | None, secret: bytes,
    source: str | None = None,
) -> None:
    """May ``by`` (with ``granted``) answer ``request``? ``source``: the source of the turn
    that asked (a bare id in a rule is read in it: ``inbound.answers_as``).

    Raises:
        ResumeAuthorizationError: saying who may answer instead.
    """
    who = request.answerers
    if who is None:
        return
    if "user" in who:
        if not answers_as(str(who["user"]), by, source):
            raise ResumeAuthorizationError(
                f"only user {who['user']!r} may answer {request.id!r}"
                + (f"; {by!r} may not" if by else "; the resume named nobody (by=…)"),
                input_id=request.id, by=by,
            )
        return
    policy, scope = who["policy"], who.get("scope")
    if granted is None:
        raise ResumeAuthorizationError(
            f"{request.id!r} is answered under policy {policy!r}: resume with a grant from "
            "grant_answer() (by alone never answers a policy)",
            input_id=request.id, by=by,
        )
    if not isinstance(granted, Grant) or not hmac.compare_digest(
        granted.signature, sign(granted, secret).signature
    ):
        raise ResumeAuthorizationError("the grant is forged or was issued by another runtime",
                                       input_id=request.id, by=by)
    if (granted.session, granted.turn_id, granted.input_id, granted.policy, granted.scope,
            granted.by) != (session, request.turn_id, request.id, policy, scope, by):
        raise ResumeAuthorizationError(
            f"the grant is for another request, policy, scope or resumer than {request.id!r} "
            f"under {policy!r}/{scope!r} by {by!r}",
            input_id=request.id, by=by,
        )


__all__ = [
    "Grant",
    "check_answerer",
    "default_answerers",
    "sign",
    "validate_answer",
    "who_may_answer",
]
