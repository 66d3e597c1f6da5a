"""F29: in an install without the extras (``pip install -e .`` alone), every command that
needs one says so in one line naming the ``pip install 'durable-turns[…]'`` to run, exit 2.

The install is a fresh ``python -m venv`` holding the package (``--no-deps``) and only the
core dependencies ``pyproject.toml`` lists, made once for the test session.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from durable_turns.cli._new import write_app

ROOT = Path(__file__).resolve().parents[2]
WAIT = 600.0
"""The bound on the install, and on each command, in seconds."""


@pytest.fixture(scope="session")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``durable-turns`` of a virtualenv with the core dependencies only."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=WAIT)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
           "--disable-pip-version-check"]
    for extra in (["--no-deps", "-e", str(ROOT)], core):
        subprocess.run([*pip, *extra], check=True, timeout=WAIT, capture_output=True)
    return venv / "bin" / "durable-turns"


@pytest.fixture(scope="session")
def app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("apps") / "app"
    write_app(folder, "minimal", "app")
    return folder


COMMANDS: list[tuple[list[str], str]] = [
    (["serve", "{app}", "--model", "test"], "server"),
    (["serve", "{app}", "--model", "test", "--reload"], "server"),
    (["chat", "{app}", "--model", "test", "--store", "postgresql://nobody@127.0.0.1/x"],
     "postgres"),
    (["worker", "{app}", "--model", "test", "--store", "postgresql://nobody@127.0.0.1/x"],
     "postgres"),
    (["sessions", "list", "--store", "postgresql://nobody@127.0.0.1/x"], "postgres"),
    (["temporal-worker", "{app}", "--model", "test", "--temporal", "127.0.0.1:7233",
      "--db", "t.db"],
     "temporal"),
    (["serve", "{app}", "--model", "test", "--temporal", "127.0.0.1:7233"], "server"),
    (["chat", "{app}", "--model", "anthropic:claude-sonnet-4-5"], "anthropic"),
    (["receive", "{app}", "--channel", "teams", "--target", "a:1chat", "--seed", "hi",
      "--model", "test"], "teams"),
]


@pytest.mark.parametrize(("argv", "extra"), COMMANDS, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else v)
def test_a_missing_extra_is_one_line_naming_the_install(
        bare: Path, app: Path, tmp_path: Path, argv: list[str], extra: str) -> None:
    ran = subprocess.run([str(bare), *(a.replace("{app}", str(app)) for a in argv)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=WAIT,
                         env={"PATH": "/usr/bin:/bin", "USER": "ann", "HOME": str(tmp_path)})
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert f"pip install 'durable-turns[{extra}]'" in ran.stderr, ran.stderr
