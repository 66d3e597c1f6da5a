"""The demo's parent process: deliver a turn, SIGKILL it mid-way, deliver it again, check.

1. Open (or create) the SQLite file — a foreign or corrupt file is refused untouched.
2. Delivery 1: a child process (``durable-turns demo-child``) runs the turn and stops dead
   at the kill point, writing one line to a pipe; the parent SIGKILLs it on that line, so the
   crash lands on the same checkpoint every run (no timing involved).
3. Read what the store kept.
4. Delivery 2: a new child process delivers the same turn id; the engine replays it.
5. Read the store again; print the transcript, the orders, the outbox and the verdict.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.text import Text

from ..errors import StoreError
from ..stores.sqlite import SqliteStore
from .child import KILL_POINTS, UNREACHABLE
from .choice import OFFLINE, ModelChoice
from .ops import AGENT_NAME, REQUEST, check_schema, ensure_schema, outbox_path
from .report import StoreState, judge, read_state, render
from .term import rule

DEFAULT_KILL_POINT = "after-order-2"
AFTER_KILL = {
    "after-order-2": "the 3rd order, notify and the answer have not run yet",
    "inside-order-2": "the 2nd order's row was inserted but never committed: it vanished "
                      "with its step, which will run again",
    "inside-notify": "notify's post is in the outbox, but its step was never recorded: "
                     "it will run again (a remote tool is at-least-once)",
}


class DemoInputError(Exception):
    """The demo cannot run with what it was given (exit code 2)."""


class DemoFailure(Exception):
    """A step of the demo did not go as it must (exit code 1)."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """``durable-turns demo``'s options."""

    db: Path | None = None
    """The SQLite file; ``None``: a new one in a temporary directory."""
    keep: bool = False
    """Keep the temporary directory (and say where it is)."""
    kill_at: str = DEFAULT_KILL_POINT
    model: ModelChoice = OFFLINE
    """The model every delivery runs on (:func:`~.choice.choose_model` decides it)."""
    timeout: float | None = None
    """Seconds a child may take before the demo gives up on it (default: 60 with the
    scripted model, 600 with a real one)."""

    @property
    def child_timeout(self) -> float:
        if self.timeout is not None:
            return self.timeout
        return 60.0 if self.model.scripted else 600.0


async def run_demo(opts: DemoOptions, console: Console) -> int:
    """Run the demo; 0 when the verdict passes, 1 when it does not.

    Raises:
        DemoInputError: ``--db`` is unusable (nothing was written to it).
        DemoFailure: a child process misbehaved (the message says which and how).
    """
    if opts.kill_at not in KILL_POINTS:
        raise DemoInputError(f"unknown kill point {opts.kill_at!r}; one of {list(KILL_POINTS)}")
    workdir: Path | None = None
    if opts.db is None:
        workdir = Path(tempfile.mkdtemp(prefix="durable-turns-demo-"))
        db = workdir / "demo.sqlite"
    else:
        db = opts.db.expanduser().absolute()
    try:
        await prepare_db(db)
        return await _run(db, opts, console)
    finally:
        if workdir is not None:
            if opts.keep:
                console.print(f"kept {workdir} (the store, its -wal/-lease files and the outbox)")
            else:
                shutil.rmtree(workdir, ignore_errors=True)


async def prepare_db(db: Path, *, create: bool = True) -> None:
    """Check that ``db`` is (or, with ``create``, may become) the demo's SQLite store.

    Without ``create`` nothing is created in it: it must be a database the demo made (its
    ``orders`` and ``refunds`` tables), so that the demo's agent never runs on an app's.

    Raises:
        DemoInputError: it is a directory, its directory is missing, it does not exist
            (without ``create``), it is not a durable_turns store, or (without ``create``)
            not the demo's (left untouched).
    """
    if db.is_dir():
        raise DemoInputError(f"--db {db} is a directory; give the path of a file")
    if not create and not db.exists():
        raise DemoInputError(f"--db {db}: no such file")
    if not db.parent.is_dir():
        raise DemoInputError(f"--db {db}: the directory {db.parent} does not exist")
    store = SqliteStore(db)
    try:
        await store.open()
        (ensure_schema if create else check_schema)(store.unwrap())
    except StoreError as e:
        raise DemoInputError(str(e)) from e
    finally:
        await store.close()


async def _run(db: Path, opts: DemoOptions, console: Console) -> int:
    session_id = f"desk-{uuid.uuid4().hex[:8]}"
    turn_id = f"turn-{uuid.uuid4().hex[:12]}"
    _header(console, db, session_id, turn_id, opts)
    common = ["--db", str(db), "--session", session_id, "--turn", turn_id,
              "--model", opts.model.spec]

    rule(console, f"delivery 1: a child process; SIGKILL {KILL_POINTS[opts.kill_at]}")
    killed = await _deliver_and_kill(console, [*common, "--delivery", "1",
                                               "--kill-at", opts.kill_at],
                                    opts.child_timeout)
    at_kill = await read_state(db, session_id, turn_id)
    console.print(_describe(at_kill, "the store after the kill"))
    console.print(Text(f"    {AFTER_KILL[opts.kill_at]}", style="dim"))

    rule(console, "delivery 2: the same turn id, delivered again in a new process")
    code = await _deliver(console, [*common, "--delivery", "2"], opts.child_timeout)
    if code != 0:
        raise DemoFailure(f"delivery 2 exited with code {code}; the turn did not complete")
    final = await read_state(db, session_id, turn_id)

    rule(console, "what the store shows")
    verdict = judge(final, at_kill, killed)
    render(console, final, at_kill, verdict)
    return 0 if verdict.ok else 1


def _header(console: Console, db: Path, session_id: str, turn_id: str,
            opts: DemoOptions) -> None:
    kill_at = opts.kill_at
    rows = [
        ("store", f"{db} (SqliteStore, WAL)"),
        ("outbox", f"{outbox_path(db)} (notify's stand-in for a chat webhook)"),
        ("model", opts.model.label),
        ("agent", f"{AGENT_NAME}: create_order (local, exactly once), notify (remote, "
                  "at least once), list_orders"),
        ("session", f"{session_id}, turn {turn_id}"),
        ("request", REQUEST),
        ("plan", f"run the turn in a child process, SIGKILL it {KILL_POINTS[kill_at]}, "
                 "deliver the same turn id again in a new process, then check the store"),
    ]
    if not opts.model.scripted:
        rows.append(("note", "a real model words its replies differently every run; the kill "
                             "still lands on a committed tool step, watched in the event "
                             "stream, never on what the model says"))
    console.print(Text("durable-turns demo: an agent turn killed mid-way and delivered again",
                       style="bold"))
    for name, value in rows:
        console.print(Text.assemble((f"  {name:<8} ", "bold"), value))


def _describe(state: StoreState, what: str) -> Text:
    steps = state.step_ids()
    return Text.assemble(
        (f"  {what}: ", "bold"),
        f"turn {state.turn_status!r}, {len(steps)} step(s) recorded "
        f"({', '.join(steps) or 'none'}), {len(state.orders)} order row(s), "
        f"{len(state.outbox)} outbox line(s)",
    )


def _child_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "durable_turns.cli", "demo-child", *args]


async def _deliver(console: Console, args: list[str], timeout: float) -> int:
    """Run a delivery to its end; its exit code.

    Raises:
        DemoFailure: it did not end in time, or it could not reach the model.
    """
    read_fd, write_fd = os.pipe()
    console.file.flush()  # the child writes to the same stdout: keep the order of lines
    try:
        proc = await asyncio.create_subprocess_exec(
            *_child_cmd([*args, "--control-fd", str(write_fd)]),
            stdin=asyncio.subprocess.DEVNULL, pass_fds=(write_fd,),
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # only the child may hold it, so its exit means EOF for us
    try:
        code = await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        os.close(read_fd)
        raise DemoFailure(f"a delivery (pid {proc.pid}) did not finish in {timeout:g} s") from None
    _raise_if_unreachable(await _read_line(read_fd))
    return code


def _raise_if_unreachable(line: bytes) -> None:
    """A child's ``unreachable …`` line: the model was never reached, whatever it would say."""
    if line.startswith(UNREACHABLE.encode()):
        raise DemoFailure(line.removeprefix(UNREACHABLE.encode()).decode(errors="replace").strip())


async def _deliver_and_kill(console: Console, args: list[str], timeout: float) -> bool:
    """Run delivery 1 until it reports its kill point, then SIGKILL it. True once it died so."""
    read_fd, write_fd = os.pipe()
    console.file.flush()
    try:
        proc = await asyncio.create_subprocess_exec(
            *_child_cmd([*args, "--control-fd", str(write_fd)]),
            # Our end of its stdin: if this process dies, the paused child sees EOF and exits.
            stdin=asyncio.subprocess.PIPE,
            pass_fds=(write_fd,),
        )
    finally:
        os.close(write_fd)  # only the child may hold it, so its death means EOF for us
    try:
        line = await asyncio.wait_for(_read_line(read_fd), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise DemoFailure(
            f"delivery 1 (pid {proc.pid}) did not reach its kill point in {timeout:g} s"
        ) from None
    if not line.startswith(b"paused "):
        code = await proc.wait()
        _raise_if_unreachable(line)
        raise DemoFailure(
            f"delivery 1 (pid {proc.pid}) exited with code {code} before reaching its kill "
            "point; the turn ended sooner than the demo's script expects (with a real model: "
            "it did not make the tool calls the kill point waits for; run it again, or pick "
            "another --kill-at)"
        )
    proc.send_signal(signal.SIGKILL)
    code = await proc.wait()
    if proc.stdin is not None:
        proc.stdin.close()
    console.print(Text(f"  ✗ SIGKILL sent to pid {proc.pid} (exit status {code})",
                       style="bold red"))
    return code == -signal.SIGKILL


async def _read_line(fd: int) -> bytes:
    """One line from a pipe, without blocking the event loop ('' at end of file)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    try:
        return await reader.readline()
    finally:
        transport.close()


__all__ = [
    "AFTER_KILL",
    "DEFAULT_KILL_POINT",
    "DemoFailure",
    "DemoInputError",
    "DemoOptions",
    "prepare_db",
    "run_demo",
]
