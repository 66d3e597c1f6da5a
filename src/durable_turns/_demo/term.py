"""Terminal output shared by the demo's processes: one rich console that degrades cleanly.

On a terminal: colours and box-drawing tables. Anywhere else (a pipe, a CI log, a file):
no escape codes, ASCII table borders and a fixed width, so the log reads the same everywhere.
The parent and its child processes write to the same stdout, so each decides the same way.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

PLAIN_WIDTH = 110
"""Width of non-terminal output (rich would otherwise wrap at 80 columns)."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Its reader has gone (``… | head``): raise it, for the command to end quietly
        (rich's own answer is ``SystemExit(1)``, as if the demo had failed)."""
        self.quiet = True
        raise BrokenPipeError("the output was closed")


def make_console(*, stderr: bool = False) -> Console:
    """A console for stdout (or stderr) that follows the rules above; a closed output
    raises ``BrokenPipeError``."""
    # soft_wrap: a line longer than the width is left for the terminal (or the log viewer)
    # to wrap, rather than broken by rich with hard newlines.
    console = _Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PLAIN_WIDTH
    return console


def table(console: Console, *columns: str) -> Table:
    """A table with the box style the console can show; the last column takes what is left."""
    style = box.SIMPLE_HEAD if console.is_terminal else box.ASCII
    t = Table(box=style, show_lines=False)
    for c in columns[:-1]:
        t.add_column(c, no_wrap=True)
    t.add_column(columns[-1], overflow="fold", ratio=1)
    return t


def rule(console: Console, title: str) -> None:
    """A horizontal rule with a title (ASCII when not on a terminal)."""
    console.rule(title, characters="─" if console.is_terminal else "-")


def heading(console: Console, title: str) -> None:
    """A section title above a table."""
    console.print()
    console.print(title, style="bold underline" if console.is_terminal else "")


def call_text(name: str, args: dict[str, Any], limit: int = 90) -> str:
    """A tool call as ``name(key=value, …)``, values as JSON, cut to ``limit`` characters."""
    inner = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return compact(f"{name}({inner})", limit)


def compact(value: Any, limit: int = 90) -> str:
    """A JSON value on one line, cut to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["PLAIN_WIDTH", "call_text", "compact", "heading", "make_console", "rule", "table"]
