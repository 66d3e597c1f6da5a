"""Provider strings and the lazy adapter names of ``durable_turns.models`` (F11)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import durable_turns.models as models
from durable_turns import Agent, MemoryStore, Runtime, ToolContext, tool
from durable_turns.errors import ConfigurationError
from durable_turns.models import Model
from durable_turns.models.anthropic_messages import AnthropicModel
from durable_turns.models.openai_compat import OpenAICompatibleModel
from durable_turns.models.resolve import resolve_model
from durable_turns.models.scripted import ModelReply, scripted
from fakes import clear_provider_env


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clear_provider_env(monkeypatch, tmp_path)


def test_provider_strings_name_the_adapters() -> None:
    a = resolve_model("anthropic:claude-test", api_key="k", thinking=True)
    assert isinstance(a, AnthropicModel)
    assert (a.model, a.thinking) == ("claude-test", {"type": "adaptive"})
    o = resolve_model("openai:gpt-test", api_key="k")
    assert isinstance(o, OpenAICompatibleModel) and o.model == "gpt-test"
    local = resolve_model("openai:llama3.1:8b", base_url="http://127.0.0.1:11434/v1")
    assert isinstance(local, OpenAICompatibleModel) and local.model == "llama3.1:8b"


def test_credentials_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    model = resolve_model("anthropic:claude-test")
    assert isinstance(model, AnthropicModel) and model.client.api_key == "sk-env"
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        resolve_model("openai:gpt-4o")


def test_a_model_object_is_returned_as_it_is() -> None:
    model: Model = scripted([ModelReply("hi")])
    assert resolve_model(model) is model


@pytest.mark.parametrize("spec", ["claude-test", "anthropic:", ":gpt-4o", ""])
def test_malformed_strings_are_refused(spec: str) -> None:
    with pytest.raises(ConfigurationError, match="expected 'scripted' or 'test' \\(offline\\) or "
                                                 "'<provider>:<model>'"):
        resolve_model(spec)


def test_an_unknown_provider_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="unknown provider 'gemini'; known: anthropic, "
                                                 "openai"):
        resolve_model("gemini:pro")


@pytest.mark.parametrize(("spec", "sdk", "module", "extra"), [
    ("anthropic:claude-test", "anthropic", "durable_turns.models.anthropic_messages", "anthropic"),
    ("openai:gpt-test", "openai", "durable_turns.models.openai_compat", "openai"),
])
def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch, spec: str, sdk: str,
                                       module: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, sdk, None)  # what an uninstalled package looks like
    monkeypatch.delitem(sys.modules, module)
    monkeypatch.delattr(models, module.rsplit(".", 1)[1], raising=False)
    with pytest.raises(ConfigurationError,
                       match=rf"needs the {extra} SDK: pip install 'durable-turns\[{extra}\]'"):
        resolve_model(spec, api_key="k")


def test_models_anthropic_is_the_factory_whatever_was_imported_first() -> None:
    # The adapter lives in models/anthropic_messages.py, so no submodule shadows the
    # package's lazy `anthropic` factory, whatever was imported first.
    assert isinstance(models.anthropic("claude-test", api_key="k"), AnthropicModel)
    from durable_turns.models import anthropic, openai_compatible

    assert isinstance(anthropic("claude-test", api_key="k"), AnthropicModel)
    assert isinstance(openai_compatible("gpt-test", api_key="k"), OpenAICompatibleModel)


def test_import_durable_turns_imports_no_sdk() -> None:
    code = ("import sys, durable_turns, durable_turns.models; "
            "print(sorted(m for m in ('anthropic', 'openai', 'httpx2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


@tool
async def order_status(order_id: str) -> dict[str, Any]:
    """Where an order is."""
    return {"order_id": order_id, "state": "packed"}


@tool
async def approve(ctx: ToolContext) -> dict[str, Any]:
    """Ask a person."""
    return {"ok": await ctx.request_input("ok", "OK?", schema={"type": "boolean"})}


@pytest.mark.parametrize("spec", ["scripted", " Scripted "])
async def test_scripted_is_the_offline_model_that_calls_tools_by_name(spec: str) -> None:
    agent = Agent("desk", "You help.", [order_status, approve])
    async with Runtime([agent], MemoryStore(), resolve_model(spec)) as rt:
        s = rt.session("desk", "s1")
        done = await s.turn('order_status {"order_id": "A-12"}')
        assert done.text == 'order_status answered: {"order_id": "A-12", "state": "packed"}'
        prose = await s.turn("where is my order?")
        assert prose.text is not None and prose.text.startswith('You said "where is my order?". ')
        assert 'order_status {"order_id": "…"}' in prose.text
        assert "This agent's tools: order_status, approve." in prose.text
        bad = await s.turn("order_status {not json}")  # not a call: it says how to make one
        assert bad.text is not None and "offline model" in bad.text
        started = await s.start("approve")
        parked = await s.result(started.turn_id)
        assert parked.status == "suspended" and parked.request is not None
        await s.resume(started.turn_id, "ok", True)
        assert (await s.result(started.turn_id)).text == 'approve answered: {"ok": true}'
