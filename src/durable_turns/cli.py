"""``durable-turns``: the command line, and the package's composition root.

This is the only module that runs an event loop (``asyncio.run``); everything it starts is a
coroutine of a lower layer. Exit codes: 0 success, 1 the command ran and failed, 2 bad input
(argparse's own usage errors included), 130 interrupted; what a command raises is mapped
once, by ``errors.ERRORS`` (:func:`_run`). ``durable-turns sessions …`` lives in
``cli_sessions``.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .agent import Agent, check_surfaces
from .channels.registry import channel_from_env
from .cli_sessions import (
    add_replay_command,
    add_session_commands,
    replay_action,
    retry,
    session_action,
    store_from_spec,
    where,
)
from .demo import (
    KILL_POINTS,
    DemoFailure,
    DemoInputError,
    DemoOptions,
    WorkerOptions,
    run_demo,
    run_worker,
)
from .demo.approval import ApproveOptions, RefundOptions, run_approve, run_pending, run_refund
from .demo.choice import DEFAULT_ANTHROPIC, ModelChoice, choose_model
from .demo.refunds import APPROVAL_ID, ORDER_ID
from .demo.term import make_console
from .errors import ConfigurationError, DurableTurnsError, error_kind
from .loader import load_agent, load_app, load_callable
from .models.resolve import resolve_model
from .records import TurnResult
from .runtime import Runtime
from .stores.sqlite import SqliteStore

PROG = "durable-turns"
SERVE_HELP = """\
Serve the app folder's agent over HTTP with server-sent events (F12): the routes under
/agents/AGENT/sessions/ID, described at /openapi.json. Unfinished turns in the store are
recovered at start. SIGTERM shuts down gracefully: streams close, running turns get a grace
period, anything cut short replays on the next start.

Authentication: define authenticate(request) in APP_DIR/agent.py, or pass --auth
MODULE:FUNCTION (or FILE.py:FUNCTION). It returns the caller's principal (its "id" is the
speaker and the answerer), or None to refuse with 401; it may be async. Without it the
server is in development mode: "by" comes from the request body, so it binds loopback only.
"""

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
REFUND_HELP = """\
Ask the demo's ops agent to refund an order. Its issue_refund tool parks the turn until a
person approves: this command prints the request (session, turn id, input id, prompt) and
exits. The park lives only in the SQLite file; answer it later, from any process, with
'durable-turns approve'.

The CLI stands in for a channel that verifies who is typing (as Slack signs its requests):
it attests --user, by default the operating-system user, who is then the one allowed to
approve unless --approver names someone else.
"""
APPROVE_HELP = """\
Answer a parked turn from a new process: the answer is stored, the turn replays, the parked
tool runs again from the top and gets the answer, and the rest of the turn streams here.
Then the result and the refunds table are printed.
"""
APPROVAL_EPILOG = """\
exit status: 0 done, 1 the turn failed, 2 bad input (unknown turn, wrong input id, a turn
that is not waiting for input or was answered already, --by not allowed to answer, an
unusable --db or --model).
"""
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


def _app_store_options(cmd: argparse.ArgumentParser, *, store: bool = True) -> None:
    """``--db`` (and ``--store``) and ``--model``: where an app's sessions live, and the
    model when its agent.py names none."""
    cmd.add_argument("--db", type=Path, metavar="PATH", default=Path("durable_turns.db"),
                     help="the SQLite file (created if missing; default %(default)s)")
    if store:
        cmd.add_argument("--store", metavar="DSN_OR_PATH",
                         help="instead of --db: postgresql://… (PostgreSQL, extra "
                              "'postgres') or a SQLite file")
    cmd.add_argument("--model", metavar="PROVIDER:NAME",
                     help="the model, when the app's agent.py names none")


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

    refund = commands.add_parser(
        "refund", help="start a refund that waits for approval, print the request, exit",
        description=REFUND_HELP, epilog=APPROVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    refund.add_argument("--db", type=Path, metavar="PATH", required=True,
                        help="the SQLite file (created if missing; an existing one must be a "
                             "durable_turns store)")
    refund.add_argument("--order", type=_order_id, required=True, metavar="ID",
                        help="the order to refund (letters, digits, '-' and '_')")
    refund.add_argument("--amount", type=_amount, required=True, metavar="DOLLARS",
                        help="how much to refund, e.g. 30 or 12.50")
    refund.add_argument("--user", type=_name, metavar="USER",
                        help="who asks (attested by the CLI); default: $USER")
    refund.add_argument("--approver", type=_name, metavar="USER",
                        help="who must approve; default: the asker")
    refund.add_argument("--session", type=_name, metavar="ID",
                        help="the session to run in (default: a new one)")
    refund.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    refund.set_defaults(run=_refund)

    approve = commands.add_parser(
        "approve", help="answer a parked turn from a new process and finish it",
        description=APPROVE_HELP, epilog=APPROVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    approve.add_argument("--db", type=Path, metavar="PATH", required=True,
                         help="the SQLite file the turn is parked in")
    approve.add_argument("--turn", required=True, metavar="TURN", help="the parked turn's id")
    approve.add_argument("--input", default=APPROVAL_ID, metavar="ID",
                         help="the input id it waits for (default: %(default)s)")
    approve.add_argument("--deny", action="store_true", help="answer no instead of yes")
    approve.add_argument("--by", type=_name, metavar="USER",
                         help="who answers (attested by the CLI); default: $USER")
    approve.add_argument("--session", type=_name, metavar="ID",
                         help="the turn's session, if two sessions have a turn of that id")
    approve.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    approve.set_defaults(run=_approve)

    pending = commands.add_parser(
        "pending", help="list the sessions waiting for input, and what they wait for",
        description="List the sessions of a SQLite store that are parked waiting for a "
                    "person, with the request each one waits for and who may answer it.",
    )
    pending.add_argument("--db", type=Path, metavar="PATH", required=True,
                         help="the SQLite file")
    pending.set_defaults(run=_pending)

    sessions = commands.add_parser(
        "sessions", help="operate on a store's sessions",
        description="Operate on the sessions of a store: a SQLite file (--db) or PostgreSQL "
                    "(--store postgresql://…).")
    add_session_commands(sessions, run_action=_sessions, run_retry=_sessions_retry)
    add_replay_command(commands, run=_replay)

    work = commands.add_parser(
        "worker", help="drive an app's queued turns from a shared store, until interrupted",
        description="Be one of many workers of an app: drive every session with a queued or "
                    "running turn, taking over the sessions of workers that died (their "
                    "leases expire). Turns are accepted elsewhere (a Runtime with "
                    "drive=False, a server) into the same store.")
    work.add_argument("app", type=Path, metavar="APP_DIR", help="the app folder (its agent)")
    work.add_argument("--store", required=True, metavar="DSN_OR_PATH",
                      help="postgresql://… or 'host=… dbname=…' (PostgreSQL, extra "
                           "'postgres'), or a SQLite file")
    work.add_argument("--model", metavar="PROVIDER:NAME",
                      help="the model, when the app's agent.py names none")
    work.add_argument("--lease-ttl", type=float, default=15.0, metavar="SECONDS",
                      help="PostgreSQL: how long a dead worker's sessions wait for takeover")
    work.add_argument("--poll-interval", type=float, default=0.5, metavar="SECONDS",
                      help="seconds between looks for new work")
    work.add_argument("--max-sessions", type=int, default=100, metavar="N",
                      help="sessions this worker drives at once, at most (the rest are left "
                           "to other workers)")
    work.set_defaults(run=_worker)

    serve = commands.add_parser(
        "serve", help="serve an app folder's agent over HTTP/SSE",
        description=SERVE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("app", type=Path, metavar="APP_DIR", help="the app folder")
    _app_store_options(serve)
    serve.add_argument("--no-drive", dest="drive", action="store_false",
                       help="accept turns and answer from the store, drive nothing: "
                            "'durable-turns worker' processes drive (the production shape)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="the address to bind (loopback only without authentication)")
    serve.add_argument("--auth", metavar="MODULE:FUNCTION",
                       help="authenticate(request) → the caller's principal (default: "
                            "agent.py's authenticate, if any)")
    serve.add_argument("--port", type=int, default=8000, help="default %(default)s")
    serve.add_argument("--channel", action="append", metavar="NAME",
                       help="also serve this channel (repeatable): 'slack' serves "
                            "/slack/events and /slack/actions, reading SLACK_SIGNING_SECRET "
                            "and SLACK_BOT_TOKEN (extra 'slack'); agent.py's channels add "
                            "more")
    serve.add_argument("--slack", action="store_true", help="deprecated: --channel slack")
    serve.add_argument("--expose-api", action="store_true",
                       help="with --channel and no authentication, serve the API and the "
                            "console too (development mode: 'by' comes from request bodies); "
                            "without it only the channels' routes are served")
    serve.set_defaults(run=_serve)

    receive = commands.add_parser(
        "receive", help="run a turn nobody typed and deliver it to a channel (F9)",
        description="Start a turn from a seed (a system cron, any scheduler), run it to its "
                    "end, and deliver it through the channel; a delivery a crash left owed is "
                    "made first. The Slack channel reads SLACK_BOT_TOKEN (and SLACK_API_URL "
                    "if set). Prints the turn's result as JSON. Exit status: 0 delivered, 1 "
                    "the turn or the delivery failed, 2 bad input.")
    receive.add_argument("app", type=Path, metavar="APP_DIR", help="the app folder")
    receive.add_argument("--channel", required=True, metavar="NAME",
                         help="the channel that delivers: 'slack', or one of agent.py's "
                              "channels")
    receive.add_argument("--target", required=True, metavar="CHANNEL_ID",
                         help="where it delivers (Slack: the channel id to post in, C…)")
    receive.add_argument("--seed", required=True, help="the text that opens the turn")
    receive.add_argument("--by", default="system",
                         help="who starts it, e.g. cron:daily (default %(default)s)")
    receive.add_argument("--kind", default="proactive", help="the trigger's kind")
    receive.add_argument("--session", help="the session (default: KIND:BY)")
    receive.add_argument("--turn-id", metavar="ID",
                         help="the turn's id: the same id again is the same turn, delivered "
                              "once (default: a new one)")
    _app_store_options(receive)
    receive.set_defaults(run=_receive)

    chat = commands.add_parser(
        "chat", help="talk to an app folder's agent in the terminal",
        description="A terminal chat with the app folder's agent: streamed text, a line per "
                    "tool call and result, approvals asked inline. Ctrl-C during a turn "
                    "cancels it; Ctrl-D (or Ctrl-C at the prompt) quits. The session lives "
                    "in the SQLite file, so a chat picks up where it left off.")
    chat.add_argument("app", type=Path, metavar="APP_DIR", help="the app folder")
    _app_store_options(chat, store=False)
    chat.add_argument("--session", default="chat", help="the session (default %(default)s)")
    chat.add_argument("--user", type=_name, metavar="USER",
                      help="who types (default: the operating-system user)")
    chat.set_defaults(run=_chat)

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


def _order_id(text: str) -> str:
    if not ORDER_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an order id (1-40 letters, digits, '-' or '_')"
        )
    return text


def _amount(text: str) -> float:
    try:
        value = float(text.removeprefix("$"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount of dollars") from None
    if not 0 < value <= 1_000_000 or round(value, 2) != value:
        raise argparse.ArgumentTypeError(
            f"{text!r}: an amount is above 0, at most 1000000, in whole cents"
        )
    return value


def _name(text: str) -> str:
    if not text.strip() or text != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: a name is non-empty, without spaces "
                                         "around it")
    return text


def _os_user() -> str | None:
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if name:
        return name
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry, as in some containers
        return None


def _model(spec: str | None) -> ModelChoice:
    """The model choice of ``--model`` (or the environment's).

    Raises:
        ConfigurationError: an unusable ``--model``, said as such.
    """
    try:
        return choose_model(spec, os.environ)
    except ConfigurationError as e:
        raise ConfigurationError(f"--model: {e}") from None


def _fail(command: str, message: str, code: int) -> int:
    make_console(stderr=True).print(f"{PROG} {command}: error: {message}",
                                    style="bold red", markup=False, highlight=False)
    return code


_DEMO_ERRORS: tuple[tuple[type[Exception], int], ...] = ((DemoInputError, 2), (DemoFailure, 1))
"""The demo's own exceptions, before ``errors.ERRORS``: its messages are the whole story."""


def _run(command: str, work: Callable[[], int], *, timed_out: str = "timed out",
         unknown: Callable[[Exception], str] | None = None) -> int:
    """Run a command and answer what it raises: an exception of ``errors.ERRORS`` (or the
    demo's) becomes ``PROG COMMAND: error: …`` and its exit status; a failure of the
    command itself (exit 1) names its type. Anything else is ``unknown``'s message with exit
    1, or, without ``unknown``, a bug that shows its traceback.

    Args:
        timed_out: the message of a ``TimeoutError`` that has none.
    """
    try:
        return work()
    except Exception as e:
        for cls, code in _DEMO_ERRORS:
            if isinstance(e, cls):
                return _fail(command, str(e), code)
        kind = error_kind(e)
        if kind is None:
            if unknown is None:
                raise
            return _fail(command, unknown(e), 1)
        message = str(e) or (timed_out if isinstance(e, TimeoutError) else type(e).__name__)
        if kind.exit_code == 1 and isinstance(e, DurableTurnsError):
            message = f"{type(e).__name__}: {e}"
        return _fail(command, message, kind.exit_code)


def _demo(args: argparse.Namespace) -> int:
    def work() -> int:
        opts = DemoOptions(db=args.db, keep=args.keep, kill_at=args.kill_at,
                           model=_model(args.model))
        return asyncio.run(run_demo(opts, make_console()))

    return _run("demo", work)


def _demo_worker(args: argparse.Namespace) -> int:
    if args.kill_at is not None and args.control_fd is None:
        return _fail("demo-worker", "--kill-at needs --control-fd", 2)
    opts = WorkerOptions(db=args.db, session=args.session, turn_id=args.turn,
                         delivery=args.delivery, kill_at=args.kill_at,
                         control_fd=args.control_fd, model=args.model)
    return _run("demo-worker", lambda: asyncio.run(run_worker(opts, make_console())),
                timed_out=f"turn {args.turn} did not end in time")


def _refund(args: argparse.Namespace) -> int:
    user = args.user or _os_user()
    if user is None:
        return _fail("refund", "who is asking? $USER is not set: pass --user", 2)

    def work() -> int:
        opts = RefundOptions(db=args.db, order_id=args.order, amount=args.amount, user=user,
                             approver=args.approver, session=args.session,
                             model=_model(args.model))
        return asyncio.run(run_refund(opts, make_console()))

    return _run("refund", work, timed_out="the turn did not end in time")


def _approve(args: argparse.Namespace) -> int:
    by = args.by or _os_user()
    if by is None:
        return _fail("approve", "who is answering? $USER is not set: pass --by", 2)

    def work() -> int:
        opts = ApproveOptions(db=args.db, turn_id=args.turn, input_id=args.input,
                              approve=not args.deny, by=by, session=args.session,
                              model=_model(args.model))
        return asyncio.run(run_approve(opts, make_console()))

    return _run("approve", work, timed_out="the turn did not end in time")


def _pending(args: argparse.Namespace) -> int:
    return _run("pending", lambda: asyncio.run(run_pending(args.db, make_console())))


def _sessions(args: argparse.Namespace) -> int:
    return _run(f"sessions {args.action}", lambda: asyncio.run(session_action(args)))


def _sessions_retry(args: argparse.Namespace) -> int:
    return _run("sessions retry", lambda: asyncio.run(retry(args)))


def _replay(args: argparse.Namespace) -> int:
    return _run("replay", lambda: asyncio.run(replay_action(args)))


def _worker(args: argparse.Namespace) -> int:
    return _run("worker", lambda: asyncio.run(_work(args)))


async def _work(args: argparse.Namespace) -> int:
    agent = load_agent(args.app)
    model = resolve_model(args.model) if args.model else None
    if agent.model is None and model is None:
        raise ConfigurationError(f"{args.app}'s agent.py names no model: pass --model")
    store = store_from_spec(args.store, lease_ttl=args.lease_ttl)
    async with Runtime([agent], store, model) as rt:
        print(f"worker of agent {agent.name!r} on {where(args.store, store)}: driving queued "
              "turns", flush=True)
        await rt.work(poll_interval=args.poll_interval, max_sessions=args.max_sessions)
    return 0


DEV_MODE_HINT = ("to authenticate callers, define authenticate(request) in the app folder's "
                 "agent.py or pass --auth MODULE:FUNCTION")


def _serve(args: argparse.Namespace) -> int:
    return _run("serve", lambda: _serving(args))


def _serving(args: argparse.Namespace) -> int:
    from .server import is_loopback
    from .server.run import loop_factory, serve  # uvicorn and Starlette: this command only

    if args.slack:
        print(f"{PROG} serve: --slack is deprecated; use --channel slack", file=sys.stderr)
    app = load_app(args.app)
    authenticate = load_callable(args.auth) if args.auth else app.authenticate
    names = [*(args.channel or []), *(["slack"] if args.slack else [])]
    # A channel behind a tunnel without authentication: its own routes only, unless asked.
    api = authenticate is not None or not names or args.expose_api
    if authenticate is None and api and not is_loopback(args.host):
        raise ConfigurationError(
            f"development mode (no authentication) serves loopback only, not "
            f"{args.host!r}: {DEV_MODE_HINT}")
    channels = [channel_from_env(n, factories=app.channels) for n in dict.fromkeys(names)]
    agent, runtime, where_ = _app_runtime(args, app.agent)
    drives = "" if args.drive else "; not driving: 'durable-turns worker' processes do"
    auth = (f"authentication: {args.auth or f'{args.app}/agent.py:authenticate'}"
            if authenticate is not None else
            f"development mode: 'by' comes from request bodies; {DEV_MODE_HINT}" if api else
            f"serving the channels' routes only ({', '.join(f'/{n}/' for n in names)}): no "
            f"authentication, so the API and the console are not exposed (--expose-api "
            f"serves them too); {DEV_MODE_HINT}")

    def ready(url: str) -> None:
        at = f"{url}/agents/{agent.name}/sessions" if api else f"{url}/{names[0]}/"
        print(f"serving agent {agent.name!r} at {at} "
              f"(store {where_}{drives}); SIGTERM or Ctrl-C stops", flush=True)
        print(auth, flush=True)

    with asyncio.Runner(loop_factory=loop_factory()) as runner:  # uvloop, as uvicorn
        runner.run(serve(runtime, host=args.host, port=args.port, on_ready=ready,
                         authenticate=authenticate, channels=channels, api=api))
    return 0


def _receive(args: argparse.Namespace) -> int:
    return _run("receive", lambda: _receiving(args), unknown=lambda e: (
        f"the delivery failed ({type(e).__name__}: {e}); run the same command again (with "
        "--turn-id) to deliver it"))


def _receiving(args: argparse.Namespace) -> int:
    from .channels import mount_agent, receive, recover_deliveries
    from .inbound import Trigger

    app = load_app(args.app)
    channel = channel_from_env(args.channel, factories=app.channels)
    agent, runtime, _where = _app_runtime(args, app.agent)
    check_surfaces(agent, [channel.name])

    async def run() -> TurnResult:
        async with runtime:
            await runtime.recover()
            ctx = mount_agent(agent, runtime)
            await recover_deliveries(channel, ctx)
            return await receive(
                channel, ctx, seed=args.seed, target={"channel_id": args.target},
                trigger=Trigger(kind=args.kind, by=args.by), session=args.session,
                turn_id=args.turn_id)

    result = asyncio.run(run())
    print(json.dumps(result.to_dict()), flush=True)
    return 0 if result.status in ("completed", "suspended") else 1


def _app_runtime(args: argparse.Namespace,
                 agent: Agent | None = None) -> tuple[Agent, Runtime, str]:
    """The app's agent, a runtime on ``--db`` or ``--store``, and how to name the store."""
    agent = agent or load_agent(args.app)
    model = resolve_model(args.model) if args.model else None
    if agent.model is None and model is None:
        raise ConfigurationError(f"{args.app}'s agent.py names no model: pass --model")
    spec = getattr(args, "store", None)
    store = store_from_spec(spec) if spec else SqliteStore(args.db)
    runtime = Runtime([agent], store, model, drive=getattr(args, "drive", True))
    return agent, runtime, where(spec, store) if spec else str(args.db)


def _chat(args: argparse.Namespace) -> int:
    user = args.user or _os_user()
    if user is None:
        return _fail("chat", "who is typing? $USER is not set: pass --user", 2)
    return _run("chat", lambda: _chatting(args, user))


def _chatting(args: argparse.Namespace, user: str) -> int:
    from .channels import mount_agent
    from .channels.repl import SOURCE, chat

    agent, runtime, _where = _app_runtime(args)
    check_surfaces(agent, [SOURCE])

    async def run() -> None:
        async with runtime:
            await runtime.recover()
            await chat(mount_agent(agent, runtime), session=args.session, user=user)

    asyncio.run(run())
    return 0


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
