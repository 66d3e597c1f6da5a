"""Which store a URL or a path names: ``store_for(spec)``, for the CLI and any host that takes
a ``--store`` option.

- ``postgresql://…`` or ``postgres://…``, or a libpq ``key=value`` string (it has a ``=``):
  :class:`~durable_turns.stores.postgres.PostgresStore` (psycopg is imported only then);
- ``memory:``: :class:`~durable_turns.stores.memory.MemoryStore`;
- ``sqlite:PATH`` or anything else without a scheme: a SQLite file
  (:class:`~durable_turns.stores.sqlite.SqliteStore`);
- any other ``scheme://…``: the store an installed package registers under that scheme (an
  entry point of the group ``durable_turns.stores``, naming a callable that takes the spec and
  the options below), else a :class:`~durable_turns.errors.ConfigurationError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

from ..errors import ConfigurationError
from . import SessionStore

__all__ = ["ENTRY_POINTS", "SCHEMES", "file_of", "store_for"]

ENTRY_POINTS = "durable_turns.stores"
"""The entry point group a third-party store registers its scheme in."""

Factory = Callable[[str, "float | None"], SessionStore]


def _postgres(spec: str, lease_ttl: float | None) -> SessionStore:
    from .postgres import PostgresStore  # psycopg loads only when asked for

    return PostgresStore(spec) if lease_ttl is None else PostgresStore(spec, lease_ttl=lease_ttl)


def _memory(spec: str, lease_ttl: float | None) -> SessionStore:
    from .memory import MemoryStore

    return MemoryStore()


def _sqlite(spec: str, lease_ttl: float | None) -> SessionStore:
    from .sqlite import SqliteStore

    return SqliteStore(spec.removeprefix("sqlite:"))


SCHEMES: dict[str, Factory] = {
    "postgresql": _postgres, "postgres": _postgres, "memory": _memory, "sqlite": _sqlite}
"""The stores shipped, by scheme."""

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")


def file_of(spec: str) -> Path | None:
    """The file a spec names when its store lives in one file of this machine (a SQLite path,
    ``sqlite:PATH``); ``None`` for any other store. A command that manages existing sessions
    refuses a file that does not exist (opening it would create an empty store)."""
    found = _SCHEME.match(spec)
    scheme = found.group(1).lower() if found else None
    if scheme == "sqlite":
        return Path(spec.removeprefix("sqlite:"))
    if (scheme is None or len(scheme) == 1) and "=" not in spec:
        return Path(spec)
    return None


def store_for(spec: str, *, lease_ttl: float | None = None) -> SessionStore:
    """The store ``spec`` names (see the module docstring), not opened yet.

    Args:
        spec: a URL, a libpq ``key=value`` string, ``memory:``, or a SQLite file's path.
        lease_ttl: for a store whose leases expire (``capabilities.lease_ttl``), their TTL
            in seconds; a store whose leases do not expire has no use for it. ``None``: the
            store's default.

    Returns:
        A store; ``await store.open()`` (a ``Runtime`` does) before using it.

    Raises:
        ConfigurationError: an empty spec, or a scheme nothing registers.
    """
    if not spec:
        raise ConfigurationError("no store given: a SQLite file's path, memory: or a URL")
    found = _SCHEME.match(spec)
    scheme = found.group(1).lower() if found else None
    if scheme is None or len(scheme) == 1:  # a path (C:\… is a drive, not a scheme)
        return _postgres(spec, lease_ttl) if "=" in spec else _sqlite(spec, lease_ttl)
    factory = SCHEMES.get(scheme)
    if factory is None:
        for ep in entry_points(group=ENTRY_POINTS, name=scheme):
            factory = ep.load()
            break
    if factory is None:
        known = ", ".join(f"{s}:" for s in sorted(SCHEMES))
        raise ConfigurationError(f"no store for {scheme}: in {spec!r} (known: {known}, or a "
                                 f"path; a package may register one as an entry point of "
                                 f"{ENTRY_POINTS!r})")
    return factory(spec, lease_ttl)
