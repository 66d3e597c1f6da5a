"""The app folder → an :class:`~durable_turns.agent.Agent` (F10).

::

    app/agent/
      instructions.md          the base system prompt (required)
      instructions.slack.md    the overlay for turns whose event source is "slack"
                               (appended; a ``surfaces`` entry in agent.py may change that)
      agent.py                 name, surfaces, authorize_answer, model, mcp_servers,
                               authenticate, channels, schedules (all optional;
                               ``authenticate`` and ``channels`` are for ``serve`` and
                               ``receive``)
      tools/*.py               one Tool per module: a @tool function or `tool = Tool(…)`

Every mistake is an assembly error (:class:`~durable_turns.errors.ConfigurationError`) that
names the file: a policy with no overlay file (but for a deny-only one), a tool module that
fails to import or holds no Tool or two, a denied tool that does not exist, an MCP server
that cannot list its tools.

``mcp_servers`` in ``agent.py`` is a list of MCP servers whose tools the agent gets (F17): each
a streamable-HTTP URL, an ``mcp.StdioServerParameters``, or a mapping with ``url`` or
``command`` (and ``args``, ``env``, ``cwd``) plus :func:`durable_turns.mcp.mcp_tools`'s options
(``name``, ``prefix``, ``include``, ``timeout``, ``retries``, ``retry_delay``). Their tool lists
are read when the folder is loaded.

``channels`` in ``agent.py`` maps a channel's name to a factory, ``factory(env) -> Channel``
(:data:`durable_turns.channels.ChannelFactory`): ``durable-turns serve --channel NAME`` and
``receive --channel NAME`` find the app's own channels there before the built-in ones.

``schedules`` in ``agent.py`` is a list of schedules (F24), each a mapping of
``Runtime.schedule``'s arguments (``name``, ``seed``, one of ``cron``/``every``/``at``, and
``tz``, ``session``, ``channel``, ``target``, ``by``, ``overlap``, ``missed``) for the app's
agent: ``serve`` and ``worker`` store them when they start (the same definition keeps its
times).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from .agent import Agent, SurfacePolicy
from .errors import ConfigurationError
from .schedules import Schedule, ScheduleError
from .tools import Tool


def _import(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigurationError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigurationError(f"{path}: failed to import: {type(e).__name__}: {e}") from e
    return module


def _the_tool(module: ModuleType, path: Path) -> Tool:
    found = {id(v): v for v in vars(module).values() if isinstance(v, Tool)}
    if len(found) != 1:
        names = sorted(t.name for t in found.values())
        raise ConfigurationError(
            f"{path}: a tool module must hold exactly one Tool (a @tool function or "
            f"`tool = Tool(…)`); found {len(found)}{': ' + ', '.join(names) if names else ''}"
        )
    return next(iter(found.values()))


def _policy(source: str, value: Any, overlay: Path) -> SurfacePolicy:
    if isinstance(value, Mapping):
        value = SurfacePolicy(value.get("mode", "append"), tuple(value.get("deny_tools", ())))
    if not isinstance(value, SurfacePolicy):
        raise ConfigurationError(f"surfaces[{source!r}] must be a SurfacePolicy or a mapping")
    if value.mode not in ("append", "replace"):
        raise ConfigurationError(f"surfaces[{source!r}]: mode must be 'append' or 'replace'")
    if not overlay.is_file() and value.mode == "append" and value.deny_tools:
        return SurfacePolicy(value.mode, tuple(value.deny_tools))  # deny-only: no overlay
    if not overlay.is_file():
        raise ConfigurationError(
            f"surfaces[{source!r}] (mode {value.mode!r}) has no overlay file: "
            f"{overlay} is missing"
        )
    return SurfacePolicy(value.mode, tuple(value.deny_tools), overlay.read_text())


@dataclass(frozen=True)
class App:
    """An app folder, assembled: its agent and what a server of it needs."""

    agent: Agent
    """The agent."""
    authenticate: Callable[..., Any] | None = None
    """``authenticate(request)`` from agent.py: the caller's principal, or ``None`` to
    refuse (F12); ``None`` when agent.py defines none."""
    channels: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    """agent.py's ``channels``: the app's own channels by name, each a factory
    ``factory(env) -> Channel`` (``durable_turns.channels.channel_from_env(…, factories=…)``)."""
    schedules: tuple[Mapping[str, Any], ...] = ()
    """agent.py's ``schedules``: each ``Runtime.schedule``'s keyword arguments (checked), its
    ``agent`` the app's."""


def load_agent(path: str | Path) -> Agent:
    """Assemble the agent in the app folder ``path``.

    Raises:
        ConfigurationError: naming the file that is wrong or missing.
    """
    return load_app(path).agent


def load_app(path: str | Path) -> App:
    """Assemble the app folder ``path``: its agent, and agent.py's ``authenticate`` and
    ``channels``.

    Raises:
        ConfigurationError: naming the file that is wrong or missing.
    """
    root = Path(path)
    base = root / "instructions.md"
    if not base.is_file():
        raise ConfigurationError(f"{base} is missing: an app folder needs its base prompt")
    prefix = f"durable_turns_app_{abs(hash(root.resolve()))}"
    settings: dict[str, Any] = {}
    if (root / "agent.py").is_file():
        settings = vars(_import(root / "agent.py", f"{prefix}.agent"))
    tools = [
        _the_tool(_import(f, f"{prefix}.tools.{f.stem}"), f)
        for f in sorted((root / "tools").glob("*.py")) if not f.name.startswith("_")
    ]
    servers = settings.get("mcp_servers") or ()
    if servers:
        from .mcp import load_mcp_servers  # the MCP SDK loads only when an app names a server

        if isinstance(servers, str | Mapping) or not isinstance(servers, list | tuple):
            raise ConfigurationError(f"{root / 'agent.py'}: mcp_servers must be a list")
        tools += load_mcp_servers(servers, str(root / "agent.py"))
    names = {t.name for t in tools}
    surfaces = {
        source: _policy(source, value, root / f"instructions.{source}.md")
        for source, value in dict(settings.get("surfaces") or {}).items()
    }
    for overlay in sorted(root.glob("instructions.*.md")):
        source = overlay.name[len("instructions."):-len(".md")]
        if overlay.is_file() and source and source not in surfaces:  # no policy: appended
            surfaces[source] = SurfacePolicy("append", (), overlay.read_text())
    for source, policy in surfaces.items():
        unknown = sorted(set(policy.deny_tools) - names)
        if unknown:
            raise ConfigurationError(
                f"{root / 'agent.py'}: surfaces[{source!r}] denies unknown tools {unknown}"
            )
    model = settings.get("model")
    if isinstance(model, str):
        from .models.resolve import resolve_model  # an SDK loads only when a provider is named

        model = resolve_model(model)
    authenticate = settings.get("authenticate")
    if authenticate is not None and not callable(authenticate):
        raise ConfigurationError(
            f"{root / 'agent.py'}: authenticate must be a function of the request")
    channels = settings.get("channels") or {}
    if not isinstance(channels, Mapping) or not all(
            isinstance(k, str) and callable(v) for k, v in channels.items()):
        raise ConfigurationError(f"{root / 'agent.py'}: channels must map names to factories, "
                                 "factory(env) -> Channel")
    agent = Agent(
        name=settings.get("name") or root.name,
        instructions=base.read_text(),
        tools=tools,
        model=model,
        surfaces=surfaces,
        authorize_answer=settings.get("authorize_answer"),
    )
    return App(agent, authenticate, dict(channels),
               _schedules(settings.get("schedules"), agent.name, root / "agent.py"))


def _schedules(declared: Any, agent: str, where: Path) -> tuple[Mapping[str, Any], ...]:
    if declared is None:
        return ()
    if isinstance(declared, str | Mapping) or not isinstance(declared, list | tuple):
        raise ConfigurationError(f"{where}: schedules must be a list of mappings")
    out: list[Mapping[str, Any]] = []
    for n, entry in enumerate(declared):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise ConfigurationError(f"{where}: schedules[{n}] must be a mapping with a name")
        spec = {k: v for k, v in entry.items() if k != "agent"}
        if entry.get("agent", agent) != agent:
            raise ConfigurationError(f"{where}: schedules[{n}] names agent "
                                     f"{entry['agent']!r}; the app's agent is {agent!r}")
        try:
            Schedule.define(agent=agent, **spec)
        except (ScheduleError, TypeError) as e:
            raise ConfigurationError(f"{where}: schedules[{n}] ({entry['name']!r}): {e}"
                                     ) from None
        out.append({**spec, "agent": agent})
    names = [s["name"] for s in out]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{where}: two schedules share a name")
    return tuple(out)


def load_callable(spec: str) -> Callable[..., Any]:
    """The function ``spec`` names: ``package.module:name`` (imported as Python imports it,
    the working directory first) or ``path/to/file.py:name``.

    Raises:
        ConfigurationError: a malformed spec, a module that fails to import, a name it does
            not define, or one that is not callable.
    """
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigurationError(f"{spec!r}: expected MODULE:FUNCTION or FILE.py:FUNCTION")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ConfigurationError(f"{spec!r}: {path} is not a file")
        module = _import(path, f"durable_turns_callable_{abs(hash(path.resolve()))}")
    else:
        if "" not in sys.path:
            sys.path.insert(0, "")  # as ``python -m`` and uvicorn do: the working directory
        try:
            module = importlib.import_module(where)
        except Exception as e:
            raise ConfigurationError(
                f"{spec!r}: {where} failed to import: {type(e).__name__}: {e}") from e
    found: Callable[..., Any] | None = getattr(module, name, None)
    if not callable(found):
        raise ConfigurationError(f"{spec!r}: {where} defines no function {name!r}")
    return found


__all__ = ["App", "load_agent", "load_app", "load_callable"]
