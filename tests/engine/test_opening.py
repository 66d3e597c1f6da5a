"""F1 seams and stores: a runtime is opened in one place (``async with Runtime(...)``,
``await runtime.open()``, a server's lifespan, the CLI); nothing opens it lazily, and a
runtime used before it is open says so."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, SqliteStore, scripted
from durable_turns.errors import ConfigurationError, RuntimeNotOpenError
from durable_turns.records import SessionKey
from durable_turns.scheduling import ClaimingScheduler


def _runtime(db: Path) -> Runtime:
    return Runtime([Agent("ops", "You run ops.")], SqliteStore(db),
                   scripted(lambda _request: ModelReply("done")))


def _uses(rt: Runtime) -> dict[str, Callable[[], Awaitable[Any]]]:
    s = rt.session("ops", "s1")
    key = SessionKey("ops", "s1")
    return {
        "start": lambda: s.start("hi", turn_id="t1"),
        "turn": lambda: s.turn("hi"),
        "result": lambda: s.result("t1", timeout=1),
        "cancel": lambda: s.cancel(),
        "cancel one": lambda: s.cancel("t1"),
        "reset": lambda: s.reset(),
        "retry": lambda: s.retry("t1"),
        "resume": lambda: s.resume("t1", "approve", True),
        "summary": lambda: s.summary(),
        "status": lambda: s.status(),
        "pending": lambda: s.pending(),
        "chain": lambda: s.chain(),
        "turns": lambda: s.turns(),
        "entry": lambda: s.entry("t1"),
        "transcript": lambda: s.transcript(),
        "events": lambda: s.events(),
        "history": lambda: s.history(),
        "archive": lambda: s.archive(0),
        "fork": lambda: s.fork("s2"),
        "set_turn_data": lambda: s.set_turn_data("t1", "x", 1),
        "settle_delivery": lambda: s.settle_delivery("t1"),
        "queries.sessions": lambda: rt.queries.sessions("ops"),
        "queries.inbox": lambda: rt.queries.inbox("ops"),
        "queries.agents": lambda: rt.queries.agents(),
        "queries.find_turn": lambda: rt.queries.find_turn("t1"),
        "queries.owed_deliveries": lambda: rt.queries.owed_deliveries("slack"),
        "recover": lambda: rt.recover(),
        "step": lambda: rt.step(key),
        "chain state": lambda: rt.chain(key),
    }


USES = list(_uses(Runtime([Agent("ops")], MemoryStore())))


@pytest.mark.parametrize("use", USES)
async def test_a_runtime_nobody_opened_refuses_every_use_and_touches_no_store(
        tmp_path: Path, use: str) -> None:
    db = tmp_path / "never.sqlite"
    rt = _runtime(db)
    with pytest.raises(RuntimeNotOpenError, match=r"async with Runtime\(\.\.\.\)") as raised:
        await _uses(rt)[use]()
    assert isinstance(raised.value, ConfigurationError)
    assert not db.exists()  # nothing opened the store behind the caller's back


async def test_a_claiming_worker_of_a_runtime_nobody_opened_refuses_to_start(
        tmp_path: Path) -> None:
    db = tmp_path / "never.sqlite"
    claims = ClaimingScheduler(poll_interval=0.05)
    Runtime([Agent("ops")], SqliteStore(db), scheduler=claims)
    with pytest.raises(RuntimeNotOpenError):
        await claims.run()
    assert not db.exists()


async def test_following_a_session_of_a_runtime_nobody_opened_is_refused_at_once(
        tmp_path: Path) -> None:
    rt = _runtime(tmp_path / "never.sqlite")
    with pytest.raises(RuntimeNotOpenError):
        rt.session("ops", "s1").observe(lambda _e: None)
    with pytest.raises(RuntimeNotOpenError):
        rt.subscribe(SessionKey("ops", "s1"))


async def test_async_with_opens_the_runtime_for_its_block_only(tmp_path: Path) -> None:
    rt = _runtime(tmp_path / "db.sqlite")
    assert not rt.is_open
    async with rt as same:
        assert same is rt and rt.is_open
        assert (await rt.session("ops", "s1").turn("hi")).text == "done"
    assert not rt.is_open
    with pytest.raises(RuntimeNotOpenError):
        await rt.session("ops", "s1").transcript()
    await rt.open()  # opened again, explicitly: the session is where it was
    try:
        assert [m.text for m in await rt.session("ops", "s1").transcript()] == ["hi", "done"]
    finally:
        await rt.close()
