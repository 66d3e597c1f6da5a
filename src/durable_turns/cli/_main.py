"""``durable-turns``: the command line, and the package's composition root.

This folder is the only place that runs an event loop (``asyncio.run``, here and in the
command modules beside it); everything it starts is a coroutine of a lower layer. The
commands:

- ``demo`` (and ``demo refund|approve|pending``): the demo's stories (``_demo``);
- ``pending``, ``approve``, ``deny``: any app's parked turns (``_approvals``);
- ``sessions list|show|cancel|reset|retry`` (``_sessions``);
- ``temporal-worker`` and ``--temporal`` (``_temporal``);
- ``new``: a new app folder from a template (``_new``);
- ``serve``, ``worker``, ``receive``, ``chat``: an app folder's agent at work (here;
  ``serve --reload`` in ``_reload``).

No command shows a traceback for what a person can get wrong: exit 0 success, 1 the command
ran and failed, 2 bad input (a usage error, a bad path, port or model, a database that is
another app's), 130 interrupted, 141 its output was closed (``… | head``). What a command
raises is mapped once, by ``errors.ERRORS`` (``_args.run_command``); a usage error is one
line too (``_args.Parser``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..agent import check_surfaces
from ..channels._registry import channel_from_env
from ..commands import COMMANDS, Registry
from ..errors import ConfigurationError, DurableTurnsError, error_kind
from ..records import TurnResult
from ..runtime import Runtime
from ..scheduling import ClaimingScheduler, NoDriveScheduler
from ._approvals import add_approval_commands
from ._args import (
    MODEL_HELP,
    PROG,
    Parser,
    agent_of,
    app_dir,
    fail,
    load,
    name,
    needs_model_of,
    os_user,
    port,
    run_command,
    store_of,
    store_options,
)
from ._demo import add_demo_commands
from ._new import add_new_command
from ._reload import reload_serving
from ._schedules import add_schedules_command, put_app_schedules
from ._sessions import (
    add_replay_command,
    add_session_commands,
    replay_action,
    retry,
    session_action,
)
from ._temporal import add_temporal_commands, add_temporal_options, scheduler_of

SERVE_HELP = """\
Serve the app folder's agent over HTTP with server-sent events (F12): the routes under
/agents/AGENT/sessions/ID, described at /openapi.json, and the web console at /. Unfinished
turns in the store are recovered at start. SIGTERM shuts down gracefully: streams close,
running turns get a grace period, anything cut short replays on the next start.

Authentication: define authenticate(request) in APP_DIR/agent.py, or pass --auth
MODULE:FUNCTION (or FILE.py:FUNCTION). It returns the caller's principal (its "id" is the
speaker and the answerer), or None to refuse with 401; it may be async. Without it the
server is in development mode: "by" comes from the request body, so it binds loopback only.
"""
EXIT_STATUS = """\
exit status: 0 done, 1 the command ran and failed, 2 bad input (a bad path, port, model or
app folder), 130 interrupted, 141 its output was closed (… | head).
"""
DEV_MODE_HINT = ("to authenticate callers, define authenticate(request) in the app folder's "
                 "agent.py or pass --auth MODULE:FUNCTION")


def _version() -> str:
    try:
        return version("durable-turns")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def build_parser(registry: Registry = COMMANDS) -> argparse.ArgumentParser:
    """The ``durable-turns`` argument parser (``sessions``' verbs from ``registry``)."""
    parser = Parser(
        prog=PROG,
        description="A durable process for every LLM agent turn: checkpointed steps, replay "
                    "after a crash, tools with delivery guarantees.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_demo_commands(commands)
    add_new_command(commands)

    serve = commands.add_parser(
        "serve", help="serve an app folder's agent over HTTP/SSE, with its web console",
        description=SERVE_HELP, epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("app", type=Path, metavar="APP_DIR", help="the app folder")
    store_options(serve, default_db=Path("durable_turns.db"))
    serve.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    serve.add_argument("--no-drive", dest="drive", action="store_false",
                       help="accept turns and answer from the store, drive nothing: "
                            "'durable-turns worker' processes drive (the production shape)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="the address to bind (loopback only without authentication)")
    serve.add_argument("--auth", metavar="MODULE:FUNCTION",
                       help="authenticate(request) → the caller's principal (default: "
                            "agent.py's authenticate, if any)")
    serve.add_argument("--port", type=port, default=8000,
                       help="the TCP port, 1 to 65535 (default %(default)s)")
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
    serve.add_argument("--reload", action="store_true",
                       help="restart the server whenever a file of the app folder changes "
                            "(the store, and so every session, is kept)")
    add_temporal_options(serve, required=False)
    serve.set_defaults(run=_serve)

    chat = commands.add_parser(
        "chat", help="talk to an app folder's agent in the terminal",
        description="A terminal chat with the app folder's agent: streamed text, a line per "
                    "tool call and result, approvals asked inline. Ctrl-C during a turn "
                    "cancels it; Ctrl-D or Ctrl-C at a prompt ends the chat (a turn waiting "
                    "for an answer stays parked). The session lives in the store, so a "
                    "chat picks up where it left off, a waiting request included: answer it, "
                    "or type /cancel to withdraw it.", epilog=EXIT_STATUS)
    chat.add_argument("app", type=Path, metavar="APP_DIR", help="the app folder")
    store_options(chat, default_db=Path("durable_turns.db"))
    chat.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    chat.add_argument("--session", type=name, default="chat",
                      help="the session (default %(default)s)")
    chat.add_argument("--user", type=name, metavar="USER",
                      help="who types (default: the operating-system user)")
    chat.set_defaults(run=_chat)
    add_approval_commands(commands)

    sessions = commands.add_parser(
        "sessions", help="operate on a store's sessions",
        description="Operate on the sessions of a store: a SQLite file (--db) or PostgreSQL "
                    "(--store postgresql://…).")
    add_session_commands(sessions, run_action=_sessions, run_retry=_sessions_retry,
                         commands=registry)
    add_replay_command(commands, run=_replay)
    add_schedules_command(commands)

    work = commands.add_parser(
        "worker", help="drive an app's queued turns from a shared store, until interrupted",
        description="Be one of many workers of an app: drive every session with a queued or "
                    "running turn, taking over the sessions of workers that died (their "
                    "leases expire). Turns are accepted elsewhere (a Runtime with "
                    "NoDriveScheduler, a server) into the same store.", epilog=EXIT_STATUS)
    work.add_argument("app", type=Path, metavar="APP_DIR", help="the app folder (its agent)")
    work.add_argument("--store", required=True, metavar="DSN_OR_PATH",
                      help="postgresql://… or 'host=… dbname=…' (PostgreSQL, extra "
                           "'postgres'), or a SQLite file")
    work.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    work.add_argument("--lease-ttl", type=float, default=15.0, metavar="SECONDS",
                      help="PostgreSQL: how long a dead worker's sessions wait for takeover")
    work.add_argument("--poll-interval", type=float, default=0.5, metavar="SECONDS",
                      help="seconds between looks for new work")
    work.add_argument("--max-sessions", type=int, default=100, metavar="N",
                      help="sessions this worker drives at once, at most (the rest are left "
                           "to other workers)")
    work.set_defaults(run=_worker)
    add_temporal_commands(commands, epilog=EXIT_STATUS)

    receive = commands.add_parser(
        "receive", help="run a turn nobody typed and deliver it to a channel (F9)",
        description="Start a turn from a seed (a system cron, any scheduler), run it to its "
                    "end, and deliver it through the channel; a delivery a crash left owed is "
                    "made first. The Slack channel reads SLACK_BOT_TOKEN (and SLACK_API_URL "
                    "if set); delivering needs no signing secret. Prints the turn's result as "
                    "JSON. Exit status: 0 delivered, 1 the turn or the delivery failed (run "
                    "it again with the same --turn-id), 2 bad input.")
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
    store_options(receive, default_db=Path("durable_turns.db"))
    receive.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    receive.set_defaults(run=_receive)
    return parser


def _sessions(args: argparse.Namespace) -> int:
    return run_command(f"sessions {args.action}", lambda: asyncio.run(session_action(args)))


def _sessions_retry(args: argparse.Namespace) -> int:
    return run_command("sessions retry", lambda: asyncio.run(retry(args)))


# -- worker ----------------------------------------------------------------------------------


def _replay(args: argparse.Namespace) -> int:
    return run_command("replay", lambda: asyncio.run(replay_action(args)))


def _worker(args: argparse.Namespace) -> int:
    return run_command("worker", lambda: asyncio.run(_work(args)))


async def _work(args: argparse.Namespace) -> int:
    app = load(app_dir(args), args.model)
    agent = app.agent
    make, named = store_of(args, create=True, lease_ttl=args.lease_ttl)
    scheduler = ClaimingScheduler(poll_interval=args.poll_interval,
                                  max_sessions=args.max_sessions)
    async with Runtime([agent], make(), scheduler=scheduler) as runtime:
        await put_app_schedules(runtime, app)  # and its clock fires every schedule
        print(f"worker of agent {agent.name!r} on {named}: driving queued turns", flush=True)
        await scheduler.run()
    return 0


# -- serve -----------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    if args.reload:
        return run_command("serve", lambda: reload_serving(args, args.argv, app_dir(args)))
    return run_command("serve", lambda: _serving(args))


def _serving(args: argparse.Namespace) -> int:
    from ..server import is_loopback
    from ..server.run import Listening, loop_factory, serve  # uvicorn: this command only

    if args.slack:
        print(f"{PROG} serve: --slack is deprecated; use --channel slack", file=sys.stderr)
    app = load(app_dir(args), args.model)
    authenticate = app.authenticate
    if args.auth:
        from .._loader import load_callable

        authenticate = load_callable(args.auth)
    names = [*(args.channel or []), *(["slack"] if args.slack else [])]
    # A channel behind a tunnel without authentication: its own routes only, unless asked.
    api = authenticate is not None or not names or args.expose_api
    if authenticate is None and api and not is_loopback(args.host):
        raise ConfigurationError(
            f"development mode (no authentication) serves loopback only, not "
            f"{args.host!r}: {DEV_MODE_HINT}")
    channels = [channel_from_env(n, factories=app.channels) for n in dict.fromkeys(names)]
    make, named = store_of(args, create=True)
    temporal = scheduler_of(args)
    scheduler = temporal or (None if args.drive else NoDriveScheduler())
    runtime = Runtime([app.agent], make(), scheduler=scheduler)
    drives = "" if scheduler is None else (
        "; not driving: 'durable-turns temporal-worker' processes do" if temporal else
        "; not driving: 'durable-turns worker' processes do")
    auth = (f"authentication: {args.auth or f'{args.app}/agent.py:authenticate'}"
            if authenticate is not None else
            f"development mode: 'by' comes from request bodies; {DEV_MODE_HINT}" if api else
            f"serving the channels' routes only ({', '.join(f'/{n}/' for n in names)}): no "
            f"authentication, so the API and the console are not exposed (--expose-api "
            f"serves them too); {DEV_MODE_HINT}")
    agent = app.agent.name

    storing: list[asyncio.Task[Any]] = []

    def listening(at: Listening) -> None:
        if app.schedules:  # agent.py's, once it serves (the port bound, the store open)
            storing.append(asyncio.get_running_loop().create_task(
                put_app_schedules(runtime, app)))
            storing[-1].add_done_callback(_schedules_stored)
        where = f"{at.url}/agents/{agent}/sessions" if api else at.url
        print(f"serving agent {agent!r} at {where} (store {named}{drives}); SIGTERM or "
              "Ctrl-C stops", flush=True)
        if api:
            print(f"console: {at.url}/  (open it in a browser)", flush=True)
        for channel, routes in at.channel_routes.items():
            paths = ", ".join(f"{r.split(' ', 1)[0]} {at.url}{r.split(' ', 1)[-1]}"
                              for r in routes)
            print(f"channel {channel}: {paths}", flush=True)
        print(auth, flush=True)

    with asyncio.Runner(loop_factory=loop_factory()) as runner:  # uvloop, as uvicorn
        runner.run(serve(runtime, host=args.host, port=args.port, on_listening=listening,
                         authenticate=authenticate, channels=channels, api=api))
    return 0


def _schedules_stored(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        print(f"{PROG} serve: agent.py's schedules were not stored: {task.exception()}",
              file=sys.stderr, flush=True)


# -- receive ---------------------------------------------------------------------------------


class DeliveryError(DurableTurnsError):
    """``receive``: the turn ran (or was found) but its delivery through the channel failed;
    it stays owed, and the same command with the same ``--turn-id`` delivers it."""


def _receive(args: argparse.Namespace) -> int:
    return run_command("receive", lambda: _receiving(args))


def _receiving(args: argparse.Namespace) -> int:
    from ..channels import mount_agent, receive, recover_deliveries
    from ..inbound import Trigger

    folder = app_dir(args)
    app = load(folder, args.model, needs_model=False)
    channel = channel_from_env(args.channel, factories=app.channels)  # its settings first
    needs_model_of(app.agent, folder)  # then the model, which the turn needs
    make, _named = store_of(args, create=True)
    runtime = Runtime([app.agent], make())
    check_surfaces(app.agent, [channel.name])

    async def run() -> TurnResult:
        async with runtime:
            await runtime.recover()
            ctx = mount_agent(app.agent, runtime)
            try:
                await recover_deliveries(channel, ctx)
                return await receive(
                    channel, ctx, seed=args.seed, target={"channel_id": args.target},
                    trigger=Trigger(kind=args.kind, by=args.by), session=args.session,
                    turn_id=args.turn_id)
            except Exception as e:
                if error_kind(e) is not None:
                    raise
                # The platform's own failure (its SDK's error, a connection refused): the
                # turn is stored and its delivery owed, so the same command finishes it.
                raise DeliveryError(
                    f"the delivery failed ({type(e).__name__}: {e}); run the same command "
                    "again (with --turn-id) to deliver it") from e

    result = asyncio.run(run())
    print(json.dumps(result.to_dict()), flush=True)
    return 0 if result.status in ("completed", "suspended") else 1


# -- chat ------------------------------------------------------------------------------------


def _chat(args: argparse.Namespace) -> int:
    user = args.user or os_user()
    if user is None:
        return fail("chat", "who is typing? $USER is not set: pass --user", 2)
    return run_command("chat", lambda: _chatting(args, user))


def _chatting(args: argparse.Namespace, user: str) -> int:
    from ..channels import mount_agent
    from ..channels._repl import SOURCE, chat

    agent = agent_of(args)
    make, _named = store_of(args, create=True)
    runtime = Runtime([agent], make())
    check_surfaces(agent, [SOURCE])

    async def run() -> None:
        async with runtime:
            await runtime.recover()
            await chat(mount_agent(agent, runtime), session=args.session, user=user)

    asyncio.run(run())
    return 0


def main(argv: Sequence[str] | None = None, *, commands: Registry = COMMANDS) -> int:
    """Run ``durable-turns`` with ``argv`` (default: the process's arguments); ``commands``:
    the registry ``sessions``' verbs come from.

    Returns:
        The exit status (see the module's docstring).
    """
    given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(commands).parse_args(given)
    args.argv = given
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    return code


__all__ = [
    "DEV_MODE_HINT",
    "EXIT_STATUS",
    "SERVE_HELP",
    "DeliveryError",
    "build_parser",
    "main",
]
