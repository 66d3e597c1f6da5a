from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from durable_turns import MemoryStore, SqliteStore
from durable_turns.stores import SessionStore

STORES = ["memory", "sqlite"]


@pytest.fixture(autouse=True)
def _no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPENAI_")):
            monkeypatch.delenv(name)


@pytest.fixture(params=STORES)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], SessionStore]:
    if request.param == "memory":
        return MemoryStore
    return lambda: SqliteStore(tmp_path / "store.sqlite")


@pytest.fixture
async def store(store_factory: Callable[[], SessionStore]) -> AsyncIterator[SessionStore]:
    s = store_factory()
    await s.open()
    yield s
    await s.close()
