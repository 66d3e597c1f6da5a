"""F1 to F29: the tests are found by area and by feature. Each test module sits in the folder of
its area (engine, stores, server, …), and its docstring names the features (``F7``) it holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
AREAS = {"channels", "cli", "cloudflare", "commands", "docs", "engine", "models", "scheduling",
         "server", "stores", "temporal"}


def test_every_test_module_sits_in_the_folder_of_its_area() -> None:
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    folders = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert folders <= AREAS, f"test folders no area names: {sorted(folders - AREAS)}"


def test_every_test_module_names_the_features_it_holds() -> None:
    unnamed = []
    for path in sorted(TESTS.glob("*/test_*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if not re.search(r"\bF\d+\b", doc):
            unnamed.append(str(path.relative_to(TESTS)))
    assert unnamed == [], f"test modules whose docstring names no feature (F1…): {unnamed}"


def test_test_module_names_are_unique() -> None:
    # Test folders have no __init__.py: pytest imports each module by its basename.
    names = [p.name for p in TESTS.rglob("test_*.py") if "node_modules" not in p.parts]
    assert len(names) == len(set(names))
