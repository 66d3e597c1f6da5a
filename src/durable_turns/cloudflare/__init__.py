"""Agents in Cloudflare Durable Objects (extra ``cloudflare``): one object per session.

- :class:`AgentObject`: the Durable Object class of an agent's sessions (subclass it, give
  :meth:`~AgentObject.setup`); :func:`forward` routes a Worker's requests
  (``/agents/{agent}/sessions/{id}/…``) to the session's object.
- :class:`DurableObjectStore`: the session store on a Durable Object's SQLite storage
  (``ctx.storage``), a dialect of the SQL kit; :class:`AlarmScheduler`, the object's
  scheduler: its alarm wakes what an eviction cut off.
- :mod:`durable_turns.cloudflare.testing`: a faithful fake of that storage and of the
  object's state, to test an object in CPython.
"""

from __future__ import annotations

from ._alarm import BACKSTOP, AlarmScheduler
from ._http import ObjectRequest, Reply
from ._object import AgentObject, ObjectSetup, TurnBody
from ._store import DurableObjectStore
from ._workers import forward, object_name

__all__ = [
    "BACKSTOP",
    "AgentObject",
    "AlarmScheduler",
    "DurableObjectStore",
    "ObjectRequest",
    "ObjectSetup",
    "Reply",
    "TurnBody",
    "forward",
    "object_name",
]
