"""What a SQL store's dialect hands each step (:class:`StepLink`) and each claim
(:class:`Grant`), and the error a link raises for a local tool that ended its transaction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ...errors import FatalToolError

__all__ = ["Grant", "StepLink", "tool_ended_transaction"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Grant:
    """What a claim got: the session's id and a lease's counters, and the dialect's own
    token of the hold (an OS lock's file, a heartbeat), given back at release."""

    sid: int
    epoch: int
    generation: int
    last_seq: int
    message_count: int
    hold: Any = None


class StepLink(Protocol):
    """One step's transaction, from its first local tool (or its commit) to the end of its
    commit: what a dialect hands each :class:`SqlTransaction` (``Dialect.step``). The link
    owns the transaction: it begins it, holds it across the awaits between the step's local
    tools and its commit, and ends it, in the dialect's way (SQL, or calls of its handle).

    Jobs are plain functions of a :class:`~durable_turns.stores.sql.Connection`; the link
    runs them where the dialect's connections live and translates the driver's failures into
    ``StoreError`` (what a job raises of its own, ``LeaseLostError`` for one, propagates as
    it is). Nobody else's statement may land in the step's transaction while it is open.
    The kit ships :class:`~durable_turns.stores.sql.SharedLink` for a dialect whose one write
    connection serves every session.
    """

    def connection(self) -> Any | None:
        """The raw handle a local tool writes through, while the link holds one
        (``Transaction.unwrap``)."""
        ...

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        """Run a local tool's ``fn(raw handle)`` inside the step's transaction (begun now if
        this is its first use), where user code may block. If ``fn`` raises, its writes are
        undone (and only its: the step's transaction stays usable) and the error propagates
        untranslated (it is the tool's).

        Raises:
            FatalToolError: ``fn`` ended the step's transaction through the raw handle.
        """
        ...

    async def commit(self, job: Callable[[Any], None], *,
                     alone: Callable[[Any], None] | None = None) -> None:
        """Run ``job`` inside the step's transaction (a new one when no local tool began it)
        and commit; if it raises, nothing of the step is committed (the local tools' writes
        neither) and the error propagates. Then give back what the link holds, whatever
        happened. ``alone``: when no local tool began a transaction, a job that is atomic on
        its own (one statement, where statements are serialised) to run instead, outside any
        transaction, unless it would wait for another writer (then ``job``, where waiting is
        fine). A link may always run ``job``."""
        ...

    async def end(self) -> None:
        """Undo whatever the step's transaction holds and give back what the link holds: a
        step that does not commit (its block raised)."""
        ...


def tool_ended_transaction() -> FatalToolError:
    """The error of a local tool that ended its step's transaction through the raw handle
    (``COMMIT``, ``ROLLBACK``): its writes are no longer tied to the step, which nothing can
    repair, so the turn fails. For a :class:`StepLink` to raise."""
    return FatalToolError(
        "a local tool ended the store's transaction (COMMIT/ROLLBACK on the raw handle); "
        "write through ctx.store.unwrap() without managing transactions")
