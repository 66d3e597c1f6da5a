"""``durable-turns``, the command line: :func:`main` is the console script (``python -m
durable_turns.cli`` runs it too). Its commands live in the private modules beside it."""

from __future__ import annotations

from ._main import main

__all__ = ["main"]
