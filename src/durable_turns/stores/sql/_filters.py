"""What a listing may show, as SQL: a :class:`~durable_turns.records.Visibility` rendered as
the ``WHERE`` condition of the session summaries' statement (``s``: the session row, ``t``:
its parked chain entry)."""

from __future__ import annotations

from ...messages import encode_json
from ...records import Visibility

__all__ = ["visible_where"]


def visible_where(v: Visibility, contains: str) -> tuple[str, list[str]]:
    """The condition (with its ``?`` parameters) that keeps the sessions ``v`` shows: owned
    by ``v.owner``, or parked on a request ``v.answerer`` (or one of ``v.policies``) answers.

    A request is stored in its one encoding (``encode_json``: compact, keys in the order they
    were written), so "these answerers" is a fixed piece of its JSON, found as a substring
    (``contains``: the dialect's test, ``Syntax.contains``; not ``LIKE``, whose patterns
    some backends bound to 50 bytes): ``"answerers":{"user":"ann"}`` can only be an
    ``answerers`` member, since inside a JSON string every ``"`` is escaped. The requests of
    a parallel batch (``more``) are in the same text, so a session parked on several shows to
    the answerer of any of them.
    """
    conditions, params = ["1 = 0"], []
    if v.owner is not None:
        conditions.append("s.owner = ?")
        params.append(v.owner)
    pieces = [] if v.answerer is None else [encode_json({"user": v.answerer})]
    # A policy's answerers are written {"policy", "scope"}, in that order
    # (hitl.default_answerers): the policy is their start.
    pieces += [encode_json({"policy": p})[:-1] + "," for p in v.policies]
    for piece in pieces:
        conditions.append(contains.format(text="t.request", part="?"))
        params.append(f'"answerers":{piece}')
    return " OR ".join(conditions), params
