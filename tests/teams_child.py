"""A child process for the Teams restart tests: a ``receive()`` of a proactive turn whose
delivery SIGKILLs the process before it posts (a crash between the end of the turn and its
delivery)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import slack_app
from durable_turns import Runtime, SqliteStore, Trigger, TurnEvent
from durable_turns.channels import mount_agent, receive


class DiesBeforePosting:
    """A deliverer named like the Teams channel that kills its process instead of posting."""

    name = "teams"

    async def deliver(self, target: Mapping[str, Any],
                      events: AsyncIterable[TurnEvent]) -> Any:
        async for _e in events:
            pass
        os.kill(os.getpid(), signal.SIGKILL)


async def main(args: argparse.Namespace) -> None:
    runtime = Runtime([slack_app.build_agent()], SqliteStore(args.db))
    async with runtime:
        ctx = mount_agent(runtime.agents[slack_app.AGENT], runtime)
        await receive(DiesBeforePosting(), ctx, seed=args.seed,
                      target={"channel_id": args.target}, trigger=Trigger(by="cron:daily"),
                      session="digest", turn_id=args.turn_id)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--seed", default="daily digest")
    parser.add_argument("--turn-id", default="digest-1")
    asyncio.run(main(parser.parse_args()))
