"""What the command line's commands share: their parser, the options that name an app, a
store and a model, and the checks that turn a bad one into one line before anything runs.

A store's SQLite file is checked here, as given (a directory, a folder that does not exist,
a file that must exist), so that a command says so in words instead of failing inside the
store with an ``OSError`` or SQLite's "disk I/O error".
"""

from __future__ import annotations

import argparse
import errno
import getpass
import os
import re
import select
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .._demo import DemoFailure, DemoInputError
from .._loader import App, load_app
from ..agent import Agent
from ..errors import ConfigurationError, DurableTurnsError, StoreError, error_kind
from ..models.resolve import resolve_model
from ..stores import SessionStore
from ..stores.registry import file_of, store_for
from ..stores.sqlite import SqliteStore

PROG = "durable-turns"
MODEL_HELP = ("the model: 'test' (offline: it calls each of the agent's tools once with a "
              "generated input, then sums up), 'scripted' (offline: it calls the tool whose "
              "name and JSON input you write) or PROVIDER:NAME, e.g. "
              "anthropic:claude-sonnet-4-5 or openai:gpt-4o (credentials from the SDK's "
              "environment variables); overrides agent.py's model")


HIDDEN = frozenset({"demo-child"})
"""Commands that are not a person's to type (a process the demo starts): never listed."""
_CHOICES = re.compile(r"\(choose from (.*)\)$")


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        """Print ``PROG COMMAND: error: MESSAGE (see … --help)`` and exit with status 2; a
        list of the commands to choose from leaves out the :data:`HIDDEN` ones."""
        choices = _CHOICES.search(message)
        if choices is not None:
            shown = [c for c in choices.group(1).split(", ") if c.strip("'") not in HIDDEN]
            message = f"{message[:choices.start()]}(choose from {', '.join(shown)})"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def name(text: str) -> str:
    """An argparse type: a person's or a session's name, non-empty, no spaces around it."""
    if not text.strip() or text != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: a name is non-empty, without spaces "
                                         "around it")
    return text


def port(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1 to 65535)")
    return int(text)


def os_user() -> str | None:
    """The operating-system user (``$USER``, ``$LOGNAME``, the password database), or
    ``None`` when none is known (as in some containers)."""
    found = os.environ.get("USER") or os.environ.get("LOGNAME")
    if found:
        return found
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry
        return None


def check_file(path: Path, *, create: bool, option: str = "--db") -> Path:
    """Check a store's SQLite file as given, before the store opens it.

    Args:
        create: whether a missing file may be created (its folder must exist).
        option: the option that named it, for the message.

    Raises:
        ValueError: ``path`` is a directory.
        LookupError: it does not exist (without ``create``), or its folder does not.
    """
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory; give the path of a file")
    if path.exists():
        return path
    if not create:
        raise LookupError(f"{option} {path}: no such file")
    if not path.parent.is_dir():
        raise LookupError(f"{option} {path}: the directory {path.parent} does not exist")
    return path


def store_options(cmd: argparse.ArgumentParser, *, required: bool = True,
                  default_db: Path | None = None) -> None:
    """``--db PATH`` or ``--store``/``--dsn DSN_OR_PATH``: where the sessions live.

    Args:
        required: one of them must be given (without ``default_db``).
        default_db: the SQLite file used when neither is given.
    """
    group = cmd.add_mutually_exclusive_group(required=required and default_db is None)
    group.add_argument("--db", type=Path, metavar="PATH", default=default_db,
                       help="the SQLite file" + (f" (default {default_db})" if default_db
                                                 else ""))
    group.add_argument("--store", "--dsn", dest="store", metavar="DSN_OR_PATH",
                       help="instead of --db: postgresql://… or 'host=… dbname=…' "
                            "(PostgreSQL, extra 'postgres'), or a SQLite file")


def store_of(args: argparse.Namespace, *, create: bool, lease_ttl: float | None = None
             ) -> tuple[Callable[[], SessionStore], str]:
    """The store ``--db`` or ``--store`` names: a maker of it (each runtime opens its own) and
    how messages name it. Its SQLite file is checked first (:func:`check_file`).

    Args:
        create: whether a SQLite file that does not exist may be created (a command that
            manages existing sessions must not make an empty store).
        lease_ttl: for a store whose leases expire (PostgreSQL), their TTL.

    Raises:
        ValueError, LookupError: as :func:`check_file`.
        ConfigurationError: a spec no store takes.
    """
    spec: str | None = getattr(args, "store", None)
    if spec is None:
        path = check_file(args.db, create=create)
        if not create and path.stat().st_size == 0:
            raise LookupError(f"--db {path} is empty: not a durable_turns store")
        return (lambda: SqliteStore(path)), str(path)
    store_for(spec)  # a spec nothing takes fails here, before any file is looked at
    file = file_of(spec)
    if file is not None:
        check_file(file, create=create, option="--store")
    made = store_for(spec, lease_ttl=lease_ttl)
    # store_for imported the PostgreSQL store's module if the spec names one.
    postgres: Any = sys.modules.get("durable_turns.stores.postgres")
    if not create and postgres is not None and isinstance(made, postgres.PostgresStore):
        _has_postgres_store(spec, where(spec, made))
    return (lambda: store_for(spec, lease_ttl=lease_ttl)), where(spec, made)


def _has_postgres_store(dsn: str, named: str) -> None:
    """Refuse a PostgreSQL database (its schema on the DSN's search path) that holds no
    durable_turns store, before a store opens it: opening creates the store's tables, and a
    command that manages existing sessions must create none.

    Raises:
        LookupError: no store there (no ``durable_turns_schema`` table, which
            ``PostgresStore`` documents as the one that holds its schema's version).
        StoreError: PostgreSQL cannot be reached.
    """
    import psycopg  # the postgres extra: PostgresStore was made, so it is installed

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT to_regclass('durable_turns_schema')").fetchone()
    except psycopg.Error as e:
        raise StoreError(f"cannot reach PostgreSQL ({named}): {e}") from None
    if row is None or row[0] is None:
        raise LookupError(f"{named} holds no durable_turns store (no sessions were ever "
                          "stored there)")


def where(spec: str, store: SessionStore) -> str:
    """How messages name a store: a file by its path, any other store by its ``repr``
    (which names its storage, never a password)."""
    return spec if file_of(spec) is not None else repr(store)


def app_options(cmd: argparse.ArgumentParser) -> None:
    """``APP_DIR`` (or ``--app APP_DIR``): the app folder whose agent the command runs."""
    cmd.add_argument("app", nargs="?", type=Path, metavar="APP_DIR",
                     help="the app folder (its agent.py, instructions.md and tools/)")
    cmd.add_argument("--app", dest="app_option", type=Path, metavar="APP_DIR",
                     help="the app folder, as an option")


def app_dir(args: argparse.Namespace) -> Path:
    """The app folder ``APP_DIR`` or ``--app`` names.

    Raises:
        ValueError: neither was given, or both, naming different folders.
    """
    given: list[Path] = [p for p in (args.app, getattr(args, "app_option", None))
                         if p is not None]
    if not given:
        raise ValueError("which app? name its folder: APP_DIR or --app APP_DIR")
    if len(given) == 2 and given[0].resolve() != given[1].resolve():
        raise ValueError(f"two app folders given: {given[0]} and --app {given[1]}")
    return given[0]


def load(path: Path, model: str | None, *, needs_model: bool = True) -> App:
    """The app folder ``path``, with ``--model`` (if given) as its agent's model.

    Args:
        model: ``--model``: ``scripted`` or ``PROVIDER:NAME``; it overrides agent.py's.
        needs_model: refuse an app whose agent then has no model (a command that drives
            turns needs one; one that only reads does not).

    Raises:
        ConfigurationError: the folder is wrong (naming the file), the model cannot be
            built, or none is named where one is needed.
    """
    if not path.is_dir():
        raise ConfigurationError(f"{path} is not an app folder (no such directory)")
    app = load_app(path)
    if model is not None:
        try:
            app.agent.model = resolve_model(model)
        except ConfigurationError as e:
            raise ConfigurationError(f"--model: {e}") from None
    if needs_model:
        needs_model_of(app.agent, path)
    return app


def needs_model_of(agent: Agent, path: Path) -> None:
    """Refuse an app whose agent has no model (neither agent.py's nor ``--model``).

    Raises:
        ConfigurationError: saying how to name one.
    """
    if agent.model is None:
        raise ConfigurationError(f"{path}'s agent.py names no model: pass --model "
                                 "PROVIDER:NAME, or --model test to run offline")


def agent_of(args: argparse.Namespace, *, needs_model: bool = True) -> Agent:
    """The agent of the app folder the command names, with ``--model`` applied."""
    return load(app_dir(args), getattr(args, "model", None), needs_model=needs_model).agent


def fail(command: str, message: str, code: int) -> int:
    """Say ``PROG COMMAND: error: MESSAGE`` on stderr, one line; returns ``code``."""
    print(f"{PROG} {command}: error: {' '.join(message.split())}", file=sys.stderr,
          flush=True)
    return code


CLOSED_OUTPUT = 141
"""The exit status of a command whose output was closed (``… | head``): what a shell reports
for a process that SIGPIPE ended, as it ends ``yes | head``."""
_DEMO_ERRORS: tuple[tuple[type[Exception], int], ...] = ((DemoInputError, 2), (DemoFailure, 1))
"""The demo's own exceptions, before ``errors.ERRORS``: its messages are the whole story."""
_BAD_PATHS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                        errno.EROFS, errno.ENAMETOOLONG, errno.EADDRINUSE,
                        errno.EADDRNOTAVAIL})
"""``OSError``s that say the path or the address given cannot be used: bad input (2)."""
EXTRAS: dict[str, str] = {
    "starlette": "server", "uvicorn": "server", "sse_starlette": "server",
    "watchfiles": "server", "psycopg": "postgres", "temporalio": "temporal",
    "slack_sdk": "slack", "aiohttp": "slack", "anthropic": "anthropic", "openai": "openai",
    "mcp": "mcp", "opentelemetry": "otel", "ag_ui": "ag-ui",
}
"""The top-level module an extra installs → the extra (``pyproject.toml``'s names)."""


def missing_extra(e: BaseException) -> str | None:
    """The extra whose module ``e`` (or what caused it) failed to find, or ``None``."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            extra = EXTRAS.get(seen.name.split(".", 1)[0])
            if extra is not None:
                return extra
        seen = seen.__cause__ or seen.__context__
    return None


def output_closed() -> bool:
    """Whether the reader of this process's standard output has gone (``… | head`` ended):
    a pipe with no reader polls as an error on Linux."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll here, or no real stdout
        return False


def _closed() -> int:
    # Whatever is still buffered for the closed pipe would fail again at exit, with a
    # message of Python's own: the rest of the output goes nowhere.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return CLOSED_OUTPUT


def run_command(command: str, work: Callable[[], int], *, timed_out: str = "timed out") -> int:
    """Run a command and answer what it raises with one line and an exit status.

    An exception of ``errors.ERRORS`` (or the demo's) becomes ``PROG COMMAND: error: …`` and
    its exit status; a failure of the command itself (exit 1) names its type. An ``OSError``
    (a file or a port that cannot be used) is said with its path, exit 2 for a bad path or
    address, else 1. A module of an extra that is not installed names the ``pip install``
    to run (:data:`EXTRAS`), exit 2. A closed output (``… | head``) ends the command quietly, with
    :data:`CLOSED_OUTPUT`. Anything else is a bug, and shows its traceback.

    Args:
        timed_out: the message of a ``TimeoutError`` that has none.

    Returns:
        The command's exit status.
    """
    try:
        code = work()
        sys.stdout.flush()  # here, where a closed pipe is still this function's to answer
        return code
    except BrokenPipeError:
        return _closed()
    except Exception as e:
        if output_closed():  # what failed was writing, by a child process that shares it
            return _closed()
        extra = missing_extra(e) if isinstance(e, ImportError) else None
        if extra is not None:
            return fail(command, f"this needs the {extra} extra: pip install "
                                 f"'durable-turns[{extra}]'", 2)
        for cls, code in _DEMO_ERRORS:
            if isinstance(e, cls):
                return fail(command, str(e), code)
        kind = error_kind(e)
        if kind is None and isinstance(e, OSError):
            where_ = f"{e.filename}: " if e.filename else ""
            return fail(command, f"{where_}{e.strerror or e}",
                        2 if e.errno in _BAD_PATHS else 1)
        if kind is None:
            raise
        message = str(e) or (timed_out if isinstance(e, TimeoutError) else type(e).__name__)
        if kind.exit_code == 1 and isinstance(e, DurableTurnsError):
            message = f"{type(e).__name__}: {e}"
        return fail(command, message, kind.exit_code)


__all__ = [
    "CLOSED_OUTPUT",
    "EXTRAS",
    "HIDDEN",
    "MODEL_HELP",
    "PROG",
    "Parser",
    "agent_of",
    "app_dir",
    "app_options",
    "check_file",
    "fail",
    "load",
    "missing_extra",
    "name",
    "os_user",
    "output_closed",
    "port",
    "run_command",
    "store_of",
    "store_options",
    "where",
]
