"""The step link of a backend whose transactions are calls that take a function: a Durable
Object's ``transactionSync(fn)`` and ``transaction(async fn)``, or any handle that has no
``BEGIN`` to send and wants the work handed to it instead.

A step's local tools and its commit must be one transaction, and the engine awaits between
them; a synchronous transaction call alone cannot span that. So, from the step's first local
tool,
:class:`CallbackLink` holds one of the backend's transactions across awaits (its
``transaction(job)``, on a task of its own, whose job waits until the step ends it), runs
each tool nested in it (``atomic``: a tool that raises has only its writes undone) and the
commit's job last, then lets the job return (commit) or raise (undo). A backend with an
implicit transaction that commits at its next await (a Durable Object's) needs nothing more:
inside the held transaction nothing commits before the step does. A step without local tools
holds nothing across awaits: its commit is one call of ``atomic`` (or its one statement).

The link holds the dialect's write lock from the step's first use of the storage to its
commit's end, so nobody's statement lands in another's transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from ...errors import StoreError

__all__ = ["CallbackLink", "CallbackWriter"]

T = TypeVar("T")


class CallbackWriter(Protocol):
    """What :class:`CallbackLink` needs of a dialect whose transactions are calls that take a
    function, on one write connection."""

    @property
    def write_lock(self) -> asyncio.Lock:
        """Held by whoever uses the write connection."""
        ...

    def writer(self) -> Any:
        """The raw handle local tools write through (``ctx.storage.sql``)."""
        ...

    def run(self, job: Callable[[Any], T]) -> T:
        """Run ``job`` on the kit's ``Connection`` now.

        Raises:
            StoreError: the database failed (what ``job`` raises of its own propagates).
        """
        ...

    def atomic(self, c: Any, job: Callable[[Any], T]) -> T:
        """``Dialect.atomic`` (``transactionSync(lambda: job(c))``); ``c`` may be the raw
        handle."""
        ...

    def transaction(self, job: Callable[[], Awaitable[bool]]) -> Awaitable[None]:
        """Run ``await job()`` in one transaction held across its awaits: committed when it
        returns true, undone when it returns false (``txn.rollback()`` on a Durable Object,
        whose ``storage.transaction(fn)`` this is) or raises.

        Raises:
            StoreError: the backend's transaction call failed.
        """
        ...


class _Held:
    """One transaction of the backend's held open across awaits, on a task of its own, whose
    job waits until the step ends it."""

    def __init__(self, writer: CallbackWriter) -> None:
        loop = asyncio.get_running_loop()
        self._entered: asyncio.Future[None] = loop.create_future()
        self._outcome: asyncio.Future[bool] = loop.create_future()  # True: commit
        self._task = asyncio.ensure_future(writer.transaction(self._job))

    async def _job(self) -> bool:
        self._entered.set_result(None)
        return await self._outcome

    async def entered(self) -> None:
        """Wait until the transaction is open.

        Raises:
            StoreError: the backend's transaction call failed before its job ran.
        """
        await asyncio.wait((self._entered, self._task), return_when=asyncio.FIRST_COMPLETED)
        if not self._entered.done():
            self._task.result()  # what the transaction call raised
            raise StoreError("the store's transaction ended before the step's work began")

    async def end(self, *, commit: bool) -> None:
        """Let the job return (``commit``) or raise (undo), and wait for the backend."""
        if not self._outcome.done():
            self._outcome.set_result(commit)
        await self._task


class CallbackLink:
    """The ``StepLink`` of a :class:`CallbackWriter` (see the module's docstring).

    Args:
        writer: the dialect.
    """

    __slots__ = ("_held", "_span", "_writer")

    def __init__(self, writer: CallbackWriter) -> None:
        self._writer = writer
        self._held = False
        self._span: _Held | None = None

    def connection(self) -> Any:
        """``StepLink.connection``."""
        return self._writer.writer()

    async def _hold(self) -> None:
        if not self._held:
            await self._writer.write_lock.acquire()
            self._held = True

    def _let_go(self) -> None:
        if self._held:
            self._held = False
            self._writer.write_lock.release()

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        """``StepLink.run_local``: on the loop, nested in the held transaction (the raw
        handle cannot end it: such backends refuse ``COMMIT`` in SQL)."""
        await self._hold()
        if self._span is None:
            span = _Held(self._writer)
            await span.entered()
            self._span = span
        w = self._writer
        return w.atomic(w.writer(), fn)

    async def commit(self, job: Callable[[Any], None], *,
                     alone: Callable[[Any], None] | None = None) -> None:
        """``StepLink.commit``."""
        w = self._writer
        try:
            await self._hold()
            span, self._span = self._span, None
            if span is None:
                w.run(alone if alone is not None else lambda c: w.atomic(c, job))
                return
            try:
                w.run(lambda c: w.atomic(c, job))
            except BaseException:
                await span.end(commit=False)
                raise
            await span.end(commit=True)
        finally:
            self._let_go()

    async def end(self) -> None:
        """``StepLink.end``."""
        try:
            span, self._span = self._span, None
            if span is not None:
                await span.end(commit=False)
        finally:
            self._let_go()
