"""F27: ``examples/cloudflare`` as deployed: its ``wrangler.jsonc`` binds the Durable Object class
its Worker exports, with the SQLite migration; its agent object, in CPython on the fake of
``ctx.storage``, keeps a note through the Worker's route, exactly once, behind its token."""

from __future__ import annotations

import ast
import importlib
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from durable_turns.cloudflare import ObjectRequest, Reply, forward
from durable_turns.cloudflare.testing import ObjectNamespace

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cloudflare"


def _config() -> dict[str, object]:
    text = re.sub(r"^\s*//.*$", "", (EXAMPLE / "wrangler.jsonc").read_text(), flags=re.M)
    found: dict[str, object] = json.loads(text)
    return found


def test_wrangler_binds_the_class_the_worker_exports() -> None:
    config = _config()
    entry = EXAMPLE / str(config["main"])
    tree = ast.parse(entry.read_text())
    exported = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", "") == "__all__" for t in n.targets))
    binding = config["durable_objects"]["bindings"][0]  # type: ignore[index]
    assert binding["class_name"] in exported
    assert config["migrations"][0]["new_sqlite_classes"] == [binding["class_name"]]  # type: ignore[index]
    assert "python_workers" in config["compatibility_flags"]  # type: ignore[operator]


async def test_the_example_object_keeps_a_note_behind_its_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.delitem(sys.modules, "notes", raising=False)
    notes = importlib.import_module("notes")  # the example's module, from its folder

    agents = ObjectNamespace(notes.Notes, SimpleNamespace(API_TOKEN="s3cret", MODEL="scripted"),
                             folder=tmp_path)
    url = "https://notes.example/agents/notes/sessions/s1/chat"
    body = json.dumps({"text": 'remember {"note": "milk"}'})
    json_type = {"content-type": "application/json"}
    refused = await forward(ObjectRequest("POST", url, body, json_type), agents)
    assert isinstance(refused, Reply) and refused.status == 401
    kept = await forward(ObjectRequest("POST", url, body, {
        **json_type, "authorization": "Bearer s3cret"}), agents)
    assert isinstance(kept, Reply)
    result = await kept.json()
    assert result["status"] == "completed" and "1 notes so far" in result["text"], result
    sql = agents.storage("notes/s1").sql
    assert sql.exec("SELECT note FROM notes").raw().toArray() == [["milk"]]
