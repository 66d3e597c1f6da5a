"""F12 and F8's chain: a command added as an outsider adds one — one module
(``note_command.py``) and its one registration (``COMMANDS.with_(SPEC)``), nothing else
touched — is reached over HTTP, in the CLI and in the OpenAPI document, authorized by its own
action, applied at its place in the chain (behind the turn that ran when it came), and
refused while a turn is parked as it declares (unless a reset, which clears the park, is
queued before it); an outsider's joining command (``hint_command.py``, F25) joins the running
turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    SqliteStore,
    Stop,
    TextDelta,
    ToolCall,
    ToolContext,
    tool,
)
from durable_turns.cli import main
from durable_turns.commands import COMMANDS, Reset
from durable_turns.errors import ConfigurationError, SessionBusyError
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.models.scripted import scripted
from durable_turns.scheduling import NoDriveScheduler
from durable_turns.server import create_app
from fakes.serving import serving
from note_command import REGISTRY, Note

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""


class GatedModel:
    """Answers once the test opens the gate, so a turn is running when the note comes."""

    def __init__(self) -> None:
        self.streaming = asyncio.Event()
        self.gate = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield TextDelta("thinking")
        self.streaming.set()
        await self.gate.wait()
        yield Stop("end_turn")


def authenticate(request: Any) -> Mapping[str, str] | None:
    who = request.headers.get("x-user")
    return None if who is None else {"id": who}


asked: list[tuple[str | None, str]] = []


def authorize(principal: Any, action: str, session: Any) -> bool:
    asked.append((principal["id"], action))
    return not (action == "note" and principal["id"] == "mallory")


async def test_a_registered_command_is_served_authorized_and_applied_at_its_place() -> None:
    asked.clear()
    model = GatedModel()
    async with Runtime([Agent("ops")], MemoryStore(), model, commands=REGISTRY) as rt:
        app = create_app(rt, authenticate, authorize=authorize)
        base = "/agents/ops/sessions/s1"
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            doc = (await c.get("/openapi.json", headers={"x-user": "alice"})).json()
            route = doc["paths"]["/agents/{agent}/sessions/{session}/note"]["post"]
            assert route["requestBody"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/NoteBody"}
            assert doc["components"]["schemas"]["NoteBody"]["required"] == ["text"]

            s = rt.session("ops", "s1")
            t = await s.start("first", turn_id="t1")
            await asyncio.wait_for(model.streaming.wait(), WAIT)
            refused = await c.post(f"{base}/note", json={"text": "no"},
                                   headers={"x-user": "mallory"})
            assert refused.status_code == 403
            assert (await c.post(f"{base}/note", json={"text": ""},
                                 headers={"x-user": "alice"})).status_code == 400
            r = await c.post(f"{base}/note", json={"text": "after t1"},
                             headers={"x-user": "alice"})
            assert r.status_code == 200, r.text
            note_id = r.json()["note"]
            assert ("alice", "note") in asked and ("mallory", "note") in asked
            # Queued behind the running turn: not applied while it runs.
            assert (await s.entry(note_id)).status == "queued"  # type: ignore[union-attr]
            model.gate.set()
            assert (await asyncio.wait_for(s.result(t.turn_id), WAIT)).status == "completed"
            done = await asyncio.wait_for(s.result(note_id), WAIT)
            assert (done.status, done.text) == ("completed", "after t1")
            entry = await s.entry(note_id)
            assert entry is not None and entry.data is not None
            # At its place: after the turn before it (its opening and its reply).
            assert entry.data["note"] == {"text": "after t1", "after": 2}
            assert [e.kind for e in await s.chain()] == ["turn", "note"]


def test_a_registered_command_is_a_verb_of_the_cli(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "db.sqlite"

    async def first_turn() -> None:
        async with Runtime([Agent("ops")], SqliteStore(db), scripted([ModelReply("hi")])) as rt:
            await rt.session("ops", "s1").turn("hello")

    asyncio.run(first_turn())
    code = main(["sessions", "note", "ops/s1", "--db", str(db), "--text", "from the cli"],
                commands=REGISTRY)
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("noted as note:")
    note_id = out.split()[-1]

    async def read() -> Any:
        async with Runtime([Agent("ops")], SqliteStore(db), scheduler=NoDriveScheduler(),
                           commands=REGISTRY) as rt:
            return await rt.session("ops", "s1").entry(note_id)

    entry = asyncio.run(read())
    assert entry.status == "completed"
    assert entry.data["note"] == {"text": "from the cli", "after": 2}
    # Without the registration the CLI has no such verb.
    with pytest.raises(SystemExit):
        main(["sessions", "note", "ops/s1", "--db", str(db), "--text", "x"], commands=COMMANDS)


async def test_a_command_the_runtime_did_not_register_is_refused() -> None:
    async with Runtime([Agent("ops")], MemoryStore(), scripted([])) as rt:
        with pytest.raises(ConfigurationError, match="no command of kind 'note'"):
            await rt.session("ops", "s1").send(Note("x"))


@tool
async def approve(ctx: ToolContext) -> bool:
    """Ask a person."""
    return bool(await ctx.request_input("ok", "Go on?", schema={"type": "boolean"}))


async def test_a_command_that_declares_it_is_refused_while_a_turn_is_parked() -> None:
    """The rule is the command's own (``while_parked="refused"`` in its entry): the store
    applies it as it applies a turn's, and a queued reset clears the park for it as for a
    turn."""
    replies = [ModelReply("", [ToolCall("c1", "approve", {})])]
    async with Runtime([Agent("ops", tools=[approve])], MemoryStore(), scripted(replies),
                       commands=REGISTRY) as rt:
        s = rt.session("ops", "s1")
        parked = await s.start("ask first")
        assert (await asyncio.wait_for(s.result(parked.turn_id), WAIT)).status == "suspended"
        with pytest.raises(SessionBusyError, match=parked.turn_id):
            await s.send(Note("while parked"))
        store = rt.store
        before = [e.turn_id for e in await store.entries(s.key)]
        assert before == [parked.turn_id]  # nothing of the note was kept
        # A reset queued before it (not woken yet) clears the park: the note queues behind it.
        await store.enqueue(s.key, Reset().entry())
        note = Note("after the reset")
        await s.send(note)
        done = await asyncio.wait_for(s.result(note.entry_id), WAIT)
        assert done.status == "completed"
        assert (await s.result(parked.turn_id)).reason == "reset"


async def test_an_outsiders_joining_command_joins_the_running_turn() -> None:
    """F25's seam: ``hint_command.py`` (one module, one registration) joins the running turn
    at its next model-call boundary; with no turn running it applies at its place."""
    from durable_turns import ToolCall, tool
    from hint_command import REGISTRY as HINTS
    from hint_command import Hint

    gate = asyncio.Event()

    @tool
    async def wait() -> str:
        """Hold the turn until the test lets it go."""
        await asyncio.wait_for(gate.wait(), WAIT)
        return "waited"

    class Model:
        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
            if len(request.messages) == 1:
                yield ToolCall("c1", "wait", {})
                yield Stop("tool_use")
                return
            yield TextDelta(request.messages[-1].text)
            yield Stop("end_turn")

    async with Runtime([Agent("ops", "", [wait])], MemoryStore(), Model(),
                       commands=HINTS) as rt:
        s = rt.session("ops", "s1")
        t = await s.start("go")
        with rt.joining(s.key):
            hint = Hint("be brief")
            await s.send(hint)
        gate.set()
        assert (await asyncio.wait_for(s.result(t.turn_id), WAIT)).text == "(hint) be brief"
        assert (await s.result(hint.entry_id)).turn_id == t.turn_id  # it followed the join
        late = Hint("too late")
        await s.send(late)
        assert (await asyncio.wait_for(s.result(late.entry_id), WAIT)).text == "unused"
        assert [m.text for m in await s.transcript() if m.role == "user"] == [
            "go", "(hint) be brief"]
