"""``durable-turns``: the command line, and the package's composition root.

This is the only module that runs an event loop (``asyncio.run``); everything it starts is a
coroutine of a lower layer. Exit codes: 0 success, 1 the command ran and failed, 2 bad input
(argparse's own usage errors included), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .demo import (
    KILL_POINTS,
    DemoFailure,
    DemoInputError,
    DemoOptions,
    WorkerOptions,
    run_demo,
    run_worker,
)
from .demo.choice import DEFAULT_ANTHROPIC, ModelChoice, choose_model
from .demo.term import make_console
from .errors import ConfigurationError, DurableTurnsError, StoreError

PROG = "durable-turns"

DEMO_HELP = f"""\
Run a small ops agent's turn ("order a keyboard, a mouse and a monitor, then tell the team")
on a SQLite file. The turn runs in a child process that is killed with SIGKILL mid-turn; a
new process delivers the same turn id again; then the transcript, the orders table and the
outbox are read back from the store to prove that nothing ran twice.

The model: Anthropic ({DEFAULT_ANTHROPIC}) when ANTHROPIC_API_KEY is set, else a scripted one
(offline, deterministic); --model overrides. The banner says which.
"""
MODEL_HELP = ("the model: 'scripted' (offline, deterministic) or PROVIDER:NAME, e.g. "
              f"{DEFAULT_ANTHROPIC} or openai:gpt-4o (credentials and base URLs from the "
              "SDK's environment variables). Default: Anthropic when ANTHROPIC_API_KEY is "
              "set, else scripted")
DEMO_EPILOG = """\
kill points:
""" + "\n".join(f"  {name:<16} {what}" for name, what in KILL_POINTS.items()) + """

exit status: 0 the verdict passed, 1 it failed (or a child process misbehaved),
2 bad input (for instance --db names a file that is not a durable_turns database).
"""


def _version() -> str:
    try:
        return version("durable-turns")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The ``durable-turns`` argument parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A durable process for every LLM agent turn: checkpointed steps, replay "
                    "after a crash, tools with delivery guarantees.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo", help="kill an agent turn mid-way, deliver it again, show nothing ran twice",
        description=DEMO_HELP, epilog=DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--db", type=Path, metavar="PATH",
                      help="the SQLite file to use (created if missing; an existing one must "
                           "be a durable_turns store). Default: a new file in a temporary "
                           "directory, removed afterwards")
    demo.add_argument("--keep", action="store_true",
                      help="keep the temporary directory and print where it is")
    demo.add_argument("--kill-at", choices=list(KILL_POINTS), default="after-order-2",
                      help="where the first delivery is killed (default: %(default)s)")
    demo.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    demo.set_defaults(run=_demo)

    # Hidden: one delivery of the demo's turn, in the child process the demo starts.
    worker = commands.add_parser("demo-worker")
    worker.add_argument("--db", type=Path, required=True)
    worker.add_argument("--session", required=True)
    worker.add_argument("--turn", required=True)
    worker.add_argument("--delivery", type=int, required=True)
    worker.add_argument("--kill-at", choices=list(KILL_POINTS))
    worker.add_argument("--control-fd", type=int)
    worker.add_argument("--model", default="scripted")
    worker.set_defaults(run=_demo_worker)
    return parser


def _model(command: str, spec: str | None) -> ModelChoice | int:
    """The model choice, or the exit code of a clear error."""
    try:
        return choose_model(spec, os.environ)
    except ConfigurationError as e:
        return _fail(command, f"--model: {e}", 2)


def _fail(command: str, message: str, code: int) -> int:
    make_console(stderr=True).print(f"{PROG} {command}: error: {message}",
                                    style="bold red", markup=False, highlight=False)
    return code


def _demo(args: argparse.Namespace) -> int:
    model = _model("demo", args.model)
    if isinstance(model, int):
        return model
    opts = DemoOptions(db=args.db, keep=args.keep, kill_at=args.kill_at, model=model)
    try:
        return asyncio.run(run_demo(opts, make_console()))
    except DemoInputError as e:
        return _fail("demo", str(e), 2)
    except DemoFailure as e:
        return _fail("demo", str(e), 1)


def _demo_worker(args: argparse.Namespace) -> int:
    if args.kill_at is not None and args.control_fd is None:
        return _fail("demo-worker", "--kill-at needs --control-fd", 2)
    opts = WorkerOptions(db=args.db, session=args.session, turn_id=args.turn,
                         delivery=args.delivery, kill_at=args.kill_at,
                         control_fd=args.control_fd, model=args.model)
    try:
        return asyncio.run(run_worker(opts, make_console()))
    except StoreError as e:
        return _fail("demo-worker", str(e), 2)
    except TimeoutError:
        return _fail("demo-worker", f"turn {args.turn} did not end in time", 1)
    except DurableTurnsError as e:
        return _fail("demo-worker", f"{type(e).__name__}: {e}", 1)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``durable-turns`` with ``argv`` (default: the process's arguments)."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
