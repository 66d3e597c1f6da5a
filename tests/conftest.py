from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from durable_turns import MemoryStore, SqliteStore
from durable_turns.events import TurnEvent
from durable_turns.stores import SessionStore


def _worker_database(dsn: str | None) -> str | None:
    """``dsn`` on a database of this pytest-xdist worker's own, made if missing: NOTIFY
    channels and ``pg_stat_activity`` filtered by database are then the worker's alone, as
    they are the suite's in one process."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if dsn is None or worker is None:
        return dsn
    import psycopg

    name = f"durable_turns_test_{worker}"
    with psycopg.connect(dsn, autocommit=True) as c:
        if c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            c.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


PG_DSN = _worker_database(os.environ.get("DURABLE_TURNS_TEST_PG"))
"""A PostgreSQL DSN URL (``.ci/pg up`` starts a throwaway cluster; under pytest-xdist, on the
worker's own database); the postgres tests skip without it."""
STORES = ["memory", "sqlite", "postgres"]


def pg_schema_dsn() -> str:
    """A DSN whose tables live in a new, empty schema of the test database."""
    if PG_DSN is None:
        pytest.skip("PostgreSQL tests need DURABLE_TURNS_TEST_PG (a DSN; see .ci/pg)")
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(PG_DSN, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    return psycopg.conninfo.make_conninfo(PG_DSN, options=f"-csearch_path={schema}")


def assert_slotted(got: list[TurnEvent], stored: list[TurnEvent]) -> None:
    """``got``'s durable events are ``stored``, in order, once; each live one (text carried
    from the driving process) comes right after the durable event whose ``seq`` it
    carries."""
    assert [e.to_dict() for e in got if e.durable] == [e.to_dict() for e in stored]
    last: int | None = None
    for e in got:
        if e.durable:
            last = e.seq
        else:
            assert e.seq == last, f"{e.type} of seq {e.seq} came after event {last}"


@pytest.fixture(autouse=True)
def _no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPENAI_")):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI's tables are as wide as COLUMNS says; pytest-xdist's workers set it (to 80), a
    # terminal may too: the commands the tests run print at their own fixed width instead.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture
def pg_dsn() -> str:
    """A DSN on a new, empty schema (skips without DURABLE_TURNS_TEST_PG)."""
    return pg_schema_dsn()


@pytest.fixture(params=STORES)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], SessionStore]:
    if request.param == "memory":
        return MemoryStore
    if request.param == "postgres":
        from durable_turns import PostgresStore

        dsn = pg_schema_dsn()
        return lambda: PostgresStore(dsn, lease_ttl=5.0)
    return lambda: SqliteStore(tmp_path / "store.sqlite")


@pytest.fixture
async def store(store_factory: Callable[[], SessionStore]) -> AsyncIterator[SessionStore]:
    s = store_factory()
    await s.open()
    yield s
    await s.close()


@pytest.fixture(scope="session")
def temporal_target() -> Iterator[str]:
    """``host:port`` of a Temporal dev server started for the test session (in memory)."""
    import asyncio

    from durable_turns.temporal.devserver import DevServer

    server = DevServer()
    asyncio.run(server.start())
    try:
        yield server.target
    finally:
        server.stop()
