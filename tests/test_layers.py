"""The folder tree is the architecture: the engine imports no adapter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import durable_turns

PKG = Path(durable_turns.__file__).parent
CORE = ["errors", "messages", "events", "inbound", "tools", "agent", "engine", "sessions",
        "runtime",
        "models/__init__", "stores/__init__", "stores/_base"]
ADAPTERS = ("stores.memory", "stores.sqlite", "stores.postgres", "models.scripted",
            "models.anthropic_messages", "models.openai_compat", "server", "channels", "cli",
            "demo")
# sessions resolves a provider string ("anthropic:…") through models.resolve, lazily.
ALLOWED = {("runtime", "models.resolve")}


def _imports(module: str) -> set[str]:
    """What a module imports: everywhere for the engine, at module level for the seams
    (a seam package may resolve its adapters lazily, inside ``__getattr__``)."""
    tree = ast.parse((PKG / f"{module}.py").read_text())
    base = module.split("/")[:-1]
    nodes = ast.walk(tree) if module in ("engine", "sessions", "runtime") else iter(tree.body)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            parts = base[: len(base) - node.level + 1] if node.level else []
            name = ".".join([*parts, node.module or ""]).strip(".")
            found.add(name.removeprefix("durable_turns."))
            found.update(f"{name}.{a.name}".strip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("durable_turns.") for a in node.names)
    return found


def test_core_modules_import_no_adapter() -> None:
    bad = [
        (m, imp) for m in CORE for imp in _imports(m)
        if imp.startswith(ADAPTERS) and (m, imp) not in ALLOWED
    ]
    assert bad == []


def test_import_loads_no_sdk() -> None:
    code = (
        "import sys, durable_turns\n"
        "heavy = {'anthropic', 'openai', 'psycopg', 'starlette', 'uvicorn', 'slack_sdk'}\n"
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_all_is_sorted_and_complete() -> None:
    names = durable_turns.__all__
    assert names == sorted(names)
    for n in names:
        assert getattr(durable_turns, n) is not None
    public = {n for n in vars(durable_turns) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(durable_turns, n)).__name__ == "module"}
    assert public - modules - {"annotations"} == set(names)
