"""Deciding who may answer a ``{policy, scope}`` request (F6): the app's
``authorize_answer`` asked, and the signed :class:`~durable_turns._hitl.Grant` it yields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ._hitl import Grant, sign
from .agent import Agent, AuthorizeAnswer
from .commands import Resume
from .errors import AuthorizeAnswerError, ConfigurationError, ResumeAuthorizationError
from .records import InputRequest, SessionKey
from .stores import SessionStore

__all__ = ["GrantingSession", "decided", "grant_answer"]


class _Runtime(Protocol):
    agents: dict[str, Agent]
    secret: bytes

    @property
    def store(self) -> SessionStore: ...

    def require_open(self) -> None: ...


class GrantingSession(Protocol):
    """What deciding a grant reads of an ``AgentSession``."""

    @property
    def key(self) -> SessionKey: ...

    @property
    def agent(self) -> Agent: ...

    @property
    def runtime(self) -> _Runtime: ...


async def grant_answer(
    session: GrantingSession,
    resume: Mapping[str, Any],
    authorize_answer: AuthorizeAnswer | None = None,
) -> Grant:
    """Ask the app whether this resumer may answer a ``{policy, scope}`` request (F6).

    Args:
        session: the parked session.
        resume: ``turn_id``, ``input_id``, ``by`` and ``principal`` of the resume.
        authorize_answer: the decision; defaults to the agent's ``authorize_answer`` (the
            subagent's, for a request a subagent made).

    Returns:
        A grant to pass to ``resume(granted=…)``; it is signed and good for exactly that
        request, policy, scope and resumer.

    Raises:
        ResumeConflictError: the session is not parked on that request.
        ResumeAuthorizationError: the request is not policy-restricted, or the app said no.
        Exception: whatever ``authorize_answer`` raised; nothing was applied, retry later.
    """
    session.runtime.require_open()
    asked = Resume(resume["turn_id"], resume["input_id"])
    pending = await session.runtime.store.entries(session.key, unfinished=True)
    return await _granted(session, asked.request(session.key, pending), resume.get("by"),
                          resume.get("principal"), authorize_answer)


async def decided(session: GrantingSession, request: InputRequest, by: str | None,
                   principal: Any) -> Grant:
    """The grant for a policy-restricted request, when the app's ``authorize_answer`` says
    yes (its failure is an :class:`AuthorizeAnswerError`)."""
    try:
        return await _granted(session, request, by, principal, None)
    except (ResumeAuthorizationError, ConfigurationError):
        raise
    except Exception as e:
        raise AuthorizeAnswerError(
            f"authorize_answer failed ({type(e).__name__}); nothing was applied, retry later",
            input_id=request.id, by=by) from e


async def _granted(session: GrantingSession, request: InputRequest, by: str | None,
                   principal: Any, authorize_answer: AuthorizeAnswer | None) -> Grant:
    who = request.answerers or {}
    if "policy" not in who:
        raise ResumeAuthorizationError(
            f"{request.id!r} is not answered under a policy; resume it with by=… instead",
            input_id=request.id, by=by,
        )
    # A subagent's request is decided by the subagent's rules, as it is enforced there.
    owner = session.runtime.agents[request.child["agent"]] if request.child else session.agent
    decide = authorize_answer or owner.authorize_answer
    if decide is None:
        raise ConfigurationError(
            f"agent {owner.name!r} has no authorize_answer to decide policy {who['policy']!r}"
        )
    ok = await decide({"policy": who["policy"], "scope": who.get("scope"), "by": by,
                       "principal": principal})
    if ok is not True:
        raise ResumeAuthorizationError(
            f"{by!r} may not answer {request.id!r} under policy {who['policy']!r}",
            input_id=request.id, by=by,
        )
    if request.child is not None:  # the child checks the grant: make it out to the child
        c = request.child
        grant = Grant(f"{c['agent']}/{c['session']}", c["turn_id"], c["input_id"],
                      who["policy"], who.get("scope"), by)
    else:
        grant = Grant(str(session.key), request.turn_id, request.id, who["policy"],
                      who.get("scope"), by)
    return sign(grant, session.runtime.secret)
