"""The channel contract: what a host of an agent on another platform implements.

A :class:`Channel` puts a runtime's agent on a platform (Slack; a chat app, a mail box): it
serves the platform's requests (:meth:`Channel.mount` gives the routes), turns each inbound
message into a turn of its own event source (:attr:`Channel.name`), delivers the turn's
reply, and picks up after a restart what a stopped process left undelivered
(:meth:`Channel.recover`). A :class:`Deliverer` is the part of it that ``receive()`` needs:
rendering a turn nobody on the platform started (F9).

Who calls what: ``create_app(runtime, channels=[…])`` calls ``mount(runtime)`` once; its
lifespan calls ``start()``, then ``recover()`` (after ``Runtime.recover()``) as the server
starts, and ``stop()`` as it shuts down; ``receive()`` and ``recover_deliveries()`` call
``deliver(target, events)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..events import TurnEvent

if TYPE_CHECKING:
    from starlette.routing import BaseRoute  # the server extra: only a host that serves has it

    from ..runtime import Runtime


@runtime_checkable
class Deliverer(Protocol):
    """What renders a turn nobody on the platform started (F9): ``receive()``'s channel."""

    @property
    def name(self) -> str:
        """The channel's event source (``"slack"``): a ``receive()`` turn it delivers is
        marked for it, so its recovery finds it."""
        ...

    async def deliver(self, target: Mapping[str, Any],
                      events: AsyncIterable[TurnEvent]) -> Any:
        """Render one turn's events (to its end or its park) at ``target``.

        Args:
            target: where, in the platform's terms (Slack: ``{"channel_id": "C…"}``).
            events: the turn's stored events, ending with its end or ``input.requested``.

        Returns:
            A JSON-able receipt, stored with the turn.

        Raises:
            Exception: anything; nothing is stored and the delivery stays owed (it is
                made again by ``recover_deliveries`` or the next ``receive`` of the turn).
        """
        ...


@runtime_checkable
class Channel(Deliverer, Protocol):
    """A platform an agent is served on: its routes, its lifecycle, its deliveries.

    Implementations must never drive a turn themselves (the runtime does), must store what
    they delivered with the turn (``AgentSession.set_turn_data`` under their own name), not
    in memory only, and must answer a platform's request without waiting for the turn.
    """

    def mount(self, runtime: Runtime) -> Sequence[BaseRoute]:
        """Bind the channel to ``runtime`` and return the routes that serve the platform's
        requests (none for a channel that only delivers, or polls). Called once, by
        ``create_app``, before any other method but ``deliver``.

        Raises:
            ConfigurationError: the runtime cannot be served this way (no such agent, a
                secret missing).
        """
        ...

    async def start(self) -> None:
        """The server starts (the runtime is open): begin whatever runs in the background
        (a poller, a connection). Called once, before :meth:`recover`."""
        ...

    async def recover(self) -> int:
        """Finish what a stopped process left undelivered: replies cut short, turns that
        ended or parked while nobody delivered them. Called at start, after
        ``Runtime.recover()``; the work may go on in the background.

        Returns:
            How many turns it took up.
        """
        ...

    async def stop(self) -> None:
        """The server stops: end the background work (a delivery cut short is finished by
        the next process's :meth:`recover`). Must return within a few seconds."""
        ...


__all__ = ["Channel", "Deliverer"]
