"""``durable-turns schedules APP_DIR list|add|remove`` (F24): an app's schedules in its store;
and the app folder's own (``schedules = [...]`` in ``agent.py``), which ``serve`` and
``worker`` store when they start."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from .._loader import App
from ..runtime import Runtime
from ..schedules import MISSED, OVERLAP, Schedule
from ..scheduling import NoDriveScheduler
from ._args import app_dir, load, run_command, store_of, store_options

__all__ = ["add_schedules_command", "put_app_schedules"]

EPILOG = ("exit status: 0 done, 1 the command ran and failed, 2 bad input (a bad schedule, "
          "an unknown one, a bad app folder or store)")


async def put_app_schedules(runtime: Runtime, app: App) -> list[Schedule]:
    """Store the app folder's ``schedules`` (an unchanged one keeps its times)."""
    return [await runtime.schedule(**spec) for spec in app.schedules]


def add_schedules_command(commands: Any) -> None:
    """Add ``schedules list|add|remove`` to the CLI's subcommands."""
    cmd = commands.add_parser(
        "schedules", help="list, add or remove an app's schedules (proactive turns at times)",
        description="The schedules of an app's store: each of its times starts a turn "
                    "nobody typed (a trigger message), once, whichever worker fires it. "
                    "'serve' and 'worker' fire them (and store agent.py's schedules).",
        epilog=EPILOG)
    cmd.add_argument("app", type=Path, metavar="APP_DIR", help="the app folder")
    verbs = cmd.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser("list", help="every schedule, its next fire and its last turn")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    add = verbs.add_parser("add", help="add (or replace) a schedule")
    add.add_argument("name", help="the schedule's name")
    add.add_argument("--seed", required=True, help="the text that opens each turn")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="a cron expression, e.g. '0 9 * * 1-5'")
    when.add_argument("--every", type=float, metavar="SECONDS", help="seconds between fires")
    when.add_argument("--at", metavar="ISO_TIME", help="once, at this time")
    add.add_argument("--tz", default="UTC", help="the cron's time zone (default UTC)")
    add.add_argument("--session", help="the session (default schedule:NAME)")
    add.add_argument("--channel", metavar="NAME", help="the channel that delivers each turn")
    add.add_argument("--target", metavar="CHANNEL_ID",
                     help="where the channel delivers (Slack: the channel id)")
    add.add_argument("--by", help="who the trigger is attributed to (default schedule:NAME)")
    add.add_argument("--overlap", choices=OVERLAP, default="skip",
                     help="while a turn of the session is unfinished (default skip)")
    add.add_argument("--missed", choices=MISSED, default="skip",
                     help="times missed while no process ran (default skip)")
    rm = verbs.add_parser("remove", help="remove a schedule (its turns stay)")
    rm.add_argument("name", help="the schedule's name")
    for verb in (ls, add, rm):
        store_options(verb, default_db=Path("durable_turns.db"))
    cmd.set_defaults(run=lambda args: run_command("schedules", lambda: asyncio.run(_run(args))))


def _line(s: Schedule) -> str:
    when = (f"cron {s.cron!r} {s.tz}" if s.cron else f"every {s.every:g}s" if s.every
            else f"at {s.at.isoformat() if s.at else '?'}")
    nxt = s.next_fire.isoformat() if s.next_fire else "-"
    return f"{s.name}\t{when}\tnext {nxt}\tlast turn {s.last_turn or '-'}"


async def _run(args: argparse.Namespace) -> int:
    app = load(app_dir(args), None, needs_model=False)
    make, named = store_of(args, create=args.verb == "add")
    agent = app.agent.name
    async with Runtime([app.agent], make(), scheduler=NoDriveScheduler()) as runtime:
        if args.verb == "list":
            found = await runtime.schedules(agent)
            for s in found:
                print(json.dumps(s.to_dict()) if args.json else _line(s), flush=True)
            if not found and not args.json:
                print(f"no schedules of agent {agent!r} in {named}", flush=True)
        elif args.verb == "add":
            target = None if args.target is None else {"channel_id": args.target}
            s = await runtime.schedule(
                args.name, agent=agent, seed=args.seed, cron=args.cron, every=args.every,
                at=args.at, tz=args.tz, session=args.session, channel=args.channel,
                target=target, by=args.by, overlap=args.overlap, missed=args.missed)
            print(_line(s), flush=True)
        else:
            await runtime.unschedule(args.name)
            print(f"removed schedule {args.name!r}", flush=True)
    return 0
