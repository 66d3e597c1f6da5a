"""F1 seams and stores: the public surface is deliberate. Every public module of the package
(one whose name, and whose packages' names, start with no underscore) says what it offers in
a sorted ``__all__``, and every name listed there exists; the public modules are exactly the
ones ``docs/reference/index.md`` lists under "The public modules". A folder (a package whose
``__init__`` holds only its docstring, like ``engine/``) is no module of the surface: it
holds private modules only."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import durable_turns

PACKAGE = Path(durable_turns.__file__).parent


def source_of(module: str) -> Path:
    path = PACKAGE.joinpath(*module.split(".")[1:])
    # server/_console.py is a module; server/console/ beside it holds its static files.
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"


def is_folder(module: str) -> bool:
    """A package whose ``__init__`` is its docstring alone: a room of private modules."""
    source = source_of(module)
    if source.name != "__init__.py" or module == "durable_turns":
        return False
    body = ast.parse(source.read_text()).body
    return len(body) == 1 and isinstance(body[0], ast.Expr) \
        and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)


def all_modules() -> list[str]:
    """The dotted names of every module of the package, found on disk (so a module nobody
    imports is not missed)."""
    return sorted(["durable_turns", *(info.name for info in pkgutil.walk_packages(
        [str(PACKAGE)], "durable_turns."))])


def public_modules() -> list[str]:
    """The package's public modules: no part of the name private, and no folder."""
    return [m for m in all_modules()
            if not any(part.startswith("_") for part in m.split(".")[1:]) and not is_folder(m)]


def sort_key(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 keeps: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def declared_all(module: str) -> list[str] | None:
    """The module's ``__all__`` as its source writes it (read without importing it: some
    modules need an extra's SDK)."""
    for node in ast.parse(source_of(module).read_text()).body:
        if isinstance(node, ast.Assign):
            targets, assigned = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, assigned = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = ast.literal_eval(assigned)
            assert isinstance(value, list | tuple), f"{module}.__all__ is not a list"
            return [str(n) for n in value]
    return None


MODULES = public_modules()
REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "index.md"


def listed_modules() -> set[str]:
    """The modules "The public modules" of the reference names: ``durable_turns.x`` and the
    submodules written after it as ``(`.a`, `.b`)``."""
    text = REFERENCE.read_text()
    section = text[text.index("## The public modules"):]
    found: set[str] = set()
    for item in re.split(r"^- ", section, flags=re.M)[1:]:
        item = " ".join(item.split())
        for m in re.finditer(r"`(durable_turns(?:\.\w+)*)`(?: \(([^)]*)\))?", item):
            found.add(m.group(1))
            for sub in re.findall(r"`(\.[\w.]+)`", m.group(2) or ""):
                found.add(m.group(1) + sub)
    return found


def test_the_walk_finds_the_modules_and_skips_the_private_ones() -> None:
    assert {"durable_turns.runtime", "durable_turns.stores.sql.schema",
            "durable_turns.server.run"} <= set(MODULES)
    assert "durable_turns.server._guard" in all_modules()
    assert not [m for m in MODULES if "._" in m]
    assert "durable_turns.engine" not in MODULES


def test_the_public_modules_are_exactly_the_documented_ones() -> None:
    listed = listed_modules()
    assert sorted(set(MODULES) - listed) == [], \
        "public modules the reference does not list: list each, or make it private (_name)"
    assert sorted(listed - set(MODULES)) == [], "the reference lists modules that are not public"


def test_a_folder_holds_private_modules_only() -> None:
    folders = [m for m in all_modules() if is_folder(m)]
    assert "durable_turns.engine" in folders
    public_inside = [m for m in all_modules() for f in folders
                     if m.startswith(f"{f}.") and not m.removeprefix(f"{f}.").startswith("_")]
    assert public_inside == [], f"a folder's modules are private: rename {public_inside}"


@pytest.mark.parametrize("module", MODULES)
def test_every_public_module_declares_a_sorted_all(module: str) -> None:
    names = declared_all(module)
    assert names is not None, f"{module} has no __all__: list what it offers (sorted)"
    assert len(set(names)) == len(names), f"{module}.__all__ lists a name twice"
    assert names, f"{module}.__all__ is empty"
    assert names == sorted(names, key=sort_key), f"{module}.__all__ is not sorted"


@pytest.mark.parametrize("module", MODULES)
def test_every_name_in_all_exists(module: str) -> None:
    names = declared_all(module) or []
    try:
        mod = importlib.import_module(module)
    except ImportError as e:  # an adapter whose extra is not installed here
        pytest.skip(f"{module} needs an extra: {e}")
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{module}.__all__ lists names it lacks: {missing}"
