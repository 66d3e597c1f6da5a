"""The package's layers, bottom first: the one statement of how its modules depend on each other.

A module imports only from its own layer and the layers before it in :data:`LAYERS`, and no
import closes a cycle, within a layer or across layers. That holds for every import: at
module level, inside a function, under ``if TYPE_CHECKING:``, relative or absolute (a cycle
through type hints is still a cycle for the reader). Two rules follow from the order:
records import nothing above them, and adapters depend on the seams and the engine, never
the reverse. ``tests/docs/test_layers.py`` checks every import edge against this table, and that
README's "How it is built" shows it as it is.

Modules are named relative to the package (``engine``, ``stores.sqlite``; ``__init__`` is
the package itself). A package's name stands for it and all its submodules, unless one of
its submodules is listed too: then the name stands for the package's ``__init__`` alone and
each of its submodules is listed, so that a new one has to be placed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer: its modules may import its own modules and those of the layers below."""

    name: str
    description: str
    """What the layer's modules are, in a line."""
    modules: tuple[str, ...]


LAYERS: tuple[Layer, ...] = (
    Layer(
        "records",
        "plain data, and errors that carry their ids",
        ("errors", "clock", "schedules", "messages", "_compact_memo", "_step_records",
         "records", "events", "history", "inbound"),
    ),
    Layer(
        "tools",
        "Tool, ToolSpec, @tool: what a model may call; ToolContext and the narrow seams "
        "behind it: what a tool's run may do",
        ("context", "_in_doubt", "tools"),
    ),
    Layer(
        "seams",
        "the Model Protocol and the store's (its write path and its queries), each with its "
        "contract",
        ("model", "stores"),
    ),
    Layer(
        "parts",
        "what the engine puts together: the Agent, its limits and context compaction, "
        "answerers and grants, spans",
        ("agent", "limits", "compaction", "_hitl", "_tracing"),
    ),
    Layer(
        "engine",
        "the engine (a turn's loop and its step kinds, how a step commits, a session's "
        "driver), commands, subagents, forks, the schedulers that have steps run, queries "
        "for hosts, AgentSession (a façade), Runtime, replay",
        ("engine", "commands", "subagents", "_forks", "scheduling", "_queries", "sessions",
         "schedule_fires",
         "_grants", "runtime", "replay"),
    ),
    Layer(
        "adapters",
        "what implements a seam: the store kit (its feed, its live relay, its SQL store written "
        "once over a dialect) and the stores, a module per model vendor, MCP tools, Temporal's "
        "scheduler and worker, the store conformance suite",
        (
            "models",
            "stores._feed",
            "stores.live",
            "stores._thread",
            "stores.kit",
            "stores._signals",
            "stores.sql",
            "stores.memory",
            "stores.sqlite",
            "stores._sqlite_files",
            "stores._sqlite_live",
            "stores._sqlite_signals",
            "stores.postgres",
            "stores._postgres_lanes",
            "stores._postgres_leases",
            "stores._postgres_listen",
            "stores.registry",
            "mcp",
            "temporal",
            "testing",
        ),
    ),
    Layer(
        "hosts",
        "what puts an agent before people: the bounds of what arrives over the wire, who "
        "may do what to a session, channels, the HTTP/SSE server and its console, the app "
        "folder's loader, the demo, the Durable Object host (its store, its object, a fake of its "
        "storage)",
        ("_input_limits", "access", "channels", "server", "cloudflare", "_loader", "_demo"),
    ),
    Layer(
        "composition",
        "the CLI (the only asyncio.run): its options and errors, the approvals of any app, "
        "the demo's, the sessions and the Temporal commands; the package's re-exports, this "
        "table",
        ("cli", "__init__", "layers"),
    ),
)
"""Bottom first: a module may import from its own layer and the layers before it."""


def layer_of(module: str) -> Layer | None:
    """The layer of a module named relative to the package, or ``None`` when none places it.

    Args:
        module: ``engine``, ``stores.sqlite``, ``server.app``; ``__init__`` for the package.

    Returns:
        The layer that lists the module, else the one that lists its nearest package when
        none of that package's submodules is listed; ``None`` otherwise.
    """
    listed = {m: layer for layer in LAYERS for m in layer.modules}
    if module in listed:
        return listed[module]
    parts = module.split(".")
    for n in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:n])
        if package in listed:
            if any(m.startswith(f"{package}.") for m in listed):
                return None  # its submodules are listed one by one: this one is not
            return listed[package]
    return None


__all__ = ["LAYERS", "Layer", "layer_of"]
