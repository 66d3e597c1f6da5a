"""``durable-turns sessions …``: list and show the sessions of a store, SQLite or PostgreSQL,
and give them commands — a verb for each command of the registry that declares one (cancel,
reset, retry, and any a runtime adds: ``commands.registry.Verb``).

Every read goes through ``Runtime.queries`` and :class:`~durable_turns.AgentSession`; the
commands raise, and ``durable_turns.cli`` turns what they raise into a message and an exit
status (``errors.ERRORS``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..agent import Agent
from ..commands import COMMANDS, Registry
from ..errors import ConfigurationError
from ..messages import Message
from ..models.scripted import scripted
from ..records import ChainEntry, SessionSummary
from ..replay import replay
from ..runtime import Runtime
from ..scheduling import NoDriveScheduler
from ._args import MODEL_HELP, app_dir, app_options, load, store_of, store_options

LEASE_WAIT = 30.0
"""How long a ``sessions`` command waits for a process that drives the session."""
SESSION_ACTIONS = {
    "list": "list the store's sessions, newest first per agent, with status",
    "show": "print a session's status, park, turns and transcript",
}
"""The reads of ``durable-turns sessions`` (its other verbs are the registry's commands)."""
Command = Callable[[argparse.Namespace], int]


def add_session_commands(sessions: argparse.ArgumentParser, *, run_action: Command,
                         run_retry: Command, commands: Registry = COMMANDS) -> None:
    """The subcommands of ``durable-turns sessions``: its reads, and a verb per command of
    ``commands`` that declares one.

    Args:
        sessions: the ``sessions`` parser.
        run_action: runs the reads and the commands' verbs (the CLI's wrapper of
            :func:`session_action`).
        run_retry: runs ``retry``, whose verb has a runner of its own (the CLI's wrapper of
            :func:`retry`).
        commands: the registry the verbs come from.
    """
    verbs = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)
    if "retry" in commands:
        _add_retry(verbs, run_retry)
    for name, summary in SESSION_ACTIONS.items():
        cmd = verbs.add_parser(name, help=summary, description=summary + ".")
        if name != "list":
            cmd.add_argument("session", metavar="AGENT/ID", type=_session_key,
                             help="the session, as agent/session")
        else:
            cmd.add_argument("--agent", metavar="NAME", help="only this agent's sessions")
        store_options(cmd)
        cmd.set_defaults(run=run_action, commands=commands)
    for spec in commands:
        verb = spec.verb
        if verb is None or verb.run is None:
            continue
        cmd = verbs.add_parser(spec.name, help=verb.help, description=verb.help + ".")
        cmd.add_argument("session", metavar="AGENT/ID", type=_session_key,
                         help="the session, as agent/session")
        store_options(cmd)
        for arg in verb.args:
            cmd.add_argument(*arg.flags, **arg.options)
        cmd.set_defaults(run=run_action, commands=commands, verb=verb)


def _add_retry(verbs: Any, run_retry: Command) -> None:
    again = verbs.add_parser(
        "retry", help="re-open a failed turn where it failed",
        description="Re-open a failed turn at its failed step: finished steps stay, a failed "
                    "model call is asked again. With APP_DIR the app's agent drives it to its "
                    "end here; without, it is queued for the app's next worker "
                    "(Runtime.recover()).")
    again.add_argument("app", nargs="?", type=Path, metavar="APP_DIR",
                       help="the app folder whose agent drives the turn")
    store_options(again)
    again.add_argument("--turn", required=True, metavar="TURN", help="the failed turn's id")
    again.add_argument("--session", metavar="AGENT/ID",
                       help="the turn's session, if two sessions have a turn of that id")
    again.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    again.set_defaults(run=run_retry)


def _session_key(text: str) -> tuple[str, str]:
    agent, sep, session = text.partition("/")
    if not sep or not agent or not session:
        raise argparse.ArgumentTypeError(f"{text!r}: expected AGENT/ID")
    return agent, session


async def session_action(args: argparse.Namespace) -> int:
    """``sessions list|show`` and a command's verb (``cancel``, ``reset``, …); returns the
    exit status.

    Raises:
        LookupError: the store or the session does not exist.
        StoreError: the store cannot be opened.
    """
    make, named = store_of(args, create=False)
    if args.action == "list":
        async with Runtime([], make(), scheduler=NoDriveScheduler()) as rt:
            agents = [args.agent] if args.agent else await rt.queries.agents()
            for name in agents:
                for found in await rt.queries.sessions(name):
                    print(f"{found.key}\t{found.status}\tgeneration {found.generation}")
        return 0
    agent, session_id = args.session
    # A queued command runs on the session's chain, so this runtime drives it; the model is
    # never asked (the turns a reset cancels stop before their next model call).
    async with Runtime([Agent(agent)], make(), scripted([]), lease_timeout=LEASE_WAIT,
                       commands=args.commands) as rt:
        session = rt.session(agent, session_id)
        summary = await session.summary()
        if not summary.exists:
            raise LookupError(f"{named} has no session {session.key}")
        verb = getattr(args, "verb", None)
        if verb is not None:
            print(await verb.run(session, args))
        else:
            _show(summary, await session.turns(), await session.transcript())
        await rt.idle()
    return 0


async def retry(args: argparse.Namespace) -> int:
    """``sessions retry``; returns the exit status (0 re-opened, or driven to completion).

    Raises:
        LookupError: the store does not exist, no session or two have the turn.
        ConfigurationError: the app folder is another agent's, or names no model.
        TurnConflictError: the turn did not fail, or a later turn ran after it.
    """
    make, named = store_of(args, create=False)
    async with Runtime([], make(), scheduler=NoDriveScheduler()) as probe:
        keys = await probe.queries.find_turn(args.turn)
    if args.session:
        keys = [k for k in keys if str(k) == args.session]
    if not keys:
        raise LookupError(f"no session of {named} has a turn {args.turn!r}")
    if len(keys) > 1:
        raise LookupError(f"turn {args.turn!r} is in {len(keys)} sessions "
                          f"({', '.join(map(str, keys))}); name one with --session AGENT/ID")
    (key,) = keys
    agent = load(args.app, args.model).agent if args.app else Agent(key.agent)
    if agent.name != key.agent:
        raise ConfigurationError(f"{args.app} is agent {agent.name!r}; the turn is {key}'s")
    scheduler = None if args.app is not None else NoDriveScheduler()
    async with Runtime([agent], make(), scheduler=scheduler) as rt:
        session = rt.session(key.agent, key.session)
        await session.retry(args.turn)
        if args.app is None:
            print(f"turn {args.turn} of {key} re-opened; the app's next worker drives it "
                  "(Runtime.recover())")
            return 0
        result = await session.result(args.turn)
    print(f"turn {args.turn} of {key}: {result.status}"
          + (f": {result.text}" if result.text else "")
          + (f": {result.error}" if result.error else ""))
    return 0 if result.status == "completed" else 1


def add_replay_command(commands: Any, *, run: Command) -> None:
    """``durable-turns replay``: a recorded session's turns again, another model answering.

    Args:
        commands: the CLI's subparsers.
        run: runs it (the CLI's wrapper of :func:`replay_action`).
    """
    cmd = commands.add_parser(
        "replay", help="replay a recorded session against another model or prompt",
        description="Run a recorded session's turns again in a new session (a fork before its "
                    "first turn) with the app's agent and --model, the tools answered from "
                    "what they returned then (none runs), and print what differs turn by "
                    "turn. Exit status 0: every turn came out the same; 1: some differ.")
    cmd.add_argument("session", metavar="AGENT/ID", type=_session_key,
                     help="the recorded session, as agent/session")
    app_options(cmd)  # the folder after the session, or --app, as pending and approve take it
    cmd.add_argument("--model", metavar="PROVIDER:NAME",
                     help="the model to replay with (default: the app's); " + MODEL_HELP)
    store_options(cmd)
    cmd.add_argument("--tools", choices=("recorded", "live"), default="recorded",
                     help="a call the recording lacks: an error result for the model "
                          "(recorded, the default) or the real tool (live)")
    cmd.add_argument("--to", metavar="ID", help="the replay's session id (default: new)")
    cmd.add_argument("--json", action="store_true", help="print the report as JSON")
    cmd.set_defaults(run=run)


async def replay_action(args: argparse.Namespace) -> int:
    """``replay``; returns 0 when every turn came out the same, else 1.

    Raises:
        LookupError: the store or the session does not exist.
        ConfigurationError: the app folder is another agent's, or names no model.
    """
    folder = app_dir(args)
    make, named = store_of(args, create=False)
    agent = load(folder, args.model).agent  # --model replaces the app's
    name, session_id = args.session
    if agent.name != name:
        raise ConfigurationError(f"{folder} is agent {agent.name!r}; the session is "
                                 f"{name}/{session_id}")
    async with Runtime([agent], make(), scheduler=NoDriveScheduler()) as rt:
        session = rt.session(name, session_id)
        if not (await session.summary()).exists:
            raise LookupError(f"{named} has no session {session.key}")
        report = await replay(session, model=agent.model, tools=args.tools, to=args.to)
    print(json.dumps(report.to_dict()) if args.json else report.render())
    return 0 if report.identical else 1


def _show(summary: SessionSummary, turns: list[ChainEntry], transcript: list[Message]) -> None:
    print(f"{summary.key}: {summary.status}, generation {summary.generation}")
    pending = summary.pending
    if pending is not None:
        print(f"parked: turn {pending.turn_id} waits for input {pending.id!r}: "
              f"{pending.prompt}")
    for t in turns:
        print(f"turn {t.turn_id}: {t.status.value}"
              + "".join(f" — {v}" for v in (t.text, t.error, t.reason) if v))
    for m in transcript:
        calls = ", ".join(f"{c.name}({json.dumps(c.input)})" for c in m.tool_calls)
        body = m.text or calls or json.dumps(m.result)
        print(f"  {m.role:<9} {body}")


__all__ = ["LEASE_WAIT", "SESSION_ACTIONS", "Command", "add_replay_command",
           "add_session_commands", "replay_action", "retry", "session_action"]
