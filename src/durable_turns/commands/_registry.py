"""The command registry: each command declared once — how it is accepted, what it checks and
does, its HTTP route, its CLI verb, its authorization action — and what the hosts build
from it (the routes of ``server.app``, the paths of ``/openapi.json``, the verbs of
``durable-turns sessions``, the actions ``access`` knows).

A registry is a value, not a global: ``Runtime(commands=…)`` takes one (``COMMANDS`` by
default), and everything above the runtime reads ``runtime.commands``. A new command is a
module that declares its :class:`CommandSpec` and one registration, ``COMMANDS.with_(SPEC)``.

A queued command (a timer's wake, say) needs nothing more: its record's ``apply`` is its
effect at its place. A joining command (a steer) is a chain entry too, applied by the driver
at the running turn's next model-call boundary through its record's ``join``
(``commands._joining``). A command that acts at once reaches the running turn through the
runtime's public methods, as cancel does (``Runtime.interrupt``: a durable signal the turn's
boundaries read).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel

from ..records import ChainEntry, NewEntry, TurnResult
from ._place import Place

__all__ = [
    "Acceptance",
    "Arg",
    "Call",
    "ChainCommand",
    "CommandSpec",
    "Registry",
    "Route",
    "Streamed",
    "Verb",
]

Acceptance = Literal["queued", "joins", "at once"]
"""How a command is accepted: ``queued`` — a chain entry, durable when accepted, applied by
the session's driver when its place in the chain comes (behind the running turn);
``joins`` — a chain entry the driver applies at the running turn's next model-call boundary
(``JoiningCommand.join``), or at its place when no turn runs; ``at once`` — a durable signal
that acts now, never waiting behind a running step."""


class ChainCommand(Protocol):
    """A queued command: a typed record kept as its chain entry, applied at its place.

    ``kind`` names it in the chain (the entry's ``kind``); ``entry()`` is what is accepted;
    ``from_entry`` reads it back (the record is its entry's ``args``); ``apply`` runs its
    check again (the session may have changed since it was accepted) and commits its effect
    through ``at`` (``Place.end``, or a commit of its own), returning its entry's end.
    """

    kind: ClassVar[str]

    @property
    def entry_id(self) -> str: ...

    def entry(self) -> NewEntry: ...

    @classmethod
    def from_entry(cls, entry: ChainEntry) -> ChainCommand: ...

    async def apply(self, at: Place) -> TurnResult: ...


@dataclass(frozen=True, slots=True)
class Call:
    """What a command's route gets from the HTTP host."""

    session: Any
    """The :class:`~durable_turns.AgentSession` the path names."""
    body: Any
    """The request's body, checked against the route's ``body`` model."""
    by: str | None
    """Who asks: the principal's id (development mode: the body's ``by``)."""
    principal: Any
    """What ``authenticate`` returned (``None`` in development mode)."""
    channel: Any
    """The agent's ``ChannelContext``: what opens a turn's event stream before acting."""


@dataclass(frozen=True, slots=True)
class Streamed:
    """A route's answer that is a turn going on: its events with ``Accept:
    text/event-stream``, else its result once it ends or parks."""

    stream: Any
    """A ``TurnStream`` (iterated for the events, closed when done)."""
    turn_id: str
    """The turn whose result the JSON answer is."""


@dataclass(frozen=True, slots=True)
class Route:
    """A command's HTTP route: ``POST /agents/{agent}/sessions/{session}/<path>``."""

    path: str
    body: type[BaseModel]
    """The body's model (strict: JSON types, no extra fields); its schema goes into the
    OpenAPI document."""
    summary: str
    run: Callable[[Call], Awaitable[Mapping[str, Any] | Streamed]]
    """Does it: a JSON answer, or :class:`Streamed`."""
    answer: Mapping[str, Any] | None = None
    """The JSON schema of the answer (``None``: a turn's result, or its events)."""
    codes: tuple[int, ...] = ()
    """The refusals it answers besides every route's (400, 401, 403, 404, 408, 413, 415,
    503)."""
    required: bool = True
    """Whether a body must be sent (``False``: an empty one is ``{}``)."""
    known_session: bool = False
    """Refuse (404) a session the store does not have."""
    claims: bool = False
    """The caller becomes the owner of a session nobody owns yet (as starting a turn)."""


@dataclass(frozen=True, slots=True)
class Arg:
    """One argument of a CLI verb: ``argparse``'s ``add_argument(*flags, **options)``."""

    flags: tuple[str, ...]
    options: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Verb:
    """A command's CLI verb: ``durable-turns sessions <name> AGENT/ID [args]``."""

    help: str
    args: tuple[Arg, ...] = ()
    run: Callable[[Any, Any], Awaitable[str]] | None = None
    """``run(session, args)``: does it, returns the line to print. ``None``: the CLI has a
    runner of its own for it (``sessions retry`` looks the turn's session up itself)."""


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One command, declared once."""

    name: str
    """Its name: the route's path, the CLI verb and the default action."""
    summary: str
    accepted: Acceptance
    action: str
    """The authorization action a host asks before it (``access``): its own name, or one
    it shares (a retry runs a turn on: ``turn``)."""
    entry: type[ChainCommand] | None = None
    """For a queued or joining command: the record its chain entry holds (a joining one's
    is a ``JoiningCommand``)."""
    route: Route | None = None
    verb: Verb | None = None

    def __post_init__(self) -> None:
        if (self.accepted != "at once") != (self.entry is not None):
            raise ValueError(f"command {self.name!r}: a queued or joining command names its "
                             "chain entry's record (entry=…), one that acts at once none")
        if self.accepted == "joins" and not callable(getattr(self.entry, "join", None)):
            raise ValueError(f"command {self.name!r}: a joining command's record has a "
                             "join(at) (commands.JoiningCommand)")


class Registry:
    """The commands a runtime knows, by name (see the module docstring).

    Args:
        commands: the specs; names, entry kinds, routes and verbs are each unique.

    Raises:
        ValueError: two commands share a name, an entry kind or a route.
    """

    def __init__(self, commands: Iterable[CommandSpec]) -> None:
        self._by_name: dict[str, CommandSpec] = {}
        self._by_kind: dict[str, type[ChainCommand]] = {}
        self._joining: set[str] = set()
        paths: set[str] = set()
        for c in commands:
            if c.name in self._by_name:
                raise ValueError(f"two commands named {c.name!r}")
            self._by_name[c.name] = c
            if c.entry is not None:
                if c.entry.kind in self._by_kind or c.entry.kind == "turn":
                    raise ValueError(f"command {c.name!r}: entry kind {c.entry.kind!r} is taken")
                self._by_kind[c.entry.kind] = c.entry
                if c.accepted == "joins":
                    self._joining.add(c.entry.kind)
            if c.route is not None:
                if c.route.path in paths:
                    raise ValueError(f"command {c.name!r}: route {c.route.path!r} is taken")
                paths.add(c.route.path)

    def with_(self, *commands: CommandSpec) -> Registry:
        """This registry and ``commands``: the one registration a new command needs."""
        return Registry([*self, *commands])

    def __iter__(self) -> Iterator[CommandSpec]:
        return iter(self._by_name.values())

    def __getitem__(self, name: str) -> CommandSpec:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def queues(self, kind: str) -> bool:
        """Whether a command of this chain entry kind (queued or joining) is registered."""
        return kind in self._by_kind

    def joins(self, kind: str) -> bool:
        """Whether chain entries of this kind join the running turn (``accepted="joins"``)."""
        return kind in self._joining

    @property
    def actions(self) -> tuple[str, ...]:
        """The authorization actions its commands ask, each once, in order."""
        return tuple(dict.fromkeys(c.action for c in self))

    def command_of(self, entry: ChainEntry) -> ChainCommand:
        """The command a chain entry holds.

        Raises:
            ValueError: the entry is a turn (or of a kind this registry does not know).
        """
        found = self._by_kind.get(entry.kind)
        if found is None:
            raise ValueError(f"chain entry {entry.turn_id!r} is a {entry.kind}, not a command "
                             "this runtime knows")
        return found.from_entry(entry)
