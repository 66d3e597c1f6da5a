"""A Temporal worker in a child process, for the Temporal tests: real processes, real signals.

Run as a script, it runs a ``durable_turns.temporal`` worker of one agent on a Temporal dev
server until it is killed (or told to stop by a ``stop-<tag>`` file)::

    python tests/temporalkit.py TARGET QUEUE --db DB --tag w1 --agent crash --kill step:3
    python tests/temporalkit.py TARGET QUEUE --dsn DSN --work DIR --tag a --agent fence

Agents (``--agent``):

- ``crash``: the crash suite's ops agent, model and kill points (``tests/crashkit.py``, on the
  SQLite file ``--db``; its files sit beside it);
- ``fence``: one remote tool, ``slow``: it writes ``in-<tag>``, waits for ``go``, then appends
  its call and idempotency key to ``effects.jsonl`` (on any store: ``--dsn`` or ``--db``);
- ``stall``: a model whose stream sends a delta, writes ``streaming-<tag>`` and then waits
  (for a ``never`` file) until it is cancelled;
- ``ask``: a remote tool, ``refund``, that asks ``alice`` (only her) to approve, then appends
  its effect to ``effects.jsonl``.
- ``compact``: an agent with ``Compaction`` (F23) whose summary model appends a line to
  ``summaries`` for each call; with ``--kill in-model`` its model SIGKILLs its own worker at
  the first request that sends a summary (the compaction committed, the model step not).
- ``flaky``: a remote tool, ``charge`` (``retries=1``), that appends its attempt to
  ``effects.jsonl``, fails its first attempt, SIGKILLs its own worker on its second (both of
  its policy's attempts are then spent) and succeeds after.

Every file sits in the work folder (``--work``, else the folder of ``--db``):
``ready-<tag>`` once the worker polls its queue; ``effects.jsonl``; ``events-<tag>.jsonl``
(the crash agent's recorder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import crashkit
from durable_turns import (
    Agent,
    Compaction,
    Model,
    ModelReply,
    ModelRequest,
    Runtime,
    SqliteStore,
    TextDelta,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.compaction import SUMMARY_PREFIX
from durable_turns.model import Stop
from durable_turns.models import ModelEvent
from durable_turns.models.scripted import calls_this_turn
from durable_turns.stores import SessionStore
from durable_turns.temporal import (
    Connection,
    TemporalScheduler,
    WorkerSettings,
    connect,
    temporal_worker,
)

CHILD_TIMEOUT = 60.0
"""The bound on every wait of a child."""
HEARTBEAT = 1.0
"""The workers' heartbeat timeout here: a killed worker's step runs again after ~1.8 s."""
LEASE_TTL = 1.0
"""The PostgreSQL lease's TTL here: a paused worker's lease expires after it."""


async def _wait_for_file(path: Path) -> None:
    await crashkit.wait_for_file(path, path.name, CHILD_TIMEOUT)


def _effect(work: Path, **line: Any) -> None:
    with (work / "effects.jsonl").open("a") as f:
        f.write(json.dumps({**line, "pid": os.getpid()}) + "\n")


def fence_agent(work: Path, tag: str) -> tuple[Agent, Model]:
    @tool
    async def slow(text: str, ctx: ToolContext) -> str:
        """Do something slowly."""
        (work / f"in-{tag}").touch()
        await _wait_for_file(work / "go")
        _effect(work, call=ctx.call_id, key=ctx.idempotency_key, tag=tag)
        return "done"

    script = [ModelReply("Working on it.", [ToolCall("c1", "slow", {"text": "x"})]),
              ModelReply("Finished.")]
    return Agent("fence", "You work slowly.", [slow]), \
        scripted(lambda r: script[calls_this_turn(r)])


class StallModel:
    """A model that streams one delta, then waits until its stream is cancelled."""

    def __init__(self, work: Path, tag: str) -> None:
        self.work, self.tag = work, tag

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if request.messages[-1].text.startswith("quick"):
            yield TextDelta("quick answer")
            yield Stop("end_turn")
            return
        yield TextDelta("thinking")
        (self.work / f"streaming-{self.tag}").touch()
        await _wait_for_file(self.work / "never")
        yield Stop("end_turn")


def ask_agent(work: Path) -> tuple[Agent, Model]:
    @tool
    async def refund(amount: int, ctx: ToolContext) -> str:
        """Refund an amount, once alice approves."""
        ok = await ctx.request_input("approve", f"refund {amount}?",
                                     {"type": "boolean"}, {"user": "alice"})
        if not ok:
            return "refused"
        _effect(work, call=ctx.call_id, key=ctx.idempotency_key)
        return "refunded"

    script = [ModelReply("Asking alice.", [ToolCall("c1", "refund", {"amount": 5})]),
              ModelReply("Refunded.")]
    return Agent("ask", "You refund.", [refund]), scripted(lambda r: script[calls_this_turn(r)])


def flaky_agent(work: Path) -> tuple[Agent, Model]:
    @tool(retries=1, retry_delay=0.05)
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge an amount."""
        _effect(work, call=ctx.call_id, key=ctx.idempotency_key, attempt=ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("the payment service reset the connection")
        if ctx.attempt == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return "charged"

    script = [ModelReply("Charging.", [ToolCall("c1", "charge", {"amount": 5})]),
              ModelReply("Charged.")]
    return Agent("flaky", "You charge.", [charge]), scripted(lambda r: script[calls_this_turn(r)])


def compact_agent(work: Path, kill: bool) -> tuple[Agent, Model]:
    @tool
    async def fetch(n: int) -> str:
        """A large document."""
        return f"{n}: " + "x" * 2400

    class Summariser:
        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
            with (work / "summaries").open("a") as f:
                f.write(f"{os.getpid()}\n")
            yield TextDelta(f"a summary of {len(request.messages)} messages")
            yield Stop("end_turn", {"input_tokens": 100, "output_tokens": 10})

    class Reader:
        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
            if kill and request.messages[0].text.startswith(SUMMARY_PREFIX):
                os.kill(os.getpid(), signal.SIGKILL)
            size = sum(len(m.text) + len(str(m.result or "")) for m in request.messages) // 4
            if request.messages[-1].role == "user":
                yield ToolCall(f"c{len(request.messages)}", "fetch",
                               {"n": len(request.messages)})
                yield Stop("tool_use", {"input_tokens": size, "output_tokens": 10})
            else:
                yield TextDelta("done")
                yield Stop("end_turn", {"input_tokens": size, "output_tokens": 2})

    agent = Agent("compact", "You read documents.", [fetch], context=Compaction(
        trigger_tokens=2000, keep_recent=6, model=Summariser()))
    return agent, Reader()


def build(a: argparse.Namespace, work: Path) -> tuple[Agent, Model, SessionStore, Any]:
    """The agent, its model, the store and the event sink of this child."""
    store: SessionStore
    if a.dsn:
        from durable_turns import PostgresStore

        store = PostgresStore(a.dsn, lease_ttl=LEASE_TTL)
    else:
        store = SqliteStore(a.db)
    sink = None
    if a.agent == "crash":
        cfg = crashkit.Config(a.db, a.tag, crashkit.KillPoint.parse(a.kill), False, None)
        agent, model = crashkit.build_agent(cfg), crashkit.build_model(cfg)
        sink = crashkit.Recorder(crashkit.recorder(cfg))
    elif a.agent == "fence":
        agent, model = fence_agent(work, a.tag)
    elif a.agent == "stall":
        agent, model = Agent("stall", "You think.", []), StallModel(work, a.tag)
    elif a.agent == "flaky":
        agent, model = flaky_agent(work)
    elif a.agent == "compact":
        agent, model = compact_agent(work, a.kill == "in-model")
    else:
        agent, model = ask_agent(work)
    return agent, model, store, sink


async def child(a: argparse.Namespace) -> None:
    work = a.work or a.db.parent
    agent, model, store, sink = build(a, work)
    client = await connect(Connection(a.target))
    rt = Runtime([agent], store, model, sink=sink,
                 scheduler=TemporalScheduler(client, a.queue, heartbeat=HEARTBEAT))
    async with rt:
        if a.agent == "crash":
            import sqlite3

            with sqlite3.connect(a.db, timeout=CHILD_TIMEOUT) as own:
                own.execute(crashkit.ORDERS_DDL)
        settings = WorkerSettings(task_queue=a.queue, heartbeat=HEARTBEAT, sticky_timeout=0.5,
                                  lease_timeout=CHILD_TIMEOUT)
        async with temporal_worker(rt, client, settings):
            (work / f"ready-{a.tag}").touch()
            await _wait_for_file(work / f"stop-{a.tag}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("target")
    p.add_argument("queue")
    p.add_argument("--db", type=Path)
    p.add_argument("--dsn")
    p.add_argument("--work", type=Path)
    p.add_argument("--tag", required=True)
    p.add_argument("--agent", default="crash",
                   choices=["crash", "fence", "stall", "ask", "flaky", "compact"])
    p.add_argument("--kill", default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(child(a))


# -- the test side ----------------------------------------------------------------------------

WAIT = 60.0
"""The bound on every wait of the tests."""
KIT = Path(__file__).resolve()


def queue() -> str:
    """A task queue of its own for one test (its sessions' workflow ids are its own too)."""
    return f"q-{uuid.uuid4().hex[:12]}"


def spawn(target: str, q: str, work: Path, tag: str, *args: str) -> subprocess.Popen[bytes]:
    """A worker child of this script; what it logs goes to ``err-<tag>.log`` in ``work``."""
    with (work / f"err-{tag}.log").open("ab") as err:
        return subprocess.Popen([sys.executable, str(KIT), target, q, "--tag", tag, *args],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err)


def logged(work: Path, tag: str) -> str:
    """What the worker child ``tag`` logged so far."""
    path = work / f"err-{tag}.log"
    return path.read_text() if path.exists() else ""


def stop(proc: subprocess.Popen[bytes], work: Path, tag: str) -> str:
    """Ask a worker child to stop, wait for it, and return what it logged."""
    (work / f"stop-{tag}").touch()
    try:
        proc.wait(timeout=WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=WAIT)
    return logged(work, tag)


@asynccontextmanager
async def front(target: str, q: str, agent: Agent, store: SessionStore,
                **scheduler: Any) -> AsyncIterator[Runtime]:
    """A runtime that accepts and answers but drives nothing: Temporal's workers do
    (``scheduler``: more of its ``TemporalScheduler``'s options)."""
    client = await connect(Connection(target))
    rt = Runtime([agent], store,
                 scheduler=TemporalScheduler(client, q, heartbeat=HEARTBEAT, **scheduler))
    async with rt:
        yield rt


@asynccontextmanager
async def inline_worker(target: str, q: str, agent: Agent, model: Model,
                        store: SessionStore, more: list[Agent] | None = None,
                        ) -> AsyncIterator[Runtime]:
    """A worker in the test's own process (its own runtime and store) of ``agent`` and
    ``more``."""
    client = await connect(Connection(target))
    rt = Runtime([agent, *(more or [])], store, model,
                 scheduler=TemporalScheduler(client, q, heartbeat=HEARTBEAT))
    settings = WorkerSettings(task_queue=q, heartbeat=HEARTBEAT, sticky_timeout=0.5)
    async with rt, temporal_worker(rt, client, settings):
        yield rt


if __name__ == "__main__":
    main()
