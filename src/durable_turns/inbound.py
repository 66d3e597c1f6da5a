"""What opens a turn: a person's message from a channel, or a trigger with no person; and
who a person is: an identity qualified by where it was verified (``source:id``).

An id means something only where it was verified: Slack's ``U024BE7LH`` and an HTTP bearer
user who calls itself ``U024BE7LH`` are two people. So every host that verifies its callers
names them as :func:`identity` does, ``<source>:<id>`` (``slack:U024BE7LH``, ``http:alice``,
``teams:29:1a…``): in the ``by`` of an answer, a session's owner, answerer rules and grants.
A bare id (no ``source:`` in front) comes from the app's own code (a test, the CLI, an
answerer rule written before identities were qualified); :func:`answers_as` says how the two
meet.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SOURCE_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,39}")
"""What a source's name looks like (``slack``, ``http``, ``teams``): the part of an identity
before its first ``:``."""


def identity(source: str, who: str) -> str:
    """``who`` as verified by ``source``: ``<source>:<who>`` (an id that already starts with
    ``<source>:`` is kept as it is)."""
    return who if who.startswith(f"{source}:") else f"{source}:{who}"


def source_of(who: str) -> str | None:
    """The source an identity names (``slack`` for ``slack:U1``); ``None`` for a bare id."""
    head, sep, _ = who.partition(":")
    return head if sep and SOURCE_NAME.fullmatch(head) else None


def answers_as(rule: str, by: str | None, source: str | None = None) -> bool:
    """Whether the resumer ``by`` is the person an answerer rule ``{"user": rule}`` names.

    - The same identity: yes (``slack:U1`` and ``slack:U1``).
    - A bare rule (``U1``: a request stored before identities were qualified) names that id
      in the source of the turn that asked (``source``): ``slack:U1`` answers it in a Slack
      turn, ``http:U1`` does not; with no source known, only the bare ``U1`` does.
    - A bare ``by`` is the app's own code answering (the CLI's ``--by``, a test's
      ``resume(by=…)``; hosts never pass one): it answers for that id in any source.

    Args:
        rule: the rule's ``user``.
        by: who answers.
        source: the source of the turn that asked (its inbound event's).
    """
    if by is None:
        return False
    if by == rule:
        return True
    if source_of(rule) is None:
        return source is not None and by == identity(source, rule)
    return source_of(by) is None and rule == identity(str(source_of(rule)), by)


@dataclass(frozen=True, slots=True)
class User:
    """Who spoke. ``attested`` is true only when the channel verified the id (e.g. Slack)."""

    id: str
    attested: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "attested": self.attested}


@dataclass(frozen=True, slots=True, init=False)
class InboundEvent:
    """A message that arrived from a channel.

    Attributes:
        source: the channel it came from (``"slack"``, ``"http"``, …); it selects the
            per-source policy (F10) and cannot be set by the speaker.
        user: the speaker, a :class:`User` or a mapping ``{"id", "attested"}``.
        text: what they said.
        raw: the channel's original payload; never persisted.
        meta: small routing data the channel needs later (thread ids, …); persisted.
    """

    source: str
    user: User | None
    text: str
    raw: Any
    meta: Mapping[str, Any]

    def __init__(
        self,
        source: str,
        user: User | Mapping[str, Any] | None = None,
        text: str = "",
        raw: Any = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if not source or not isinstance(source, str):
            raise ValueError("an inbound event needs its source (the channel's name)")
        if isinstance(user, Mapping):
            user = User(str(user["id"]), bool(user.get("attested", False)))
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "user", user)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "raw", raw)
        object.__setattr__(self, "meta", dict(meta or {}))

    def to_dict(self) -> dict[str, Any]:
        """The event as stored: everything but ``raw``."""
        return {
            "source": self.source,
            "user": self.user.to_dict() if self.user else None,
            "text": self.text,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InboundEvent:
        return cls(
            source=data["source"],
            user=data.get("user"),
            text=data.get("text", ""),
            meta=data.get("meta") or {},
        )


@dataclass(frozen=True, slots=True)
class Trigger:
    """A turn nobody typed: a schedule, a webhook, another agent (F9)."""

    kind: str = "proactive"
    by: str = "system"


__all__ = ["SOURCE_NAME", "InboundEvent", "Trigger", "User", "answers_as", "identity",
           "source_of"]
