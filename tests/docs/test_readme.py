"""F12: The examples of README.md and of the documentation's pages (docs/**/*.md) run as written.

Every ```python block runs in a fresh interpreter, in a temporary directory that holds only
a copy of the repository's ``examples/`` (the README's commands run from a checkout's root),
with no ``ANTHROPIC_*``/``OPENAI_*`` variables, and must exit 0. A ```bash block whose first line
starts with ``durable-turns`` runs the same way (in bash, with this interpreter's scripts on
``PATH``); other shell blocks (installing, a console transcript) are not run. A block that is
a fragment on purpose is preceded by ``<!-- not-run: why -->``; it is still compiled.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import pg_schema_dsn

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
"""The README and every page of the documentation site: their examples are run alike."""
TIMEOUT = 120
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    """The file, relative to the repository's root."""
    lang: str
    code: str
    line: int
    """The line of the opening fence (1-based)."""
    not_run: str | None
    """The reason given by a ``<!-- not-run: … -->`` right before the block."""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.lang or 'text'}-line{self.line}"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str, text: str) -> list[Block]:
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page}:{start + 1}: a code block is never closed"
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.fullmatch(before.strip())
        found.append(Block(page, m.group(1), "\n".join(lines[start + 1:end]) + "\n", start + 1,
                           marker.group(1) if marker else None))
        i = end + 1
    return found


ALL = [b for path in PAGES for b in blocks(str(path.relative_to(ROOT)), path.read_text())]
PYTHON = [b for b in ALL if b.lang == "python"]
COMMANDS = [b for b in ALL if b.lang == "bash" and b.code.startswith("durable-turns")]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "OPENAI_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run(argv: list[str], tmp_path: Path,
        extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return subprocess.run(argv, cwd=tmp_path, env={**clean_env(), **(extra_env or {})},
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


def test_the_readme_has_examples_and_marks_them_properly() -> None:
    assert len(PYTHON) >= 3 and COMMANDS
    assert any(b.page == "README.md" for b in PYTHON), "the README's front page shows no example"
    marked = sum(len(NOT_RUN.findall(path.read_text())) for path in PAGES)
    assert marked == sum(b.not_run is not None for b in ALL), \
        "a <!-- not-run: … --> marker must come right before a code block"
    assert all(b.not_run for b in ALL if b.not_run is not None), "a not-run marker needs a reason"
    assert marked <= 2, "not-run is for the odd fragment; make the example run instead"


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_python_example_runs(block: Block, tmp_path: Path) -> None:
    # Even a fragment must parse (top-level await allowed: it stands for code in a coroutine).
    compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if block.not_run is not None:
        pytest.skip(f"{block.where} is marked not-run: {block.not_run}")
    extra: dict[str, str] = {}
    if "DATABASE_URL" in block.code:  # a PostgreSQL example: the tests' server, when there is one
        if not os.environ.get("DURABLE_TURNS_TEST_PG"):
            pytest.skip(f"{block.where} needs PostgreSQL (DURABLE_TURNS_TEST_PG)")
        # A schema of its own, as every PostgreSQL test has: the server's default schema is
        # shared with whatever else uses the server (other checkouts' runs, of other schema
        # versions), and an example must neither read their tables nor migrate them.
        extra["DATABASE_URL"] = pg_schema_dsn()
    script = tmp_path / "example.py"
    script.write_text(block.code)
    proc = run([sys.executable, str(script)], tmp_path, extra)
    assert proc.returncode == 0, (
        f"{block.where}: the example exited {proc.returncode}\n"
        f"{proc.stdout}\n{proc.stderr}"
    )


@pytest.mark.parametrize("block", COMMANDS, ids=lambda b: b.id)
def test_command_example_runs(block: Block, tmp_path: Path) -> None:
    if block.not_run is not None:
        pytest.skip(f"{block.where} is marked not-run: {block.not_run}")
    proc = run(["bash", "-euo", "pipefail", "-c", block.code], tmp_path)
    assert proc.returncode == 0, (
        f"{block.where}: the commands exited {proc.returncode}\n"
        f"{proc.stdout}\n{proc.stderr}"
    )
