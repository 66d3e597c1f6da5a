"""The command line on Temporal: ``temporal-worker``, and ``serve --temporal``'s options.

``durable-turns temporal-worker APP_DIR --temporal HOST:PORT --dsn …`` runs a Temporal
worker of the app's agent: the sessions' workflows and their steps, against the store.
``serve --temporal HOST:PORT`` makes the server's runtime tell Temporal of every turn it
accepts (it drives nothing itself). Both take the same connection options, passed through to
``temporalio``'s ``Client.connect``: a namespace, TLS, an API key (Temporal Cloud).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from ..runtime import Runtime
from ..scheduling import Scheduler
from ._args import MODEL_HELP, agent_of, run_command, store_of, store_options

API_KEY_ENV = "TEMPORAL_API_KEY"
"""The environment variable an API key is read from when ``--api-key`` is not given."""


def add_temporal_options(cmd: argparse.ArgumentParser, *, required: bool) -> None:
    """``--temporal HOST:PORT`` and the options of the connection and the task queue.

    Args:
        cmd: the command's parser.
        required: whether ``--temporal`` must be given (``temporal-worker``) or turns the
            feature on (``serve``).
    """
    group = cmd.add_argument_group("Temporal (extra 'temporal')")
    group.add_argument("--temporal", required=required, metavar="HOST:PORT",
                       help="the Temporal frontend: a dev server (127.0.0.1:7233) or Temporal "
                            "Cloud (NAMESPACE.ACCOUNT.tmprl.cloud:7233)"
                            + ("" if required else "; turns are then driven by "
                               "'durable-turns temporal-worker' processes"))
    group.add_argument("--namespace", default="default", help="the Temporal namespace")
    group.add_argument("--task-queue", default="durable-turns", metavar="NAME",
                       help="the task queue of the sessions' workflows (default %(default)s); "
                            "one per deployment")
    group.add_argument("--api-key", metavar="KEY",
                       help=f"Temporal Cloud's API key (default: ${API_KEY_ENV}); turns TLS on")
    group.add_argument("--tls", action="store_true", help="connect with TLS")
    group.add_argument("--tls-cert", type=Path, metavar="PEM",
                       help="a client certificate for mTLS (with --tls-key)")
    group.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")
    group.add_argument("--server-ca", type=Path, metavar="PEM",
                       help="a CA to check the server's certificate against")


def scheduler_of(args: argparse.Namespace) -> Scheduler | None:
    """The scheduler ``--temporal`` asks for (it connects on its first use), or ``None``."""
    if not getattr(args, "temporal", None):
        return None
    from ..temporal import TemporalScheduler

    return TemporalScheduler(_connection(args), args.task_queue)


def _connection(args: argparse.Namespace) -> Any:
    from ..temporal import Connection

    return Connection(args.temporal, args.namespace,
                      api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                      tls=args.tls, tls_cert=args.tls_cert, tls_key=args.tls_key,
                      server_ca=args.server_ca)


def add_temporal_commands(commands: Any, *, epilog: str) -> None:
    """Add ``temporal-worker`` to the command line's subcommands (``epilog``: their exit
    statuses)."""
    cmd = commands.add_parser(
        "temporal-worker", help="drive an app's turns as Temporal workflows, until interrupted",
        description="Be a Temporal worker of an app: run its sessions' workflows and their "
                    "steps (one activity per model call, tool call or command) against the "
                    "store. Turns are accepted elsewhere ('serve --temporal', a Runtime with "
                    "a TemporalScheduler) into the same store and task queue.",
        epilog=epilog)
    cmd.add_argument("app", type=Path, metavar="APP_DIR", help="the app folder (its agent)")
    store_options(cmd)
    cmd.add_argument("--model", metavar="PROVIDER:NAME", help=MODEL_HELP)
    add_temporal_options(cmd, required=True)
    cmd.add_argument("--max-steps", type=int, default=100, metavar="N",
                     help="steps this worker runs at once (default %(default)s)")
    cmd.add_argument("--heartbeat", type=float, default=2.0, metavar="SECONDS",
                     help="a step without a heartbeat this long runs again on another "
                          "worker (default %(default)s)")
    cmd.add_argument("--sticky-timeout", type=float, default=1.0, metavar="SECONDS",
                     help="how long a session's workflow task waits for this worker before "
                          "any worker takes it (default %(default)s; Temporal's is 10)")
    cmd.add_argument("--lease-ttl", type=float, default=5.0, metavar="SECONDS",
                     help="PostgreSQL: how long a lost worker's session lease outlives it "
                          "(default %(default)s)")
    cmd.set_defaults(run=lambda args: run_command(
        "temporal-worker", lambda: asyncio.run(_temporal_work(args))))


async def _temporal_work(args: argparse.Namespace) -> int:
    from ..temporal import TemporalScheduler, WorkerSettings, connect, temporal_worker

    if args.max_steps < 1:
        raise ValueError("--max-steps must be at least 1")
    if args.heartbeat <= 0 or args.sticky_timeout <= 0:
        raise ValueError("--heartbeat and --sticky-timeout must be positive")
    agent = agent_of(args)
    make, named = store_of(args, create=True, lease_ttl=args.lease_ttl)
    client = await connect(_connection(args))
    settings = WorkerSettings(task_queue=args.task_queue, max_steps=args.max_steps,
                              heartbeat=args.heartbeat, sticky_timeout=args.sticky_timeout,
                              lease_timeout=max(30.0, 3 * args.lease_ttl))
    scheduler = TemporalScheduler(client, args.task_queue, heartbeat=args.heartbeat)
    async with Runtime([agent], make(), scheduler=scheduler) as rt:
        worker = temporal_worker(rt, client, settings)
        print(f"temporal worker of agent {agent.name!r} on {named}: task queue "
              f"{args.task_queue!r} at {args.temporal}", flush=True)
        await worker.run()
    return 0


__all__ = ["API_KEY_ENV", "add_temporal_commands", "add_temporal_options", "scheduler_of"]
