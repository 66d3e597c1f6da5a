"""The scheduler seam: what a runtime tells its scheduler, what a scheduler uses of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..agent import Agent
from ..engine._driver import ChainState
from ..records import SessionKey
from ..stores import Lease, SessionStore

__all__ = ["Scheduler", "Stepped"]


class Stepped(Protocol):
    """What a scheduler uses of the runtime it serves (:class:`~durable_turns.Runtime` is
    one)."""

    @property
    def store(self) -> SessionStore: ...

    @property
    def agents(self) -> Mapping[str, Agent]: ...

    @property
    def lease_timeout(self) -> float | None: ...

    def require_open(self) -> None:
        """Raise unless the runtime is open (a scheduler never opens it: its owner does)."""
        ...

    async def step(self, key: SessionKey, *, lease: Lease | None = None,
                   lease_timeout: float | None = None,
                   attempt: int | None = None) -> ChainState:
        """Run the session's next step; see :meth:`Runtime.step <durable_turns.Runtime.step>`."""
        ...

    def stopped(self, key: SessionKey, failure: BaseException | None = None) -> None:
        """A scheduler that steps here stopped stepping ``key`` (``failure``: it gave up),
        so the runtime's waiters look again (and raise the failure)."""
        ...


class Scheduler(Protocol):
    """When and where a runtime's sessions are stepped: the one seam every way of driving
    turns implements (see the package docstring for the shipped ones).

    The runtime calls :meth:`attach` once, :meth:`wake` whenever a session has work, and
    :meth:`wait_idle` and :meth:`close` as it shuts down. However the scheduler decides, each
    step
    is one call of ``Runtime.step(key)`` (in this process, or in a worker's), looped until
    the returned :class:`~durable_turns.engine._driver.ChainState` says nothing is ``more``.
    """

    @property
    def steps_here(self) -> bool:
        """Whether this process steps the sessions it is told of: then a new entry's agent
        must have a model here, ``Runtime.wait`` steps a turn nobody here steps, and a host's
        shutdown waits for the steps under way (:meth:`wait_idle`)."""
        ...

    def attach(self, runtime: Stepped) -> None:
        """Called once, by the runtime this scheduler serves (as it is made).

        Raises:
            ConfigurationError: the scheduler serves another runtime already.
        """
        ...

    async def wake(self, key: SessionKey, *, interrupt: bool = False) -> None:
        """The session has (or may have) work: an entry, a cancel, an answer, all durable.

        Called after the store holds the change, any number of times (it must be
        idempotent); it must return once the scheduler has the news, never step here in
        the caller. ``interrupt``: a turn was asked to stop (a cancel, a replace, a reset),
        so a step that waits out a retry's backoff should run now (its turn ends at the
        boundary).

        Raises:
            StoreError: the scheduler cannot be reached (the change stays durable; a
                redelivery or ``Runtime.recover()`` wakes the session again).
        """
        ...

    async def wait_idle(self) -> None:
        """Return once no step of this scheduler runs in this process."""
        ...

    async def close(self) -> None:
        """Stop stepping in this process (what is unfinished stays durable)."""
        ...
