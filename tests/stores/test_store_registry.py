"""F1: ``store_for``: a URL or a path names a store, and an unknown scheme is a clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_turns import MemoryStore, SqliteStore
from durable_turns.errors import ConfigurationError
from durable_turns.stores import SessionStore, registry
from durable_turns.stores.registry import store_for


def test_memory_and_sqlite_specs(tmp_path: Path) -> None:
    assert isinstance(store_for("memory:"), MemoryStore)
    for spec, path in ((str(tmp_path / "a.sqlite"), tmp_path / "a.sqlite"),
                       (f"sqlite:{tmp_path}/b.db", tmp_path / "b.db"),
                       ("relative.db", Path("relative.db"))):
        store = store_for(spec)
        assert isinstance(store, SqliteStore) and store.path == path, spec
    assert store_for("memory:").capabilities.durable is False


def test_postgres_urls_and_libpq_strings_with_their_lease_ttl() -> None:
    from durable_turns import PostgresStore

    for spec in ("postgresql://u@localhost:5432/db", "postgres://u@h/db",
                 "host=localhost dbname=db"):
        store = store_for(spec, lease_ttl=3.0)
        assert isinstance(store, PostgresStore) and store.dsn == spec
        assert store.capabilities.lease_ttl == 3.0
    default = store_for("postgresql://u@h/db")
    assert default.capabilities.lease_ttl == 15.0


def test_an_unknown_scheme_or_nothing_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"no store for redis: .*known: memory:"):
        store_for("redis://localhost/0")
    with pytest.raises(ConfigurationError, match="no store given"):
        store_for("")


class _EntryPoint:
    name = "fancy"

    def load(self) -> Any:
        def make(spec: str, lease_ttl: float | None) -> SessionStore:
            assert (spec, lease_ttl) == ("fancy://x", 2.0)
            return MemoryStore()

        return make


def test_a_package_registers_a_scheme_as_an_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    def entry_points(*, group: str, name: str) -> list[_EntryPoint]:
        return [_EntryPoint()] if (group, name) == ("durable_turns.stores", "fancy") else []

    monkeypatch.setattr(registry, "entry_points", entry_points)
    assert isinstance(store_for("fancy://x", lease_ttl=2.0), MemoryStore)
    with pytest.raises(ConfigurationError):
        store_for("other://x")
