"""Who may do what to a session: the authorization hook of the hosts (the HTTP host, channels).

A host that verifies its callers (``create_app(runtime, authenticate=…)``) asks, before every
action, ``authorize(principal, action, session)``, in one place, as LangGraph Platform's
``@auth.on`` handlers decide theirs:

- ``principal`` is what ``authenticate`` returned (its ``id``, a key or an attribute, is the
  caller's id, qualified by where it was verified: :func:`principal_id`, ``http:alice``;
  ``admin`` set to ``True`` marks an administrator);
- ``action`` is one of the host's own (:data:`HOST_ACTIONS`): ``read`` (a session's
  transcript, timeline, events, history), ``turn`` (start a turn), ``fork`` (copy it to a
  new session the caller owns, or replay it into one), ``list`` (an agent's sessions) and
  ``inbox`` (an agent's parked requests); or the action a command declares in the runtime's
  registry (:func:`actions`): ``cancel``, ``reset``, ``resume`` (answer its parked request),
  ``turn`` for a retry, and any a registered command adds;
- ``session`` is the session's :class:`~durable_turns.records.SessionSummary` (its
  ``owner``, whether it ``exists``, the request it is ``pending`` on); ``None`` for ``list``
  and ``inbox``.

It answers ``True`` (allowed), ``False`` (refused: 403), or, for ``list`` and ``inbox``, a
:class:`~durable_turns.records.Visibility`: which sessions the listing shows, applied by the
store in its query (``True`` shows them all). It may be ``async``.

:func:`default_authorize` is what a host uses when the app gives none: a principal sees and
acts on the sessions it owns (the first principal to start a turn in a session or reset it
owns it; a child session is its parent's owner's), answerers see and answer the requests
they may answer, an administrator sees and does everything. Who may *answer* a request is
still decided by the request's answerers (F6) after this: an administrator is no answerer
of someone else's request.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .commands import COMMANDS, Registry
from .errors import ConfigurationError, SessionAccessError
from .inbound import identity, source_of
from .records import InputRequest, SessionSummary, Visibility

__all__ = [
    "ACTIONS",
    "HOST_ACTIONS",
    "HTTP",
    "LISTINGS",
    "Action",
    "Authorize",
    "Decision",
    "actions",
    "authorized",
    "decide",
    "default_authorize",
    "is_admin",
    "listing",
    "may_answer",
    "principal_id",
]

Action = str
"""What a caller asks to do (see the module's docstring)."""
HTTP = "http"
"""The source of an HTTP host's principals (``http:alice``)."""
HOST_ACTIONS: tuple[Action, ...] = ("read", "turn", "fork", "list", "inbox")
"""The actions of the host's own routes (reads, turns, forks, listings)."""


def actions(commands: Registry) -> tuple[Action, ...]:
    """Every action a host with ``commands`` asks: its own, then its commands'."""
    return tuple(dict.fromkeys((*HOST_ACTIONS, *commands.actions)))


ACTIONS: tuple[Action, ...] = actions(COMMANDS)
"""The actions of a host with the built-in commands."""
LISTINGS: frozenset[Action] = frozenset({"list", "inbox"})
"""The actions on many sessions: decided with no session, answered with a visibility."""

Decision = bool | Visibility
Authorize = Callable[[Any, Action, SessionSummary | None], Decision | Awaitable[Decision]]
"""``authorize(principal, action, session)`` (sync or async) → ``True``, ``False``, or (for
``list`` and ``inbox``) a :class:`~durable_turns.records.Visibility`."""


def principal_id(principal: Any) -> str | None:
    """The caller's identity: ``<source>:<id>`` (``inbound.identity``) of ``principal["id"]``
    or ``principal.id``, where ``source`` (a key or an attribute) says where it was verified,
    ``http`` when the principal does not say (what an HTTP host's ``authenticate`` returns);
    ``None``: it has no id."""
    def field(name: str) -> Any:
        return principal.get(name) if isinstance(principal, Mapping) else getattr(
            principal, name, None)

    who, source = field("id"), field("source")
    if who is None:
        return None
    return identity(source if isinstance(source, str) and source else HTTP, str(who))


def is_admin(principal: Any) -> bool:
    """Whether the app marked the principal as an administrator: ``admin`` (a key or an
    attribute) is ``True`` (the value itself, not merely something truthy)."""
    flag = principal.get("admin") if isinstance(principal, Mapping) else getattr(
        principal, "admin", None)
    return flag is True


def may_answer(request: InputRequest | None, who: str | None) -> bool:
    """Whether ``who`` is named among the answerers of the request (or of one of its batch,
    ``more``), or one of them is answered under a policy (which the agent's
    ``authorize_answer`` decides when the answer comes)."""
    if request is None or who is None:
        return False
    for r in request.all:
        answerers = r.answerers or {}
        rule = answerers.get("user")
        # A bare rule (stored before identities were qualified) lets its id of any source
        # past this pre-check; the answer itself is checked in the turn's source (F6).
        if rule == who or "policy" in answerers or (
                isinstance(rule, str) and source_of(rule) is None
                and who.partition(":")[2] == rule):
            return True
    return False


def default_authorize(principal: Any, action: Action,
                      session: SessionSummary | None) -> Decision:
    """The rules a host follows when the app gives no ``authorize``.

    - ``list``: the sessions the principal owns; ``inbox``: those, and the sessions parked
      on a request naming it as an answerer; an administrator sees every session.
    - On one session: an administrator may do anything; its owner may do anything; a
      session the store does not have yet is anyone's to start (the first owns it); a
      ``resume`` is allowed to the request's answerers (a policy's are decided by the
      agent's ``authorize_answer``); nothing else.
    """
    who = principal_id(principal)
    if is_admin(principal):
        return True
    if action in LISTINGS:
        return Visibility(owner=who, answerer=who if action == "inbox" else None)
    if session is None:
        return False
    if not session.exists or (session.owner is not None and session.owner == who):
        return True
    return action == "resume" and may_answer(session.pending, who)


async def decide(authorize: Authorize, principal: Any, action: Action,
                 session: SessionSummary | None) -> Decision:
    """``authorize``'s answer, awaited if it is a coroutine.

    Raises:
        ConfigurationError: it answered something else than a bool (or, for a listing, a
            :class:`~durable_turns.records.Visibility`).
    """
    found = authorize(principal, action, session)
    if inspect.isawaitable(found):
        found = await found
    if isinstance(found, bool) or (action in LISTINGS and isinstance(found, Visibility)):
        return found
    raise ConfigurationError(
        f"authorize(principal, {action!r}, session) returned {found!r}: it answers True or "
        "False" + (", or a Visibility" if action in LISTINGS else ""))


async def authorized(authorize: Authorize, principal: Any, action: Action,
                     session: SessionSummary) -> None:
    """Check that ``principal`` may ``action`` ``session``.

    Raises:
        SessionAccessError: ``authorize`` said no.
        ConfigurationError: ``authorize`` answered something else than a bool.
    """
    if await decide(authorize, principal, action, session) is not True:
        raise SessionAccessError(session=str(session.key), action=action,
                                 by=principal_id(principal))


async def listing(authorize: Authorize, principal: Any, action: Action) -> Visibility | None:
    """What a ``list`` or ``inbox`` shows ``principal``: a visibility, or ``None`` for every
    session.

    Raises:
        SessionAccessError: ``authorize`` said no.
        ConfigurationError: ``authorize`` answered something else.
    """
    found = await decide(authorize, principal, action, None)
    if found is False:
        raise SessionAccessError(session="", action=action, by=principal_id(principal))
    return None if found is True else found
