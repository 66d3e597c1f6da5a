"""F11, F17: What the package promises outside its code: extras only for code that exists, and a
README
and documentation pages that point at nothing outside the repository."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "durable_turns"


def _top_level_imports() -> set[str]:
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


IMPORT_NAMES = {"opentelemetry_api": "opentelemetry", "ag_ui_protocol": "ag_ui",
                "workers_runtime_sdk": "workers", "microsoft_teams_api": "microsoft_teams",
                "pyjwt": "jwt"}
"""Distributions whose import name is not their own."""


def _distribution(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert name, requirement
    dist = name.group(0).lower().replace("-", "_")
    return IMPORT_NAMES.get(dist, dist)


def test_every_extra_installs_something_the_package_imports() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    imported = _top_level_imports()
    for extra, requirements in extras.items():
        if extra in ("dev", "docs"):
            continue  # the tests' and the documentation site's tools, not the package's
        unused = [r for r in requirements if _distribution(r) not in imported]
        assert not unused, f"extra [{extra}] installs {unused}, which no module imports"


EXAMPLES = (".venv/", "app/", "tools/", "site/", "myapp/")
"""Paths the pages make up or create: the virtualenv the first command builds, the example app
folder (``app/agent/``, its ``tools/``), the folder ``mkdocs build`` writes, and the one
``durable-turns new myapp`` writes."""

DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")
"""A Markdown link's or image's target: ``[text](target)``."""


def _check_paths(name: str, text: str) -> int:
    """Assert that every path ``text`` mentions is the repository's; return how many."""
    assert "../" not in text, f"{name} refers to a path outside the repository"
    # (after an "@": an npm package's scope, not a path)
    paths = set(re.findall(r"(?<![\w/.:~@-])((?:\.?[\w-]+/)(?:[\w.-]+/?)*)", text))
    checked = 0
    for path in sorted(paths):
        if re.fullmatch(r"[\dx/]+|[A-Z]+/[A-Z]+|(text|application)/[\w.+-]+", path) \
                or path.startswith(EXAMPLES):
            continue  # 408/429/5xx …, HTTP/SSE, media types: not paths
        # the repository's files, or the package's (as "How it is built" lists them)
        assert (ROOT / path).exists() or (SRC / path).exists(), \
            f"{name} mentions {path}, which is not in the repository"
        checked += 1
    return checked


def test_the_readme_points_only_inside_the_repository() -> None:
    assert _check_paths("README.md", (ROOT / "README.md").read_text()) >= 5


def test_the_docs_point_only_inside_the_repository() -> None:
    """A page's links lead to pages or files of the site (mkdocs build --strict checks them too,
    but only where it builds); the paths its text names are the repository's, as the README's."""
    checked = 0
    for page in sorted(DOCS.rglob("*.md")):
        name = str(page.relative_to(ROOT))
        text = page.read_text()
        for target in LINK.findall(text):
            assert not re.match(r"[a-z]+:", target), f"{name} links outside the site: {target}"
            file = target.split("#")[0]
            assert not file or ((page.parent / file).resolve().is_relative_to(DOCS) \
                and (page.parent / file).exists()), f"{name} links to {target}, which is not a page"
        checked += _check_paths(name, LINK.sub("]", text))
    assert checked >= 20
