"""The folder tree is the architecture: the engine imports no adapter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import durable_turns

PKG = Path(durable_turns.__file__).parent
CORE = ["errors", "messages", "records", "events", "inbound", "tools", "agent", "hitl",
        "engine", "driver", "runtime", "sessions", "batch", "subagents", "tracing",
        "models/__init__", "stores/__init__", "stores/_base", "stores/_feed", "stores/_sql",
        "stores/_log"]
ADAPTERS = ("stores.memory", "stores.sqlite", "stores.postgres", "models.scripted",
            "models.anthropic_messages", "models.openai_compat", "models.resolve", "server",
            "channels", "loader", "cli", "demo", "mcp")
RECORDS = ["errors", "messages", "records", "events", "inbound"]
ENGINE = ("engine", "driver", "runtime", "sessions", "batch", "subagents")


def _imports(module: str) -> set[str]:
    """What a module imports: everywhere for the engine, at module level for the seams
    (a seam package may resolve its adapters lazily, inside ``__getattr__``)."""
    tree = ast.parse((PKG / f"{module}.py").read_text())
    base = module.split("/")[:-1]
    nodes = ast.walk(tree) if module in ENGINE else iter(tree.body)
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
    bad = [(m, imp) for m in CORE for imp in _imports(m) if imp.startswith(ADAPTERS)]
    assert bad == []


def test_records_import_nothing_above_them() -> None:
    allowed = {"", *RECORDS}
    bad = [(m, imp) for m in RECORDS for imp in _imports(m)
           if imp.split(".")[0] not in allowed and imp in _package_modules()]
    assert bad == []


def _package_modules() -> set[str]:
    return {str(p.relative_to(PKG).with_suffix("")).replace("/", ".").removesuffix(".__init__")
            for p in PKG.rglob("*.py")}


def _runtime_imports(module: str) -> set[str]:
    """What a module imports when it runs (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse((PKG / f"{module}.py").read_text())
    base = module.split("/")[:-1]
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        parts = base[: len(base) - node.level + 1]
        found.add(".".join([*parts, node.module or ""]).strip("."))
    return found & _package_modules()


def test_no_import_cycles() -> None:
    def source(m: str) -> str:
        path = m.replace(".", "/")
        return path if (PKG / f"{path}.py").exists() else f"{path}/__init__"

    graph = {m: _runtime_imports(source(m)) for m in _package_modules()}
    seen: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        if seen.get(m) == 1:
            cycles.append([*path[path.index(m):], m])
            return
        if seen.get(m) == 2:
            return
        seen[m] = 1
        for dep in sorted(graph.get(m, ())):
            # A package's __init__ importing its own submodules is how packages work.
            if dep != m and not (m and dep.startswith(f"{m}.")):
                visit(dep, [*path, m])
        seen[m] = 2

    for m in sorted(graph):
        visit(m, [])
    assert cycles == []


def test_no_module_reaches_into_another_modules_private_names() -> None:
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        own: set[str] = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(n.name)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                own.add(n.attr)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                own.add(n.id)
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") \
                    and not n.attr.startswith("__") and n.attr not in own:
                if isinstance(n.value, ast.Name) and n.value.id == "os" and n.attr == "_exit":
                    continue  # os._exit is a documented public function
                bad.append(f"{path.relative_to(PKG)}:{n.lineno}: .{n.attr}")
            if isinstance(n, ast.ImportFrom):
                bad += [f"{path.relative_to(PKG)}:{n.lineno}: import {a.name}"
                        for a in n.names if a.name.startswith("_") and a.name != "__version__"]
    assert bad == []


def test_import_loads_no_sdk() -> None:
    code = (
        "import sys, durable_turns\n"
        "heavy = {'anthropic', 'openai', 'psycopg', 'starlette', 'uvicorn', 'slack_sdk', 'mcp',"
        " 'opentelemetry'}\n"
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
