"""A child-process harness for the crash and lease tests: real processes, real SIGKILL.

Run as a script, it drives one delivery (or a ``Runtime.recover()``) of a small ops agent's
turn on a SQLite file, and kills its own process with SIGKILL at the point ``--kill`` names::

    python tests/crashkit.py DB --tag crash --kill step:3
    python tests/crashkit.py DB --tag replay
    python tests/crashkit.py DB --tag recovery --recover

The agent has a local tool (``create_order``: a row in ``orders`` through
``ctx.store.unwrap()``) and a remote one (``notify``: a line with its idempotency key and the
process id appended to ``effects.jsonl``); the scripted model asks for them in :data:`SCRIPT`.
Every file a child writes sits beside the database:

- ``events-<tag>.jsonl``: every event the child's runtime published (its sink),
  ``message.delta`` included,
  written (and flushed) as it is published, so a SIGKILL loses none;
- ``effects.jsonl``: the remote tool's side effects, from every child;
- ``report-<tag>.json``: how the turn ended, written only by a child that was not killed;
- ``ready-<tag>`` (``--barrier FD``): the child is set up and blocks until the pipe whose
  read end is FD is closed by the test (one pipe for every child: they wake together);
- ``delivered-<tag>``: ``start()`` (or ``recover()``) has returned;
- ``held-<tag>`` (``--hold CALL``): the child sits inside the remote tool for that call;
- ``go`` (``--gate``), written by the test: the remote tool waits for it before its side
  effect, so a turn cannot end before the test lets it.

Kill points (``--kill``):

- ``accepted``: right after ``start()`` returned (the turn is durable, nothing of it ran);
- ``step:<k>``: after the k-th committed step is published (``turn.started`` is 0, then each
  ``message.completed`` and ``action.completed``: events are published after their commit);
- ``local:<call>``: inside ``create_order`` for that call, after its row is written, before
  the step's transaction commits;
- ``remote:<call>``: inside ``notify`` for that call, after its side effect, before the commit;
- ``model:<i>``: inside the scripted model function at the turn's i-th model call, before it
  returns (the earlier calls' text has been streamed);
- ``stream:<i>``: inside the model's stream at the i-th call, after two of its deltas have
  been published.

The test process imports this module for :data:`SCRIPT` and the helpers that spawn children
and read their files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from durable_turns import (
    Agent,
    Model,
    ModelReply,
    ModelRequest,
    Runtime,
    SqliteStore,
    TextDelta,
    ToolCall,
    ToolContext,
    TurnEvent,
    scripted,
    tool,
)
from durable_turns.messages import Message
from durable_turns.models import ModelEvent
from durable_turns.models.scripted import calls_this_turn
from durable_turns.stores import ChainEntry, SessionKey
from durable_turns.testing import get_turn

AGENT = "ops"
SESSION = "s1"
TURN_ID = "turn-1"
TEXT = "Order an apple, a pear and a plum, and tell the team."

SCRIPT: list[ModelReply] = [
    ModelReply("Ordering the apple first, then I will tell the team.",
               [ToolCall("c1", "create_order", {"item": "apple"})]),
    ModelReply("The apple is on its way; letting the team know now.",
               [ToolCall("c2", "notify", {"text": "apple ordered"})]),
    ModelReply("Next the pear, a note, and the plum, all in one go.",
               [ToolCall("c3", "create_order", {"item": "pear"}),
                ToolCall("c4", "notify", {"text": "pear and plum coming"}),
                ToolCall("c5", "create_order", {"item": "plum"})]),
    ModelReply("All done: apple, pear and plum are ordered and the team knows."),
]
"""The turn, one reply per model call: 4 model steps and 5 tool steps (c3 to c5 a batch)."""

CALLS: list[ToolCall] = [c for r in SCRIPT for c in r.tool_calls]
LOCAL_CALLS = [c.id for c in CALLS if c.name == "create_order"]
REMOTE_CALLS = [c.id for c in CALLS if c.name == "notify"]
STEPS = len(SCRIPT) + len(CALLS)
"""Committed steps in the turn; ``step:STEPS`` kills after the turn completed."""
FINAL_TEXT = SCRIPT[-1].text

ORDERS_DDL = "CREATE TABLE IF NOT EXISTS orders (call_id TEXT NOT NULL, item TEXT, pid INTEGER)"
COMMIT_EVENTS = ("message.completed", "action.completed")
CHILD_TIMEOUT = 30.0
"""The bound on every wait of a child, and of the test on a child."""


def die() -> NoReturn:
    """SIGKILL this process: no cleanup, no flush, no finally blocks."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL was not delivered")


@dataclass(frozen=True)
class KillPoint:
    kind: str
    """``accepted``, ``step``, ``local``, ``remote``, ``model``, ``stream``; ``""``: none."""
    at: str = ""

    @classmethod
    def parse(cls, spec: str | None) -> KillPoint:
        if not spec:
            return cls("")
        kind, _, at = spec.partition(":")
        if kind == "accepted":
            return cls(kind, "0")
        if kind not in ("step", "local", "remote", "model", "stream") or not at:
            raise SystemExit(f"bad --kill {spec!r}")
        return cls(kind, at)

    def hits(self, kind: str, at: str | int) -> bool:
        return self.kind == kind and self.at == str(at)


@dataclass(frozen=True)
class Config:
    db: Path
    tag: str
    kill: KillPoint
    gate: bool
    hold: str | None

    @property
    def work(self) -> Path:
        return self.db.parent


# -- the agent --------------------------------------------------------------------------------


def build_agent(cfg: Config) -> Agent:
    effects = cfg.work / "effects.jsonl"

    @tool
    def create_order(item: str, ctx: ToolContext) -> dict[str, Any]:
        """Place an order for one item."""
        conn = ctx.store.unwrap()
        cur = conn.execute(
            "INSERT INTO orders (call_id, item, pid) VALUES (?, ?, ?)",
            (ctx.call_id, item, os.getpid()),
        )
        if cfg.kill.hits("local", ctx.call_id):
            die()  # the row is written through the handle; the step has not committed
        return {"item": item, "row": cur.lastrowid}

    @tool
    async def notify(text: str, ctx: ToolContext) -> str:
        """Tell the team something."""
        if cfg.gate:
            await wait_for_file(cfg.work / "go", "the test's go file")
        line = {"call": ctx.call_id, "key": ctx.idempotency_key, "tag": cfg.tag,
                "pid": os.getpid(), "text": text}
        with effects.open("a") as f:
            f.write(json.dumps(line) + "\n")
        if cfg.kill.hits("remote", ctx.call_id):
            die()  # the side effect happened; its result is not committed
        if cfg.hold == ctx.call_id:
            (cfg.work / f"held-{cfg.tag}").touch()
            await asyncio.Event().wait()  # the test kills us here (main() bounds the wait)
        return "sent"

    return Agent(AGENT, "You run the shop's orders.", [create_order, notify])


def build_model(cfg: Config) -> Model:
    def reply(request: ModelRequest) -> ModelReply:
        i = calls_this_turn(request)
        if cfg.kill.hits("model", i):
            die()
        return SCRIPT[i]

    model: Model = scripted(reply, chunks=3)
    if cfg.kill.kind == "stream":
        model = KillMidStream(model, int(cfg.kill.at))
    return model


class KillMidStream:
    """A model that wraps another and dies after two deltas of the turn's ``call``-th call."""

    def __init__(self, inner: Model, call: int) -> None:
        self.inner = inner
        self.call = call

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        deltas = 0
        mine = calls_this_turn(request) == self.call
        async for ev in self.inner.stream(request):
            yield ev  # the engine publishes a delta before it asks for the next event
            if mine and isinstance(ev, TextDelta):
                deltas += 1
                if deltas == 2:
                    die()


@dataclass(frozen=True)
class Recorder:
    """An EventSink around a callback."""

    emit: Callable[[TurnEvent], None]


def recorder(cfg: Config) -> Callable[[TurnEvent], None]:
    out = (cfg.work / f"events-{cfg.tag}.jsonl").open("a", buffering=1)
    committed = 0

    def record(e: TurnEvent) -> None:
        nonlocal committed
        line = {"type": e.type, "seq": e.seq, "t": time.monotonic(), **e.payload()}
        out.write(json.dumps(line) + "\n")
        out.flush()
        if e.type == "turn.started" or e.type in COMMIT_EVENTS:
            if e.type in COMMIT_EVENTS:
                committed += 1
            if cfg.kill.hits("step", committed):
                die()

    return record


# -- the child --------------------------------------------------------------------------------


async def wait_for_file(path: Path, what: str, timeout: float = CHILD_TIMEOUT) -> None:
    """Poll for ``path`` to exist (a bounded wait on a file the test writes, not a sleep)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def wait_for_child_file(path: Path, proc: subprocess.Popen[bytes],
                              timeout: float = CHILD_TIMEOUT) -> None:
    """Poll for a file a child process writes (a bounded wait, not a sleep); fail at once if
    the child ended without writing it."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None or path.exists(), f"the child ended before {path.name}"
        assert time.monotonic() < deadline, f"no {path.name}"
        await asyncio.sleep(0.02)


async def child(cfg: Config, recover: bool, barrier: int | None) -> None:
    # The recorder is the runtime's sink: called as each event is published, before the
    # engine goes on, so a kill point right after a delta or a commit sees it recorded.
    rt = Runtime([build_agent(cfg)], SqliteStore(cfg.db), build_model(cfg),
                 sink=Recorder(recorder(cfg)))
    async with rt:
        # On a connection of its own that may wait: the store's writer never waits on the
        # loop, and another child may hold the write lock right now (a busy error here
        # was a flaky failure of the concurrent-delivery test).
        with contextlib.closing(sqlite3.connect(cfg.db, timeout=CHILD_TIMEOUT)) as own:
            own.execute(ORDERS_DDL)
        session = rt.session(AGENT, SESSION)
        if barrier is not None:
            (cfg.work / f"ready-{cfg.tag}").touch()
            # Every child shares the pipe; the test closes its write end to release them all.
            await asyncio.to_thread(os.read, barrier, 1)
        t_start = time.monotonic()
        new = None
        if recover:
            await rt.recover()
        else:
            new = (await session.start(TEXT, turn_id=TURN_ID)).new
        t_delivered = time.monotonic()
        (cfg.work / f"delivered-{cfg.tag}").touch()
        if cfg.kill.kind == "accepted":
            die()  # the turn is durable; its pump has not run yet
        res = await session.result(TURN_ID)
        await rt.idle()
        report = {"status": res.status, "text": res.text, "error": res.error, "new": new,
                  "pid": os.getpid(), "t_start": t_start, "t_delivered": t_delivered,
                  "t_done": time.monotonic()}
    (cfg.work / f"report-{cfg.tag}.json").write_text(json.dumps(report))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("db", type=Path)
    p.add_argument("--tag", required=True)
    p.add_argument("--kill", default=None)
    p.add_argument("--recover", action="store_true")
    p.add_argument("--barrier", type=int, default=None, metavar="FD")
    p.add_argument("--gate", action="store_true")
    p.add_argument("--hold", default=None)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    cfg = Config(a.db, a.tag, KillPoint.parse(a.kill), a.gate, a.hold)
    asyncio.run(asyncio.wait_for(child(cfg, a.recover, a.barrier), timeout=CHILD_TIMEOUT))


# -- the test side ----------------------------------------------------------------------------


def command(db: Path, tag: str, *args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), str(db), "--tag", tag, *args]


def run(db: Path, tag: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one child to its end (or its SIGKILL) and return how it went."""
    return subprocess.run(command(db, tag, *args), capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT, check=False)


def spawn(db: Path, tag: str, *args: str, gate: int | None = None) -> subprocess.Popen[str]:
    """Start one child; with ``gate`` (a pipe's read end) it waits on it (``--barrier``)."""
    fds: tuple[int, ...] = ()
    if gate is not None:
        args, fds = (*args, "--barrier", str(gate)), (gate,)
    return subprocess.Popen(command(db, tag, *args), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            pass_fds=fds)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = CHILD_TIMEOUT) -> None:
    """Poll ``cond`` until it holds (a bounded wait on a condition, not a sleep)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def in_acquire(proc: subprocess.Popen[str], db: Path) -> bool:
    """Whether the child has the lease file open: it is inside ``acquire()`` or holds a lease.

    ``SqliteStore.acquire`` opens ``<db>-lease`` before it polls for the session's byte lock
    and closes it on release, so this tells a test a child has reached the lease.
    """
    lease = str(db.parent / f"{db.name}-lease")
    fd_dir = Path(f"/proc/{proc.pid}/fd")
    try:
        for fd in fd_dir.iterdir():
            try:
                if os.readlink(fd) == lease:
                    return True
            except FileNotFoundError:
                continue
    except FileNotFoundError:
        return False
    return False


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(db: Path, tag: str) -> list[dict[str, Any]]:
    return read_jsonl(db.parent / f"events-{tag}.jsonl")


def deltas(db: Path, tag: str) -> str:
    """All the ``message.delta`` text a child streamed, in order."""
    return "".join(e["text"] for e in events(db, tag) if e["type"] == "message.delta")


def effects(db: Path) -> list[dict[str, Any]]:
    return read_jsonl(db.parent / "effects.jsonl")


def report(db: Path, tag: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((db.parent / f"report-{tag}.json").read_text())
    return data


def crash(db: Path, tag: str, kill: str, *args: str) -> None:
    """Run a child that must die by SIGKILL at ``kill``."""
    proc = run(db, tag, "--kill", kill, *args)
    if proc.returncode != -signal.SIGKILL:
        raise AssertionError(
            f"child {tag!r} was not killed at {kill} (exit {proc.returncode}):\n{proc.stderr}"
        )


def deliver(db: Path, tag: str, *args: str) -> dict[str, Any]:
    """Run a child that must finish cleanly (nothing logged) and return its report."""
    proc = run(db, tag, *args)
    if proc.returncode != 0 or proc.stderr:
        raise AssertionError(f"child {tag!r} failed (exit {proc.returncode}):\n{proc.stderr}")
    return report(db, tag)


@dataclass(frozen=True)
class State:
    """What the store holds for the harness's session, read from the test process."""

    messages: list[Message]
    turn: ChainEntry | None
    status: str | None
    events: list[TurnEvent]
    rows: list[tuple[str, str, int]]
    """``orders`` rows: (call id, item, pid of the writer), in insertion order."""

    def tool_results(self) -> set[str]:
        return {m.call_id for m in self.messages if m.role == "tool" and m.call_id}

    def replies(self) -> list[str]:
        return [m.text for m in self.messages if m.role == "assistant"]


async def load(db: Path) -> State:
    store = SqliteStore(db)
    await store.open()
    try:
        key = SessionKey(AGENT, SESSION)
        info = await store.session_info(key)
        rows = store.unwrap().execute(
            "SELECT call_id, item, pid FROM orders ORDER BY rowid"
        ).fetchall()
        return State(
            messages=await store.read_messages(key),
            turn=await get_turn(store, key, TURN_ID),
            status=info.status if info else None,
            events=await store.read_events(key),
            rows=[tuple(r) for r in rows],
        )
    finally:
        await store.close()


if __name__ == "__main__":
    main()
