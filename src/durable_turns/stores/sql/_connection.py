"""The connection the SQL kit runs its statements on: two calls, so that any driver's handle
fits in a few lines (a DB-API connection: ``stores.sqlite``'s ``SqliteConnection``,
``stores.postgres``'s; a handle whose ``exec(sql, *bindings)`` returns a cursor:
``durable_turns.cloudflare``'s store)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["Connection", "first"]


class Connection(Protocol):
    """The connection the kit runs every statement on: two calls, so a handle of any shape
    fits in a few lines (a DB-API connection, or a handle whose ``exec(sql, *bindings)``
    returns a cursor: see ``durable_turns.cloudflare``'s store).

    Statements come with their parameters separate, in the dialect's placeholders
    (``Syntax.placeholder``); a connection never begins or ends a transaction of its own
    accord (the dialect's transaction calls do).
    """

    def rows(self, sql: str, params: Sequence[Any] = (), /) -> list[Any]:
        """Run one statement; the rows it returns, in order, each a sequence of its columns'
        values (``[]`` for a statement that returns none).

        Raises:
            Exception: whatever the database raises (the dialect translates it).
        """
        ...

    def changes(self, sql: str, params: Sequence[Any] = (), /) -> int:
        """Run one writing statement; how many rows it inserted, updated or deleted.

        Raises:
            Exception: whatever the database raises (the dialect translates it).
        """
        ...


def first(rows: list[Any]) -> Any:
    """The first of a statement's rows, ``None`` when it returned none."""
    return rows[0] if rows else None
