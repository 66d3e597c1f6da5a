"""``durable-turns new DIR [--template minimal|ops]``: a new app folder, ready to run offline.

The templates are files shipped with the package (``cli/templates/``): ``common`` is laid
under every app (``agent.py`` and ``tests/test_app.py``), then the chosen template's own
(``instructions.md`` and ``tools/``). A file ending ``.tmpl`` loses the suffix; its
placeholders (``__APP__`` and the template's :data:`TEMPLATES` values) are filled in.
"""

from __future__ import annotations

import argparse
import re
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from ._args import PROG, run_command

TEMPLATES: dict[str, dict[str, str]] = {
    "minimal": {"__WHAT__": "message", "__LOCAL__": "save_note", "__TABLE__": "notes",
                "__APPROVED__": '"sent": true'},
    "ops": {"__WHAT__": "refund", "__LOCAL__": "create_order", "__TABLE__": "orders",
            "__APPROVED__": '"refunded": true'},
}
"""A template's name → the values of its placeholders."""
NEW_HELP = """\
Write a new app folder: instructions.md (the system prompt), agent.py (its settings),
tools/ (a local tool, whose writes commit with its step, and a remote tool that asks a
person to approve) and tests/test_app.py, which runs every tool offline with
durable_turns.testing.TestModel: 'python -m pytest -q' in the folder.
"""


def add_new_command(commands: Any) -> None:
    """``new DIR [--template NAME]``."""
    new = commands.add_parser("new", help="write a new app folder from a template",
                              description=NEW_HELP,
                              epilog="exit status: 0 written, 2 bad input (DIR exists and "
                                     "is not empty)")
    new.add_argument("dir", type=Path, metavar="DIR", help="the folder to write (new or empty)")
    new.add_argument("--template", choices=sorted(TEMPLATES), default="minimal",
                     help="minimal: notes and messages; ops: orders and refunds (default "
                          "%(default)s)")
    new.add_argument("--name", help="the agent's name (default: DIR's name)")
    new.set_defaults(run=lambda args: run_command("new", lambda: _new(args)))


def app_name(folder: Path) -> str:
    """An agent's name from a folder's: lower case, runs of other characters as ``-``."""
    found = re.sub(r"[^a-z0-9_]+", "-", folder.resolve().name.lower()).strip("-")
    return found or "app"


def write_app(folder: Path, template: str, name: str) -> list[Path]:
    """Write the app folder ``folder`` from ``template``; returns the files written.

    Raises:
        ValueError: ``folder`` exists and is not an empty directory.
    """
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} exists and is not empty: name a new folder")
    values = {"__APP__": name, **TEMPLATES[template]}
    root = files(__package__).joinpath("templates")
    written: list[Path] = []
    for part in ("common", template):
        written += _copy(root.joinpath(part), folder, values)
    return sorted(written)


def _copy(source: Traversable, dest: Path, values: dict[str, str]) -> list[Path]:
    written: list[Path] = []
    for item in source.iterdir():
        if item.is_dir():
            written += _copy(item, dest / item.name, values)
            continue
        text = item.read_text(encoding="utf-8")
        for key, value in values.items():
            text = text.replace(key, value)
        target = dest / item.name.removesuffix(".tmpl")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def _new(args: argparse.Namespace) -> int:
    name = args.name or app_name(args.dir)
    written = write_app(args.dir, args.template, name)
    print(f"wrote the app {name!r} (template {args.template}) in {args.dir}/:")
    for path in written:
        print(f"  {path.relative_to(args.dir)}")
    print("next:")
    print(f"  (cd {args.dir} && python -m pytest -q)          # its test, offline")
    print(f"  {PROG} serve {args.dir} --model test --reload   # its console at "
          "http://127.0.0.1:8000/")
    return 0


__all__ = ["NEW_HELP", "TEMPLATES", "add_new_command", "app_name", "write_app"]
