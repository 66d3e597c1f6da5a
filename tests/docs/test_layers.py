"""F1: The folder tree is the architecture: every import edge follows ``durable_turns.layers``.

An edge is any import of a package module by another: at module level, inside a function,
under ``if TYPE_CHECKING:``, relative or absolute. ``from x import y`` is an edge to ``x.y``
when ``y`` is a submodule, and to ``x`` when it is not (a name ``x`` defines).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from functools import cache
from itertools import zip_longest
from pathlib import Path

import pytest

import durable_turns
from durable_turns.layers import LAYERS, Layer, layer_of

PKG = Path(durable_turns.__file__).parent
README = Path(__file__).resolve().parents[2] / "README.md"
TOP = "__init__"
"""The package itself (``durable_turns/__init__.py``), as the table names it."""


@cache
def modules() -> dict[str, Path]:
    """Every module of the package, by its name relative to the package."""
    found: dict[str, Path] = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        found[".".join(parts)] = path
    return found


def _target(name: str) -> str:
    """``durable_turns.x.y`` (``durable_turns``: the package) as the table names it."""
    return name.removeprefix("durable_turns").removeprefix(".") or TOP


def _edges_of(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [_target(a.name) for a in node.names
                if a.name.split(".")[0] == "durable_turns"]
    if node.level:
        package = [] if module == TOP else module.split(".")
        if modules()[module].name != "__init__.py":
            package = package[:-1]
        base = package[: len(package) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    elif node.module and node.module.split(".")[0] == "durable_turns":
        source = node.module.removeprefix("durable_turns").removeprefix(".")
    else:
        return []
    source = source or TOP
    prefix = "" if source == TOP else f"{source}."
    submodules = [f"{prefix}{a.name}" for a in node.names if f"{prefix}{a.name}" in modules()]
    # ``from . import scripted`` imports the submodule; ``from . import Model`` the package.
    names_only_submodules = len(submodules) == len(node.names)
    return submodules if names_only_submodules else [source, *submodules]


@cache
def imports() -> dict[str, dict[str, list[str]]]:
    """module → imported module → where (``path:line``), every import edge of the package."""
    graph: dict[str, dict[str, list[str]]] = {}
    for module, path in modules().items():
        edges: dict[str, list[str]] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for dep in _edges_of(module, node):
                    assert dep in modules(), \
                        f"{path.relative_to(PKG)}:{node.lineno} imports {dep}, not a module"
                    if dep != module:
                        edges.setdefault(dep, []).append(f"{path.relative_to(PKG)}:{node.lineno}")
        graph[module] = edges
    return graph


def _rank(module: str) -> int:
    layer = layer_of(module)
    assert layer is not None, f"{module} is in no layer: add it to durable_turns/layers.py"
    return LAYERS.index(layer)


def test_every_module_is_in_one_layer_and_every_listed_name_exists() -> None:
    listed = [m for layer in LAYERS for m in layer.modules]
    assert sorted(m for m in set(listed) if listed.count(m) > 1) == [], "listed twice"
    unplaced = [m for m in modules() if layer_of(m) is None]
    assert unplaced == [], f"modules in no layer (add each to durable_turns/layers.py): {unplaced}"
    stale = [m for m in listed if m not in modules()]
    assert stale == [], f"durable_turns/layers.py lists modules that do not exist: {stale}"


KNOWN: dict[str, str] = {}
"""Modules that import above their layer today, each with the edge and what removes it."""


def _module_params() -> list[object]:
    return [pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=KNOWN[m]))
            if m in KNOWN else m for m in sorted(modules())]


@pytest.mark.parametrize("module", _module_params())
def test_imports_only_its_own_layer_and_below(module: str) -> None:
    rank = _rank(module)
    up = [f"{where}: {module} ({LAYERS[rank].name}) imports {dep} ({LAYERS[_rank(dep)].name})"
          for dep, wheres in sorted(imports()[module].items()) for where in wheres
          if _rank(dep) > rank]
    assert up == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _graph(*, type_checking: bool) -> dict[str, set[str]]:
    # An edge into the package itself is a re-export, not a dependency between layers.
    graph = {m: {d for d in deps if d != TOP} for m, deps in imports().items()}
    if not type_checking:
        for module, path in modules().items():
            graph[module] -= _type_checking_only(module, path)
    return graph


def _type_checking_only(module: str, path: Path) -> set[str]:
    """What a module imports only under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                branch = node.body
            elif test in ("not TYPE_CHECKING", "not typing.TYPE_CHECKING"):
                branch = node.orelse
            else:
                continue
            guarded.update(id(n) for stmt in branch for n in ast.walk(stmt))
    hidden: set[str] = set()
    seen: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            (hidden if id(node) in guarded else seen).update(_edges_of(module, node))
    return hidden - seen


def test_no_import_cycle() -> None:
    # Every import counts: module level, in functions, under TYPE_CHECKING (a circle through
    # type hints is still a circle for the reader).
    _assert_no_cycle(_graph(type_checking=True))


def _assert_no_cycle(graph: dict[str, set[str]]) -> None:
    cycles = _cycles(graph)
    report = [f"cycle of {len(c)}: " + "; ".join(
        f"{m} -> {d} ({', '.join(imports()[m][d])})"
        for m in c for d in sorted(graph[m]) if d in c) for c in cycles]
    assert cycles == [], "\n".join(report)


def render(layers: tuple[Layer, ...]) -> str:
    """The README's "How it is built" block: one row per layer, bottom first."""
    rows = [f"{'layer':<13}{'modules (in src/durable_turns/)':<42}what they are"]
    for layer in layers:
        names = textwrap.wrap(" ".join(layer.modules), 40)
        what = textwrap.wrap(layer.description, 45)
        for i, (m, w) in enumerate(zip_longest(names, what, fillvalue="")):
            rows.append(f"{layer.name if i == 0 else '':<13}{m:<42}{w}".rstrip())
    return "\n".join(rows) + "\n"


def test_the_readme_shows_the_layers_as_declared() -> None:
    text = README.read_text()
    section = text[text.index("## How it is built"):]
    block = re.search(r"^```\n(.*?)^```$", section, re.S | re.M)
    assert block is not None, "README's 'How it is built' has no code block"
    expected = render(LAYERS)
    assert block.group(1) == expected, \
        f"README's 'How it is built' block should read (from durable_turns/layers.py):\n{expected}"


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
    submodules = {n for n in public if type(getattr(durable_turns, n)).__name__ == "module"}
    assert public - submodules - {"annotations"} == set(names)
