"""The reads of a SQL store, once for every dialect: each is a
:class:`~durable_turns.stores.sql._statements.Statements` query run where the dialect runs its
reads (``SqlStore.read``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ...events import TurnEvent
from ...history import Checkpoint
from ...messages import Message
from ...records import (
    ChainEntry,
    SessionInfo,
    SessionKey,
    SessionSummary,
    StepRecord,
    Visibility,
)
from ._history import checkpoints as read_checkpoints
from ._statements import Statements

__all__ = ["SqlReads"]

T = TypeVar("T")


class SqlReads:
    """The ``TurnStore`` and ``SessionQueries`` reads of a
    :class:`~durable_turns.stores.sql.SqlStore`, which holds one and answers its reads with it.

    Args:
        statements: the dialect's statements.
        read: runs a read job where the dialect runs them (``SqlStore.read``).
    """

    def __init__(self, statements: Statements, read: Callable[[Callable[[Any], Any]], Any]
                 ) -> None:
        self.statements = statements
        self._read = read

    async def read(self, job: Callable[[Any], T]) -> T:
        """Run a read job where the dialect runs them."""
        out: T = await self._read(job)
        return out

    async def entries(self, key: SessionKey, *, turn_id: str | None = None,
                      unfinished: bool = False) -> list[ChainEntry]:
        """``TurnStore.entries``."""
        return await self.read(lambda c: self.statements.entries(c, key, turn_id, unfinished))

    async def session_info(self, key: SessionKey) -> SessionInfo | None:
        """``SessionQueries.session_info``."""
        return await self.read(lambda c: self.statements.session_info(c, key))

    async def read_messages(self, key: SessionKey, *, after: int = 0,
                            generation: int | None = None) -> list[Message]:
        """``TurnStore.read_messages``."""
        return await self.read(
            lambda c: self.statements.read_messages(c, key, after, generation))

    async def read_steps(self, key: SessionKey, *, generation: int | None = None,
                         step_id: str | None = None) -> dict[str, StepRecord]:
        """``TurnStore.read_steps``."""
        return await self.read(
            lambda c: self.statements.read_steps(c, key, generation, step_id))

    async def read_events(self, key: SessionKey, *, after_seq: int = 0,
                          turn_id: str | None = None) -> list[TurnEvent]:
        """``TurnStore.read_events``."""
        return await self.read(
            lambda c: self.statements.read_events(c, key, after_seq, turn_id))

    async def find_sessions(self, which: str | None = None, *,
                            turn_id: str | None = None) -> list[SessionKey]:
        """``SessionQueries.find_sessions``."""
        return await self.read(lambda c: self.statements.find_sessions(c, which, turn_id))

    async def list_sessions(self, agent: str) -> list[SessionKey]:
        """``SessionQueries.list_sessions``."""
        return await self.read(lambda c: self.statements.list_sessions(c, agent))

    async def session_summaries(self, agent: str, *, parked_only: bool = False,
                                visible: Visibility | None = None) -> list[SessionSummary]:
        """``SessionQueries.session_summaries``."""
        return await self.read(
            lambda c: self.statements.session_summaries(c, agent, parked_only, visible))

    async def owed_deliveries(self, channel: str) -> list[tuple[SessionKey, ChainEntry]]:
        """``SessionQueries.owed_deliveries``."""
        return await self.read(lambda c: self.statements.owed_deliveries(c, channel))

    async def checkpoints(self, key: SessionKey, *,
                          generation: int | None = None) -> list[Checkpoint]:
        """``SessionQueries.checkpoints``."""
        return await self.read(
            lambda c: read_checkpoints(self.statements, c, key, generation))

