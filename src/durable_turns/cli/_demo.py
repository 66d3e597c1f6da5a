"""``durable-turns demo``: the demo's commands, which run only the demo's own agent.

- ``demo``: a turn SIGKILLed mid-way and delivered again; the store proves nothing ran twice;
- ``demo refund`` / ``demo approve`` / ``demo pending``: the demo's refund parks for a
  person's approval in one process and is answered from another (F6);
- ``demo-child`` (hidden): one delivery of the demo's turn, in the child the demo starts.

They live under ``demo`` so that no generic command runs the demo's agent against an app's
database: ``demo approve`` answers only a database the demo made (its ``orders`` and
``refunds`` tables), and an app's parked turns are answered with ``durable-turns approve
APP_DIR`` (``_approvals``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from .._demo import KILL_POINTS, ChildOptions, DemoOptions, run_child, run_demo
from .._demo.approval import ApproveOptions, RefundOptions, run_approve, run_pending, run_refund
from .._demo.choice import DEFAULT_ANTHROPIC, ModelChoice, choose_model
from .._demo.refunds import APPROVAL_ID, ORDER_ID
from .._demo.term import make_console
from ..errors import ConfigurationError
from ._args import PROG, fail, name, os_user, run_command

DEMO_HELP = f"""\
Run a small ops agent's turn ("order a keyboard, a mouse and a monitor, then tell the team")
on a SQLite file. The turn runs in a child process that is killed with SIGKILL mid-turn; a
new process delivers the same turn id again; then the transcript, the orders table and the
outbox are read back from the store to prove that nothing ran twice.

The model: Anthropic ({DEFAULT_ANTHROPIC}) when ANTHROPIC_API_KEY is set, else a scripted one
(offline, deterministic); --model overrides. The banner says which.

'durable-turns demo refund' tells the demo's second story: an approval that outlives its
process ('demo approve' and 'demo pending' answer it).
"""
DEMO_EPILOG = """\
kill points:
""" + "\n".join(f"  {point:<16} {what}" for point, what in KILL_POINTS.items()) + """

exit status: 0 the verdict passed, 1 it failed (or a child process misbehaved),
2 bad input (for instance --db names a file that is not a durable_turns database).
"""
MODEL_HELP = ("the model: 'scripted' (offline, deterministic) or PROVIDER:NAME, e.g. "
              f"{DEFAULT_ANTHROPIC} or openai:gpt-4o (credentials and base URLs from the "
              "SDK's environment variables). Default: Anthropic when ANTHROPIC_API_KEY is "
              "set, else scripted")
REFUND_HELP = """\
Ask the demo's ops agent to refund an order. Its issue_refund tool parks the turn until a
person approves: this command prints the request (session, turn id, input id, prompt) and
exits. The park lives only in the SQLite file; answer it later, from any process, with
'durable-turns demo approve'.

The CLI stands in for a channel that verifies who is typing (as Slack signs its requests):
it attests --user, by default the operating-system user, who is then the one allowed to
approve unless --approver names someone else.
"""
APPROVE_HELP = """\
Answer the demo's parked refund from a new process: the answer is stored, the turn replays,
the parked tool runs again from the top and gets the answer, and the rest of the turn
streams here. Then the result and the refunds table are printed. Only a database the demo
made is answered (an app's parked turn: 'durable-turns approve APP_DIR').
"""
APPROVAL_EPILOG = """\
exit status: 0 done, 1 the turn failed, 2 bad input (unknown turn, wrong input id, a turn
that is not waiting for input or was answered already, --by not allowed to answer, an
unusable --db or --model, a database the demo did not make).
"""


def add_demo_commands(commands: Any) -> None:
    """``demo`` (with ``refund``, ``approve`` and ``pending`` under it) and the hidden
    ``demo-child``, on the subcommands of the top-level parser."""
    demo = commands.add_parser(
        "demo", help="kill an agent turn mid-way, deliver it again, show nothing ran twice "
                     "(and: demo refund|approve|pending)",
        description=DEMO_HELP, epilog=DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
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
    stories = demo.add_subparsers(dest="story", metavar="STORY")

    refund = stories.add_parser(
        "refund", help="start the demo's refund, which waits for approval; print it, exit",
        description=REFUND_HELP, epilog=APPROVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    refund.add_argument("--db", type=Path, metavar="PATH", required=True,
                        help="the SQLite file (created if missing; an existing one must be a "
                             "durable_turns store)")
    refund.add_argument("--order", type=_order_id, required=True, metavar="ID",
                        help="the order to refund (letters, digits, '-' and '_')")
    refund.add_argument("--amount", type=_amount, required=True, metavar="DOLLARS",
                        help="how much to refund, e.g. 30 or 12.50")
    refund.add_argument("--user", type=name, metavar="USER",
                        help="who asks (attested by the CLI); default: $USER")
    refund.add_argument("--approver", type=name, metavar="USER",
                        help="who must approve; default: the asker")
    refund.add_argument("--session", type=name, metavar="ID",
                        help="the session to run in (default: a new one)")
    refund.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    refund.set_defaults(run=_refund)

    approve = stories.add_parser(
        "approve", help="answer the demo's parked refund from a new process and finish it",
        description=APPROVE_HELP, epilog=APPROVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    approve.add_argument("--db", type=Path, metavar="PATH", required=True,
                         help="the demo's SQLite file the turn is parked in")
    approve.add_argument("--turn", required=True, metavar="TURN", help="the parked turn's id")
    approve.add_argument("--input", default=APPROVAL_ID, metavar="ID",
                         help="the input id it waits for (default: %(default)s)")
    approve.add_argument("--deny", action="store_true", help="answer no instead of yes")
    approve.add_argument("--by", type=name, metavar="USER",
                         help="who answers (attested by the CLI); default: $USER")
    approve.add_argument("--session", type=name, metavar="ID",
                         help="the turn's session, if two sessions have a turn of that id")
    approve.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    approve.set_defaults(run=_approve)

    pending = stories.add_parser(
        "pending", help="list the demo's sessions waiting for approval",
        description="List the sessions of the demo's SQLite file that are parked waiting "
                    "for a person, with the request each one waits for and who may answer.")
    pending.add_argument("--db", type=Path, metavar="PATH", required=True,
                         help="the demo's SQLite file")
    pending.set_defaults(run=_pending)

    # Hidden: one delivery of the demo's turn, in the child process the demo starts.
    child = commands.add_parser("demo-child")
    child.add_argument("--db", type=Path, required=True)
    child.add_argument("--session", required=True)
    child.add_argument("--turn", required=True)
    child.add_argument("--delivery", type=int, required=True)
    child.add_argument("--kill-at", choices=list(KILL_POINTS))
    child.add_argument("--control-fd", type=int)
    child.add_argument("--model", default="scripted")
    child.set_defaults(run=_demo_child)


def _order_id(text: str) -> str:
    if not ORDER_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an order id (1-40 letters, digits, '-' or '_')")
    return text


def _amount(text: str) -> float:
    try:
        value = float(text.removeprefix("$"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount of dollars") from None
    if not 0 < value <= 1_000_000 or round(value, 2) != value:
        raise argparse.ArgumentTypeError(
            f"{text!r}: an amount is above 0, at most 1000000, in whole cents")
    return value


def _model(spec: str | None) -> ModelChoice:
    """The demo's model choice of ``--model`` (or the environment's).

    Raises:
        ConfigurationError: an unusable ``--model``, said as such.
    """
    try:
        return choose_model(spec, os.environ)
    except ConfigurationError as e:
        raise ConfigurationError(f"--model: {e}") from None


def _demo(args: argparse.Namespace) -> int:
    def work() -> int:
        opts = DemoOptions(db=args.db, keep=args.keep, kill_at=args.kill_at,
                           model=_model(args.model))
        return asyncio.run(run_demo(opts, make_console()))

    return run_command("demo", work)


def _demo_child(args: argparse.Namespace) -> int:
    if args.kill_at is not None and args.control_fd is None:
        return fail("demo-child", "--kill-at needs --control-fd", 2)
    opts = ChildOptions(db=args.db, session=args.session, turn_id=args.turn,
                         delivery=args.delivery, kill_at=args.kill_at,
                         control_fd=args.control_fd, model=args.model)
    return run_command("demo-child", lambda: asyncio.run(run_child(opts, make_console())),
                       timed_out=f"turn {args.turn} did not end in time")


def _refund(args: argparse.Namespace) -> int:
    user = args.user or os_user()
    if user is None:
        return fail("demo refund", "who is asking? $USER is not set: pass --user", 2)

    def work() -> int:
        opts = RefundOptions(db=args.db, order_id=args.order, amount=args.amount, user=user,
                             approver=args.approver, session=args.session,
                             model=_model(args.model))
        return asyncio.run(run_refund(opts, make_console()))

    return run_command("demo refund", work, timed_out="the turn did not end in time")


def _approve(args: argparse.Namespace) -> int:
    by = args.by or os_user()
    if by is None:
        return fail("demo approve", "who is answering? $USER is not set: pass --by", 2)

    def work() -> int:
        opts = ApproveOptions(db=args.db, turn_id=args.turn, input_id=args.input,
                              approve=not args.deny, by=by, session=args.session,
                              model=_model(args.model))
        return asyncio.run(run_approve(opts, make_console()))

    return run_command("demo approve", work, timed_out="the turn did not end in time")


def _pending(args: argparse.Namespace) -> int:
    return run_command("demo pending", lambda: asyncio.run(run_pending(args.db,
                                                                       make_console())))


__all__ = ["PROG", "add_demo_commands"]
