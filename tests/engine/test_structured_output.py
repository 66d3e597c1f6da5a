"""F25 structured output: ``turn(text, output=<pydantic model or JSON schema>)`` validates the
final answer and returns it as ``TurnResult.output``; an invalid answer goes back to the model
with its validation error (a step of its own) up to ``output_retries`` times, then the turn
fails with ``OutputInvalid``. The validated value is stored with the turn's end: a SIGKILL
and a replay in another process neither lose nor re-ask it. On memory, SQLite, PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from crashkit import wait_for_child_file
from durable_turns import (
    Agent,
    ModelRequest,
    OutputInvalid,
    Runtime,
    SqliteStore,
    Stop,
    TextDelta,
)
from durable_turns.messages import OUTPUT_RETRY_BY
from durable_turns.models import ModelEvent
from durable_turns.stores import SessionStore

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""


class Triage(BaseModel):
    severity: Literal["low", "high"]
    team: str


class Answers:
    """Answers each model call of a turn with the next of ``texts``; keeps what it was asked."""

    def __init__(self, *texts: str) -> None:
        self.texts = texts
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        n = sum(1 for m in request.messages
                if m.role == "assistant" and m.turn_id == request.turn_id)
        yield TextDelta(self.texts[n])
        yield Stop("end_turn", {"input_tokens": 1, "output_tokens": 1})


def handed_back(request: ModelRequest) -> list[str]:
    return [m.text for m in request.messages if m.by == OUTPUT_RETRY_BY]


async def test_a_valid_first_answer_is_the_turns_output(store: SessionStore) -> None:
    model = Answers('{"severity": "high", "team": "db"}')
    async with Runtime([Agent("ops", "Triage.")], store, model) as rt:
        s = rt.session("ops", "s1")
        r = await asyncio.wait_for(s.turn("the db is down", output=Triage), WAIT)
        assert r.status == "completed" and r.output == Triage(severity="high", team="db")
        assert r.to_dict()["output"] == {"severity": "high", "team": "db"}  # as JSON
        assert len(model.requests) == 1
        assert '"severity"' in model.requests[0].system  # the schema was asked for
        # Read back from the store (another reader): the JSON value, kept with the turn.
        again = await s.result(r.turn_id)
        assert again.output == {"severity": "high", "team": "db"}
        assert again.to_dict()["output"] == {"severity": "high", "team": "db"}


async def test_an_invalid_answer_goes_back_with_its_error_and_the_next_one_counts(
    store: SessionStore,
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    model = Answers('{"n": "seven"}', "```json\n{\"n\": 7}\n```")
    async with Runtime([Agent("ops", "")], store, model) as rt:
        s = rt.session("ops", "s1")
        r = await asyncio.wait_for(s.turn("count", output=schema), WAIT)
        assert r.status == "completed" and r.output == {"n": 7}
        assert len(model.requests) == 2
        [error] = handed_back(model.requests[1])
        assert "at n: 'seven' is not of type 'integer'" in error  # the model saw why
        log = await s.transcript()
        assert [m.role for m in log] == ["user", "assistant", "user", "assistant"]


async def test_a_turn_fails_naming_the_error_after_its_retries(store: SessionStore) -> None:
    model = Answers("no", "still no", "not JSON either", "never asked")
    async with Runtime([Agent("ops", "")], store, model) as rt:
        s = rt.session("ops", "s1")
        r = await asyncio.wait_for(s.turn("count", output=Triage), WAIT)
        assert r.status == "failed" and r.output is None
        assert r.error is not None and r.error.startswith("OutputInvalid")
        assert "not JSON" in r.error and "after 2 retries" in r.error
        assert len(model.requests) == 3 and len(handed_back(model.requests[2])) == 2
        one = await asyncio.wait_for(
            s.turn("again", output=Triage, output_retries=0), WAIT)
        assert one.status == "failed" and len(model.requests) == 4


async def test_a_bad_output_is_refused_before_anything_is_stored(store: SessionStore) -> None:
    async with Runtime([Agent("ops", "")], store, Answers("{}")) as rt:
        s = rt.session("ops", "s1")
        with pytest.raises(ValueError, match="not a valid JSON schema"):
            await s.start("x", output={"type": "no-such-type"})
        with pytest.raises(ValueError, match="pydantic model class or a JSON schema"):
            await s.start("x", output="Triage")
        with pytest.raises(ValueError, match="output_retries"):
            await s.start("x", output=Triage, output_retries=-1)
        assert await s.transcript() == []
    assert issubclass(OutputInvalid, Exception)


# -- a SIGKILL, and a replay in another process --------------------------------------------

CHILD = """
import asyncio, pathlib, sys
from durable_turns import Agent, Runtime, SqliteStore, PostgresStore, Stop
from durable_turns import TextDelta

kind, url, marks = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
store = SqliteStore(url) if kind == "sqlite" else PostgresStore(url, lease_ttl=1.0)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

class Model:
    async def stream(self, request):
        n = sum(1 for m in request.messages if m.role == "assistant")
        if n == 1:  # the invalid answer and its error are stored: the test SIGKILLs us here
            (marks / "in-call-2").write_text("yes")
            await asyncio.sleep(120)
        yield TextDelta('{"n": "x"}')
        yield Stop("end_turn", {})

async def main():
    async with Runtime([Agent("ops", "")], store, Model()) as rt:
        await rt.session("ops", "s1").start("count", turn_id="t1", output=SCHEMA)
        await rt.session("ops", "s1").result("t1", timeout=60)

asyncio.run(main())
"""


class Refuses:
    """A model that must not be asked."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        raise AssertionError("the stored output was asked again")
        yield Stop("end_turn", {})  # pragma: no cover


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_the_output_survives_a_sigkill_and_a_replay_never_asks_again(
    kind: str, tmp_path: Path,
) -> None:
    from conftest import pg_schema_dsn

    url = str(tmp_path / "db.sqlite") if kind == "sqlite" else pg_schema_dsn()
    marks = tmp_path / "marks"
    marks.mkdir()

    def open_store() -> SessionStore:
        if kind == "sqlite":
            return SqliteStore(url)
        from durable_turns import PostgresStore

        return PostgresStore(url, lease_ttl=1.0)

    worker = subprocess.Popen([sys.executable, "-c", CHILD, kind, url, str(marks)])
    try:
        await wait_for_child_file(marks / "in-call-2", worker)
        worker.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(worker.wait, WAIT) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait(WAIT)
    model = Answers("unused", '{"n": 3}')
    async with Runtime([Agent("ops", "")], open_store(), model) as rt:
        await rt.recover()
        r = await asyncio.wait_for(rt.session("ops", "s1").result("t1"), WAIT)
        assert r.status == "completed" and r.output == {"n": 3}
        # One model call here, and the error handed back once, before the crash.
        assert len(model.requests) == 1 and len(handed_back(model.requests[0])) == 1
    # A third process: the stored output, no model call (Refuses would fail the turn).
    async with Runtime([Agent("ops", "")], open_store(), Refuses()) as rt:
        await rt.recover()
        s = rt.session("ops", "s1")
        again = await asyncio.wait_for(s.result("t1"), WAIT)
        assert again.status == "completed" and again.output == {"n": 3}
        assert json.loads(again.text or "") == {"n": 3}
