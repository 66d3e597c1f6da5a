"""F25 structured output through the model adapters: a turn's output schema goes as the
provider's own structured output — Anthropic's ``output_config.format``, OpenAI's
``response_format`` ``json_schema`` — and the system prompt stays the agent's; the answer is
still validated against the schema as given (an answer the provider let through goes back
with its error); ``structured_output=False`` asks for it in the system prompt instead; the
validated value is stored with the turn's end and a new runtime reads it without a model
call.

Against the fake Anthropic and OpenAI servers on loopback (``tests/fakes``), the official
SDKs' ``base_url`` pointed at them; the fakes answer 400 to what the real APIs refuse (an
object without ``additionalProperties: false`` or a numeric bound in Anthropic's schema, a
bad ``response_format`` name or a strict schema that is not closed).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from durable_turns import Agent, Runtime, SqliteStore, tool
from durable_turns.models.anthropic_messages import anthropic
from durable_turns.models.openai_compat import openai_compatible
from fakes import clear_provider_env
from fakes.anthropic_api import Reply, Text, ToolUse, anthropic_app
from fakes.openai_api import Call, Completion, openai_app
from fakes.serving import serving

WAIT = 30.0
"""The bound on every wait: a backstop against a hang, not a timing claim."""


class Triage(BaseModel):
    severity: Literal["low", "high"]
    team: str
    priority: int = Field(ge=1, le=5)


@tool
def owner(service: str) -> str:
    """Who owns a service."""
    return "db-team"


def agent() -> Agent:
    return Agent("ops", "Triage.", [owner], model_retries=0)


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clear_provider_env(monkeypatch, tmp_path / "home")


def answer(**value: Any) -> str:
    return json.dumps(value)


async def test_anthropic_sends_the_schema_as_output_config_and_validates_it_as_given(
    tmp_path: Path,
) -> None:
    app = anthropic_app([
        Reply([ToolUse("owner", {"service": "db"})]),
        # Within the schema Anthropic was sent (its bound moved into a description), not
        # within the one given: it goes back.
        Reply([Text(answer(severity="high", team="db-team", priority=9))]),
        Reply([Text(answer(severity="high", team="db-team", priority=2))]),
    ])
    db = tmp_path / "s.sqlite"
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0)
        async with Runtime([agent()], SqliteStore(db), model) as rt:
            s = rt.session("ops", "s1")
            r = await asyncio.wait_for(s.turn("the db is down", output=Triage, turn_id="t1"),
                                       WAIT)
        await model.aclose()
        assert r.status == "completed", r.error
        assert r.output == Triage(severity="high", team="db-team", priority=2)
        bodies = [q["body"] for q in app.state.requests]
        assert len(bodies) == 3
        for body in bodies:
            fmt = body["output_config"]["format"]
            assert fmt["type"] == "json_schema"
            assert fmt["schema"]["additionalProperties"] is False
            assert set(fmt["schema"]["properties"]) == {"severity", "team", "priority"}
            assert "minimum" not in fmt["schema"]["properties"]["priority"]
            assert body["system"] == "Triage."  # no schema in the prompt
            assert [t["name"] for t in body["tools"]] == ["owner"]
        handed_back = bodies[2]["messages"][-1]["content"][0]["text"]
        assert "at priority: 9 is greater than the maximum of 5" in handed_back
        # Another runtime on the same file reads the stored value; the fake's script is
        # spent, so a model call would fail the read.
        again_model = anthropic("claude-test", api_key="sk-test", base_url=url,
                                max_retries=0)
        async with Runtime([agent()], SqliteStore(db), again_model) as rt:
            await rt.recover()
            again = await asyncio.wait_for(rt.session("ops", "s1").result("t1"), WAIT)
        await again_model.aclose()
        assert again.output == {"severity": "high", "team": "db-team", "priority": 2}
        assert len(app.state.requests) == 3


async def test_openai_sends_the_schema_as_response_format(tmp_path: Path) -> None:
    app = openai_app([
        Completion(calls=[Call("owner", {"service": "db"})]),
        Completion(text=answer(severity="low", team="db-team", priority=1)),
    ])
    async with serving(app) as url:
        model = openai_compatible("gpt-test", base_url=f"{url}/v1", max_retries=0)
        async with Runtime([agent()], SqliteStore(tmp_path / "s.sqlite"), model) as rt:
            r = await asyncio.wait_for(
                rt.session("ops", "s1").turn("the db is slow", output=Triage), WAIT)
        await model.aclose()
    assert r.status == "completed", r.error
    assert r.output == Triage(severity="low", team="db-team", priority=1)
    bodies = [q["body"] for q in app.state.requests]
    assert len(bodies) == 2
    for body in bodies:
        assert body["response_format"] == {"type": "json_schema", "json_schema": {
            "name": "Triage", "schema": Triage.model_json_schema(), "strict": False}}
        assert body["messages"][0] == {"role": "system", "content": "Triage."}


async def test_a_plain_json_schema_keeps_its_name_within_the_apis_rules(tmp_path: Path) -> None:
    schema = {"title": "a count!", "type": "object",
              "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    app = openai_app([Completion(text='{"n": "x"}'), Completion(text='{"n": 4}')])
    async with serving(app) as url:
        model = openai_compatible("gpt-test", base_url=f"{url}/v1", max_retries=0)
        async with Runtime([agent()], SqliteStore(tmp_path / "s.sqlite"), model) as rt:
            r = await asyncio.wait_for(rt.session("ops", "s1").turn("count", output=schema),
                                       WAIT)
        await model.aclose()
    assert (r.status, r.output) == ("completed", {"n": 4})
    names = [q["body"]["response_format"]["json_schema"]["name"] for q in app.state.requests]
    assert names == ["a_count_", "a_count_"]
    assert "at n: 'x' is not of type 'integer'" in app.state.requests[1]["body"][
        "messages"][-1]["content"]


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_structured_output_false_asks_in_the_system_prompt(
    provider: str, tmp_path: Path,
) -> None:
    value = answer(severity="high", team="web", priority=3)
    app = (anthropic_app([Reply([Text(value)])]) if provider == "anthropic"
           else openai_app([Completion(text=value)]))
    async with serving(app) as url:
        model: Any = (
            anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0,
                      structured_output=False) if provider == "anthropic" else
            openai_compatible("gpt-test", base_url=f"{url}/v1", max_retries=0,
                              structured_output=False))
        async with Runtime([agent()], SqliteStore(tmp_path / "s.sqlite"), model) as rt:
            r = await asyncio.wait_for(rt.session("ops", "s1").turn("web", output=Triage),
                                       WAIT)
        await model.aclose()
    assert r.output == Triage(severity="high", team="web", priority=3)
    [request] = app.state.requests
    body = request["body"]
    assert "output_config" not in body and "response_format" not in body
    system = body["system"] if provider == "anthropic" else body["messages"][0]["content"]
    assert system.startswith("Triage.\n\n") and '"priority"' in system


async def test_a_schema_anthropic_cannot_take_fails_the_turn_saying_what_to_do(
    tmp_path: Path,
) -> None:
    app = anthropic_app([Reply([Text("{}")])])
    async with serving(app) as url:
        model = anthropic("claude-test", api_key="sk-test", base_url=url, max_retries=0)
        async with Runtime([agent()], SqliteStore(tmp_path / "s.sqlite"), model) as rt:
            r = await asyncio.wait_for(rt.session("ops", "s1").turn("x", output={}), WAIT)
        await model.aclose()
    assert r.status == "failed" and r.error is not None
    assert "structured_output=False" in r.error
    assert app.state.requests == []  # refused before anything was sent
