"""Agents in Cloudflare Durable Objects (extra ``cloudflare``): one object per session.

- :class:`DurableObjectStore`: the session store on a Durable Object's SQLite storage
  (``ctx.storage``), a dialect of the SQL kit.
- :mod:`durable_turns.cloudflare.testing`: a faithful fake of that storage, to test an
  object in CPython.
"""

from __future__ import annotations

from ._store import DurableObjectStore

__all__ = ["DurableObjectStore"]
