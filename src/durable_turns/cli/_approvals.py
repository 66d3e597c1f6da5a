"""``durable-turns pending | approve | deny``: answer any app's parked turns from a shell (F6).

Each command loads the app folder (``APP_DIR`` or ``--app``, as ``serve`` does) and opens
its store (``--db PATH`` or ``--store``/``--dsn``, SQLite or PostgreSQL). They manage what
is there and create nothing: a SQLite file that does not exist, or a database with no
sessions of the app's agent, is refused, and so is a parked turn whose tool the app does
not have (the database is another app's, or the demo's). ``approve`` and ``deny`` store the
answer as the attested ``--by`` (default: the operating-system user), then drive the turn
to its end or its next park with the app's model, printing what follows.

Every read goes through ``Runtime.queries`` and :class:`~durable_turns.AgentSession`; what
the commands raise is answered by ``_args.run_command`` (one line, ``errors.ERRORS``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._hitl import who_may_answer
from ..agent import Agent
from ..channels import mount_agent
from ..channels._repl import render
from ..errors import ResumeConflictError
from ..records import InputRequest, SessionKey
from ..runtime import Runtime
from ..scheduling import NoDriveScheduler
from ..sessions import AgentSession
from ._args import (
    MODEL_HELP,
    PROG,
    app_dir,
    app_options,
    fail,
    load,
    name,
    os_user,
    run_command,
    store_of,
    store_options,
)

LEASE_WAIT = 30.0
"""How long an answer waits for a process that drives the session to let go of it."""
EPILOG = """\
exit status: 0 done (the turn completed, or parked again), 1 the turn failed, 2 bad input
(no such app, file or turn; a database that is another app's; a turn that is not waiting for
that input, or was answered already with another answer; --by not allowed to answer; an
answer that does not fit the request's schema).
"""
PENDING_EPILOG = """\
exit status: 0 listed (nothing waiting included), 2 bad input (no such app or file; a
database that is another app's).
"""


def add_approval_commands(commands: Any) -> None:
    """``pending``, ``approve`` and ``deny`` on the subcommands of the top-level parser."""
    pending = commands.add_parser(
        "pending", help="list an app's turns waiting for a person, and how to answer them",
        description="List the sessions of an app's store that are parked waiting for a "
                    "person: the request, who may answer it, and the command that does.",
        epilog=PENDING_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    app_options(pending)
    store_options(pending)
    pending.set_defaults(run=_pending)
    for verb, summary in (("approve", "answer a parked turn (yes, or --value) and finish it"),
                          ("deny", "answer a parked turn's yes-or-no request with no")):
        cmd = commands.add_parser(
            verb, help=summary,
            description=f"{summary[0].upper()}{summary[1:]}: the answer is stored as --by, "
                        "then the turn runs on here with the app's model (the parked tool "
                        "runs again from the top and gets the answer) to its end or its next "
                        "park.",
            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        app_options(cmd)
        store_options(cmd)
        cmd.add_argument("--turn", metavar="TURN",
                         help="the parked turn (default: the one --session is parked on)")
        cmd.add_argument("--session", type=name, metavar="ID",
                         help="the turn's session (needed without --turn, or when two "
                              "sessions have a turn of that id)")
        cmd.add_argument("--input", metavar="ID",
                         help="the request to answer (default: the one the turn waits for)")
        if verb == "approve":
            cmd.add_argument("--value", metavar="JSON",
                             help="the answer, as JSON, for a request that is not yes or no "
                                  "(default: true)")
        cmd.add_argument("--by", type=name, metavar="USER",
                         help="who answers (attested by the CLI); default: $USER")
        cmd.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
        cmd.set_defaults(run=_answer, verb=verb)


# -- pending -------------------------------------------------------------------------------


def _pending(args: argparse.Namespace) -> int:
    return run_command("pending", lambda: asyncio.run(pending(args)))


async def pending(args: argparse.Namespace) -> int:
    """``pending``: print the app's parked requests; returns 0 (also when there are none).

    Raises:
        ConfigurationError: the app folder is unusable.
        LookupError, ValueError: the store is missing, or another app's.
    """
    folder = app_dir(args)
    agent = load(folder, None, needs_model=False).agent
    make, named = store_of(args, create=False)
    async with Runtime([agent], make(), scheduler=NoDriveScheduler()) as rt:
        await _check_agents(rt, agent, folder, named)
        waiting = [(found.key, r) for found in await rt.queries.inbox(agent.name)
                   if found.pending is not None for r in found.pending.all]
        if not waiting:
            print(f"nothing in {named} is waiting for input")
            return 0
        print(f"{len(waiting)} request(s) of agent {agent.name!r} in {named} wait for a "
              "person:")
        for key, request in waiting:
            s = rt.session(key.agent, key.session)
            asked_by = await _asked_by(s, request.turn_id)
            tool = await _tool_of(s, request)
            print(f"\n  session {key.session}, turn {request.turn_id}, input {request.id!r}"
                  + (f" (in tool {tool})" if tool else ""))
            print(f"    {request.prompt}")
            print(f"    asked by {asked_by or '-'}; {who_may_answer(request.answerers)}")
            if tool is not None and tool not in agent.tools_by_name:
                print(f"    (tool {tool!r} is not one of this app's: the turn is another "
                      "app's)")
                continue
            for line in _commands(args, folder, key, request):
                print(f"    {line}")
    return 0


def _commands(args: argparse.Namespace, folder: Path, key: SessionKey,
              request: InputRequest) -> list[str]:
    where_ = (["--db", str(args.db)] if args.store is None else ["--store", args.store])
    who = (request.answerers or {}).get("user")
    common = [str(folder), *where_, "--session", key.session, "--turn", request.turn_id,
              "--input", request.id, *(["--by", str(who)] if who else [])]
    if (request.schema or {}).get("type") == "boolean":
        return [shlex.join([PROG, "approve", *common]), shlex.join([PROG, "deny", *common])]
    return [shlex.join([PROG, "approve", *common]) + " --value JSON"]


# -- approve and deny ----------------------------------------------------------------------


def _answer(args: argparse.Namespace) -> int:
    command = args.verb
    by = args.by or os_user()
    if by is None:
        return fail(command, "who is answering? $USER is not set: pass --by", 2)
    if args.turn is None and args.session is None:
        return fail(command, "which turn? pass --turn TURN, or --session ID (its parked "
                             "turn)", 2)
    return run_command(command, lambda: asyncio.run(answer(args, by)),
                       timed_out="the turn did not end in time")


@dataclass(frozen=True, slots=True)
class _Target:
    """What an answer is for: the session, the turn, the input, and whether it still waits."""

    session: AgentSession
    turn_id: str
    input_id: str
    request: InputRequest | None
    """The standing request, or ``None`` when the turn no longer waits (answered already)."""


async def answer(args: argparse.Namespace, by: str, *,
                 write: Callable[[str], None] | None = None) -> int:
    """``approve`` / ``deny``: store the answer and drive the turn on; returns 0 when it
    completed or parked again, 1 when it failed or was cancelled.

    Raises:
        ConfigurationError: the app folder or the model is unusable.
        LookupError, ValueError: the store, the session or the turn is missing, the database
            is another app's, or the answer cannot be made from the options.
        ResumeConflictError, ResumeAuthorizationError, InvalidInputError: refused by the
            session; nothing was stored.
    """
    out = write or _write
    folder = app_dir(args)
    agent = load(folder, args.model).agent
    make, named = store_of(args, create=False)
    async with Runtime([agent], make(), lease_timeout=LEASE_WAIT) as rt:
        await _check_agents(rt, agent, folder, named)
        target = await _target(rt, agent, args, named)
        value = _value(args, target.request)
        channel = mount_agent(agent, rt)
        stream = await channel.open_resume(target.turn_id, target.input_id, value,
                                           session=target.session.key.session, by=by)
        shown = json.dumps(value)
        if target.request is None:
            out(f"{target.input_id!r} of turn {target.turn_id} was answered already, "
                f"{shown} by {by}: the same answer, so nothing runs again\n")
        else:
            out(f"answered {target.input_id!r} of turn {target.turn_id} "
                f"({target.session.key}): {shown}, by {by} (stored)\n")
        async with stream:
            await render(aiter(stream), out)
        result = await target.session.result(target.turn_id)
    if result.status == "completed":
        out("the turn completed\n")
    elif result.status == "suspended" and result.request is not None:
        out(f"the turn waits again, on {result.request.id!r}: {result.request.prompt}\n")
    else:
        out(f"the turn ended {result.status.value}: {result.error or result.reason}\n")
    return 0 if result.status in ("completed", "suspended") else 1


async def _target(rt: Runtime, agent: Agent, args: argparse.Namespace,
                  named: str) -> _Target:
    """The session, turn and input the options name, checked to be this app's."""
    if args.turn is None:
        key = rt.key(agent.name, args.session)
    else:
        found = await rt.queries.find_turn(args.turn)
        mine = [k for k in found if k.agent == agent.name
                and (args.session is None or k.session == args.session)]
        if not mine:
            others = sorted({k.agent for k in found} - {agent.name})
            if others:
                raise ValueError(f"turn {args.turn!r} in {named} is agent "
                                 f"{', '.join(map(repr, others))}'s, not this app's "
                                 f"({agent.name!r})")
            raise LookupError(f"no turn {args.turn!r} of agent {agent.name!r}"
                              + (f" in session {args.session!r}" if args.session else "")
                              + f" in {named} ({PROG} pending lists what waits)")
        if len(mine) > 1:
            raise LookupError(f"turn {args.turn!r} is in {len(mine)} sessions "
                              f"({', '.join(k.session for k in mine)}): name one with "
                              "--session")
        (key,) = mine
    s = rt.session(key.agent, key.session)
    summary = await s.summary()
    if not summary.exists:
        raise LookupError(f"{named} has no session {key}")
    parked = summary.pending
    turn_id = args.turn or (parked.turn_id if parked is not None else None)
    if turn_id is None:
        raise LookupError(f"session {key} is not waiting for input (it is {summary.status})")
    requests = list(parked.all) if parked is not None and \
        parked.turn_id == turn_id else []
    if not requests:
        return await _answered(s, turn_id, args.input)
    if args.input is not None:
        chosen = [r for r in requests if r.id == args.input]
        if not chosen:  # the session refuses it, and says what the turn waits for
            return _Target(s, turn_id, args.input, requests[0])
    elif len(requests) > 1:
        raise ValueError(f"turn {turn_id} waits for {len(requests)} answers "
                         f"({', '.join(repr(r.id) for r in requests)}): name one with --input")
    else:
        chosen = requests
    request = chosen[0]
    tool = await _tool_of(s, request)
    if tool is not None and tool not in agent.tools_by_name:
        raise ValueError(f"turn {turn_id} waits in tool {tool!r}, which the app's agent does "
                         f"not have: the turn is another app's (the demo's refunds are "
                         f"answered with '{PROG} demo approve')")
    return _Target(s, turn_id, request.id, request)


async def _answered(s: AgentSession, turn_id: str, input_id: str | None) -> _Target:
    """A turn that no longer waits: the input it was answered on (a repeat of the same
    answer is one answer; the session refuses another)."""
    rec = await s.entry(turn_id)
    if rec is None:
        raise LookupError(f"session {s.key} has no turn {turn_id!r}")
    given = [str((e.args or {}).get("input_id")) for e in await s.chain()
             if e.kind == "resume" and (e.args or {}).get("turn_id") == turn_id]
    if input_id is not None:
        return _Target(s, turn_id, input_id, None)
    if not given:
        raise ResumeConflictError(f"turn {turn_id!r} is not waiting for input: it is "
                                  f"{rec.status.value}", session=str(s.key), turn_id=turn_id)
    return _Target(s, turn_id, given[-1], None)


def _value(args: argparse.Namespace, request: InputRequest | None) -> Any:
    kind = ((request.schema or {}) if request is not None else {}).get("type")
    if args.verb == "deny":
        if request is not None and kind != "boolean":
            raise ValueError(f"{request.id!r} asks for more than yes or no ({request.prompt}): "
                             "answer it with approve --value JSON")
        return False
    if args.value is None:
        if request is not None and kind != "boolean":
            raise ValueError(f"{request.id!r} asks for more than yes or no: pass the answer "
                             f"as --value JSON (its schema: {json.dumps(request.schema)})")
        return True
    try:
        return json.loads(args.value)
    except json.JSONDecodeError as e:
        raise ValueError(f"--value is not JSON ({e.msg}): {args.value!r}") from None


# -- shared --------------------------------------------------------------------------------


async def _check_agents(rt: Runtime, agent: Agent, folder: Path, named: str) -> None:
    """Refuse a store with no session of the app's agent: it is another app's (or empty).

    Raises:
        ValueError: naming the agents it holds.
    """
    agents = await rt.queries.agents()
    if agent.name in agents:
        return
    if not agents:
        raise LookupError(f"{named} has no sessions: is it the store of {folder}?")
    raise ValueError(f"{named} holds agent(s) {', '.join(map(repr, agents))}, not "
                     f"{agent.name!r} (the agent of {folder}): it is another app's store")


async def _asked_by(s: AgentSession, turn_id: str) -> str | None:
    rec = await s.entry(turn_id)
    user: Any = ((rec.event if rec is not None else None) or {}).get("user") or {}
    return str(user["id"]) if isinstance(user, dict) and user.get("id") else None


async def _tool_of(s: AgentSession, request: InputRequest) -> str | None:
    """The tool whose call parked on ``request``, read off the transcript."""
    for m in reversed(await s.transcript()):
        for c in m.tool_calls:
            if c.id == request.call_id:
                return c.name
    return None


def _write(text: str) -> None:
    print(text, end="", flush=True)


__all__ = ["EPILOG", "LEASE_WAIT", "add_approval_commands", "answer", "pending"]
