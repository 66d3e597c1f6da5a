"""A child process for the Slack restart tests: real processes, real SIGKILL.

``serve``: the ``slack_app`` agent on a SQLite file, served with the Slack channel (pointed
at the fake Web API) by ``durable_turns.server.run.serve`` — which recovers the runtime and
the channel first — on a free port; its URL is written to ``URL_FILE`` once it listens.

``receive``: one ``receive()`` of a proactive turn whose delivery SIGKILLs the process
before it posts (a crash between the end of the turn and its delivery).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import slack_app
from durable_turns import Runtime, SqliteStore, Trigger, TurnEvent
from durable_turns.channels import mount_agent, receive
from durable_turns.channels.slack import slack_channel
from durable_turns.server.run import serve
from fakes.slack_api import SECRET, TOKEN


class DiesBeforePosting:
    """A deliverer named like the Slack channel that kills its process instead of posting."""

    name = "slack"

    async def deliver(self, target: Mapping[str, Any],
                      events: AsyncIterable[TurnEvent]) -> Any:
        async for _e in events:
            pass
        os.kill(os.getpid(), signal.SIGKILL)


async def main(args: argparse.Namespace) -> None:
    runtime = Runtime([slack_app.build_agent()], SqliteStore(args.db))
    slack = slack_channel(signing_secret=SECRET, bot_token=TOKEN,
                          base_url=f"{args.fake}/api/")
    if args.mode == "receive":
        async with runtime:
            ctx = mount_agent(runtime.agents[slack_app.AGENT], runtime)
            await receive(DiesBeforePosting(), ctx, seed=args.seed,
                          target={"channel_id": "C9"}, trigger=Trigger(by="cron:daily"),
                          session="digest", turn_id=args.turn_id)
        return
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()

    def ready(url: str) -> None:
        tmp = Path(f"{args.url_file}.tmp")
        tmp.write_text(url)
        tmp.rename(args.url_file)

    await serve(runtime, port=port, on_ready=ready, channels=[slack], grace=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["serve", "receive"])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--fake", required=True)
    parser.add_argument("--url-file", type=Path)
    parser.add_argument("--seed", default="daily digest")
    parser.add_argument("--turn-id", default="digest-1")
    asyncio.run(main(parser.parse_args()))
