"""Per-step cost of the durable turn engine on SqliteStore, beside a raw sqlite3 floor.

Usage (from the repository root, with the package installed)::

    python bench/steps.py            # the full run (< 2 minutes)
    python bench/steps.py --quick    # a smaller run, for a smoke check
    python bench/steps.py --json     # the same figures, machine-readable
    python bench/steps.py --profile engine.prof   # cProfile one engine run, print hot spots

The workload (issue 2): a zero-latency scripted model; turns of ``--calls`` (10) sequential
tool calls, so ``2 * calls + 1`` (21) steps per turn; ``--turns`` (10) turns on each of
``--sessions`` (20) sessions, driven one turn at a time, round robin. It runs twice: with a
*local* tool (a plain ``def`` writing one row through ``ctx.store.unwrap()`` inside the step's
transaction) and with a *remote* tool (an ``async def`` writing nothing).

The floor is a raw ``sqlite3`` loop over the same schema with the same PRAGMAs (WAL,
``synchronous=NORMAL``) that writes exactly the rows the engine writes, in the same
transactions — the turn row (one statement); the lease claim (``UPDATE sessions SET epoch =
epoch + 1``, one statement per turn, as the engine claims the session's lease for each turn it
drives); the
opening transaction (one ``log`` row: the opening message and ``turn.started``; turn and
session status); then per step one transaction with one ``log`` row holding the step's
message, checkpoint and events (and the tool's row), the last step also ending the turn —
with the same JSON, built per step with the engine's encoder (orjson). Every transaction
that writes a step (the opening's too) is fenced: it writes only while the session's epoch is
the one its claim got, which is part of what makes a step's write correct when a lease can
be lost (a writer without it could commit after another process took the session over), so
an honest floor for "the same writes with the same guarantees" pays it too. As in the
engine, a step that writes only its row does it in one statement, its own transaction
(``INSERT INTO log … SELECT … FROM sessions WHERE sid = ? AND epoch = ?``, then the row
count checked); the opening and the last step, which also update the turn and the session,
run ``SELECT epoch FROM sessions WHERE sid = ?`` in their transaction. ``--no-fence`` drops
the check from the floor, to see what it costs (the rows stay identical). Those two also
write the ``log_transcript`` row the engine writes there once 32 messages are not copied yet.
Apart from the epoch the floor reads nothing — not the newest seq or the message count the
engine's claim reads, nor the chain, nor the messages the engine reads back to copy them —
and keeps no state but four counters per session and the messages not copied yet.
After the first repetition the two databases are compared row by row, so the floor provably
does the same writes.

Beside it runs issue 15's *minimal floor* (:class:`MinimalFloor`): raw ``sqlite3``, WAL,
``synchronous=NORMAL``, one transaction and two rows (a message and an event) per step, no
lease, chain or fencing; the engine's ratio to it is reported in CPU and wall time.

``--sessions 100 --turns 2`` drives more sessions than the runtime's transcript cache holds
(64): each turn then starts on a session whose log was evicted, and reads it from the store
(the floor never reads it).

Every measured run happens in its own child process (clean ``ru_maxrss`` and
``/proc/self/io``) on a fresh database in a temporary directory. Figures are the median of
``--repeat`` runs. µs/step is wall time over the whole workload divided by its steps, so it
includes each turn's start and end (the floor's too); CPU µs/step is the same with
``time.process_time()`` (less sensitive to other load on the machine, blind to I/O waits).
Bytes per step: the JSON stored in the log's rows and the transcript's copies of the
messages (and with their key columns),
the bytes SQLite handed to ``write()`` (``wchar``: WAL frames and checkpoints) and the bytes
the kernel accounted to storage (``write_bytes``).

History: one session is grown to ``--history`` (2,000) messages; then turns alternate between
a fresh session (a step sees ~10 messages of history) and the long one (~2,000). A step's time
is the gap between the events it publishes after its commit (``turn.started`` →
``message.completed`` → ``action.completed`` → …, seen by the runtime's ``sink``, which is
called synchronously after each commit), so it excludes turn set-up; the ratio is of the
medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import re
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from durable_turns import (
    Agent,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.stores import sqlite as sqlite_store
from durable_turns.stores.sqlite import TRANSCRIPT_CHUNK

SCHEMA: list[str] = list(getattr(sqlite_store, "CREATE", None) or sqlite_store.MIGRATIONS)  # type: ignore[attr-defined]
"""The engine's schema, as its own statements make it (``CREATE``; the engine before the store
kit, ce07366, had only its ``MIGRATIONS``), so this script measures either version."""

AGENT = "bench"
OPENING = "run the counter tool ten times, one call after the other"
FINAL = "done: all calls returned"
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_effects ("
    "id INTEGER PRIMARY KEY, turn_id TEXT NOT NULL, call_id TEXT NOT NULL, n INTEGER NOT NULL)"
)
EFFECT_INSERT = "INSERT INTO bench_effects (turn_id, call_id, n) VALUES (?, ?, ?)"
TARGET_RATIO = 2.0
TARGET_MINIMAL = 1.5
"""Issue 15's target: CPU per step within 1.5x the minimal floor (:class:`MinimalFloor`)."""
TARGET_HISTORY = 1.3


@dataclass(frozen=True)
class Workload:
    sessions: int = 20
    turns: int = 10
    """Turns per session."""
    calls: int = 10
    """Sequential tool calls per turn (steps per turn = 2 * calls + 1)."""
    tool: str = "local"
    """``local`` (plain def, one row through the raw handle) or ``remote`` (async def)."""

    @property
    def steps_per_turn(self) -> int:
        return 2 * self.calls + 1

    @property
    def steps(self) -> int:
        return self.sessions * self.turns * self.steps_per_turn


def session_id(i: int) -> str:
    return f"s{i:03d}"


def turn_id(i: int, t: int) -> str:
    return f"s{i:03d}-t{t:04d}"


def call_id(tid: str, k: int) -> str:
    return f"{tid}-c{k:02d}"


def tool_name(kind: str) -> str:
    return "count_local" if kind == "local" else "count_remote"


def _dumps(v: Any) -> str:
    # The encoder the engine writes its records with (orjson, compact): the floors pay
    # for their JSON what the engine pays.
    return orjson.dumps(v).decode()


def _events(*events: tuple[str, dict[str, Any]]) -> str:
    """A log row's events as the engine writes them: ``[[type, fields], …]``, each with what
    the row's message does not hold (``"@": 0`` names it), then ``at`` (the time)."""
    return _dumps([[t, {**fields, "at": time.time()}] for t, fields in events])


_AT = re.compile(r'"at":[-+.\deE]+')


def _rows(c: sqlite3.Connection, table: str, key: str) -> list[Any]:
    rows = c.execute(f"SELECT * FROM {table} ORDER BY {key}").fetchall()
    if table == "log":  # the same rows but for the times their events were written
        rows = [(*r[:-1], r[-1] and _AT.sub('"at":0', r[-1])) for r in rows]
    return rows


# -- measurements -------------------------------------------------------------------------


def _proc_io() -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/self/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k.strip()] = int(v)
    return out


@contextlib.contextmanager
def measured(trace_memory: bool) -> Iterator[dict[str, Any]]:
    """Wall and CPU time, write() bytes (``wchar``), storage writes (``write_bytes``) and memory."""
    out: dict[str, Any] = {}
    # Every run starts measuring after a full collection, so whether the collector's next
    # full pass falls inside the run (a few ms, one in several runs) does not depend on
    # what was imported and allocated before it.
    gc.collect()
    if trace_memory:
        tracemalloc.start()
    io0 = _proc_io()
    c0 = time.process_time()
    t0 = time.perf_counter()
    yield out
    out["seconds"] = time.perf_counter() - t0
    out["cpu_seconds"] = time.process_time() - c0
    io1 = _proc_io()
    out["wchar"] = io1.get("wchar", 0) - io0.get("wchar", 0)
    out["write_bytes"] = io1.get("write_bytes", 0) - io0.get("write_bytes", 0)
    if trace_memory:
        out["traced_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    out["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def payload_bytes(db: Path) -> dict[str, int]:
    """Bytes of the stored values of the log (the floors': of their tables)."""
    c = sqlite3.connect(db)
    try:
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "log" not in tables:  # the minimal floor
            m = c.execute("SELECT count(*), coalesce(sum(length(CAST(body AS BLOB))), 0) "
                          "FROM floor_messages").fetchone()
            e = c.execute("SELECT count(*), coalesce(sum(length(CAST(data AS BLOB))), 0) "
                          "FROM floor_events").fetchone()
            return {"rows": m[0] + e[0], "json_bytes": m[1] + e[1],
                    "row_bytes": m[1] + e[1] + 16 * (m[0] + e[0])}
        r = c.execute(
            "SELECT count(*), coalesce(sum(coalesce(length(CAST(body AS BLOB)), 0) "
            "+ coalesce(length(CAST(memo AS BLOB)), 0) "
            "+ coalesce(length(CAST(events AS BLOB)), 0)), 0), "
            "coalesce(sum(coalesce(length(CAST(turn_id AS BLOB)), 0) "
            "+ coalesce(length(CAST(step AS BLOB)), 0)), 0) FROM log"
        ).fetchone()
        # the messages copied again, many to a row (the engine's schema version 4 on)
        t = c.execute("SELECT count(*), coalesce(sum(length(CAST(body AS BLOB))), 0) "
                      "FROM log_transcript").fetchone() if "log_transcript" in tables else (0, 0)
    finally:
        c.close()
    return {
        "rows": r[0] + t[0], "json_bytes": r[1] + t[1],
        # text keys plus the integer columns (sid, seq, sub, gen, n; the transcript's 4)
        "row_bytes": r[1] + r[2] + 8 * 5 * r[0] + t[1] + 8 * 4 * t[0],
    }


# -- the engine ---------------------------------------------------------------------------


def build_agent(kind: str, calls: int) -> tuple[Any, Any]:
    """The agent (one trivial tool) and the zero-latency scripted model."""
    if kind == "local":
        @tool(name="count_local")
        def count_local(n: int, ctx: ToolContext) -> dict[str, Any]:
            """Count one call, writing one row inside the step's transaction."""
            ctx.store.unwrap().execute(EFFECT_INSERT, (ctx.turn_id, ctx.call_id, n))
            return {"n": n, "ok": True}

        the_tool = count_local
    else:
        @tool(name="count_remote")
        async def count_remote(n: int) -> dict[str, Any]:
            """Count one call, remotely (does nothing, returns at once)."""
            return {"n": n, "ok": True}

        the_tool = count_remote
    name = the_tool.name

    def reply(request: Any) -> Any:
        # Zero latency, O(1): the next call's number follows from the last message (the
        # opening, or the tool message of call k), never from a walk over the transcript.
        last = request.messages[-1]
        k = int(last.call_id.rsplit("-c", 1)[1]) + 1 if last.role == "tool" else 0
        if k < calls:
            tid = request.turn_id
            return ModelReply(tool_calls=[ToolCall(call_id(tid, k), name, {"n": k})])
        return ModelReply(FINAL)

    return Agent(AGENT, "You are a benchmark.", [the_tool]), scripted(reply)


async def engine_main(db: Path, w: Workload, trace_memory: bool) -> dict[str, Any]:
    agent, model = build_agent(w.tool, w.calls)
    store = SqliteStore(db)
    async with Runtime([agent], store, model) as rt:
        store.unwrap().execute(EFFECTS_DDL)
        sessions = [rt.session(AGENT, session_id(i)) for i in range(w.sessions)]
        with measured(trace_memory) as out:
            for t in range(w.turns):
                for i, s in enumerate(sessions):
                    r = await s.turn(OPENING, turn_id=turn_id(i, t))
                    if r.status != "completed":
                        raise SystemExit(f"turn {r.turn_id} ended {r.status}: {r.error}")
    return out


def run_engine(db: Path, w: Workload, trace_memory: bool = False) -> dict[str, Any]:
    return asyncio.run(engine_main(db, w, trace_memory))


# -- the floor ----------------------------------------------------------------------------


def _nothing() -> None:
    pass


class Floor:
    """A raw sqlite3 writer of exactly the engine's rows: no objects, no events, and no reads
    but the fencing check (``fence=False`` drops it).

    Each call of :meth:`turn` writes one turn: the turn row, the lease claim (a new epoch),
    the opening transaction, then one transaction per step (one ``log`` row with the same
    JSON, built per step with the engine's encoder), each checking the epoch before it
    commits. As in the engine, a step that writes its row and nothing else is one statement
    (``INSERT … SELECT … WHERE epoch = ?``); the opening and the end also update the turn and
    the session in their transaction.
    """

    LOG = ("INSERT INTO log (sid, seq, sub, gen, n, turn_id, body, step, memo, events) "
           "VALUES (?, ?, 0, 0, ?, ?, ?, ?, ?, ?)")
    FENCED_LOG = ("INSERT INTO log (sid, seq, sub, gen, n, turn_id, body, step, memo, events) "
                  "SELECT ?, ?, 0, 0, ?, ?, ?, ?, ?, ? FROM sessions WHERE sid = ? AND epoch = ?")
    TURN = (
        "UPDATE turns SET status = ?, text = ?, error = ?, reason = ?, request = ?, "
        "data = coalesce(?, data) WHERE sid = ? AND turn_id = ?"
    )
    STATUS = "UPDATE sessions SET status = ? WHERE sid = ?"
    TRANSCRIPT = "INSERT INTO log_transcript (sid, gen, n, seq, body) VALUES (?, ?, ?, ?, ?)"
    CLAIM = "UPDATE sessions SET epoch = epoch + 1 WHERE sid = ? RETURNING epoch"
    FENCE = "SELECT epoch FROM sessions WHERE sid = ?"

    def __init__(self, db: Path, calls: int, tool_kind: str, fence: bool = True) -> None:
        self.conn = c = sqlite3.connect(db, isolation_level=None)
        c.execute("PRAGMA journal_mode = WAL")
        c.execute("PRAGMA synchronous = NORMAL")
        for ddl in SCHEMA:  # the engine's own schema
            c.executescript(ddl)
        c.execute(EFFECTS_DDL)
        self.calls = calls
        self.name = tool_name(tool_kind)
        self.local = tool_kind == "local"
        self.fence = fence
        self.sessions: dict[str, list[int]] = {}
        """session id → [sid, message count, last event seq, epoch]"""
        self.uncopied: dict[str, list[tuple[int, int, str]]] = {}
        """session id → ``(n, seq, body)`` of its log rows not in ``log_transcript`` yet"""

    def copy_transcript(self, session: str, sid: int, rows: list[tuple[int, int, str]]) -> None:
        """The engine's ``log_transcript`` row, in a commit that moves the chain: the messages
        not copied yet, once there are ``TRANSCRIPT_CHUNK`` of them (kept here, not read)."""
        pending = self.uncopied.setdefault(session, [])
        pending += rows
        copied = pending[0][0] - 1
        if pending[-1][0] - copied >= TRANSCRIPT_CHUNK:
            self.conn.execute(self.TRANSCRIPT, (sid, 0, pending[-1][0], pending[-1][1],
                                                "\n".join([r[2] for r in pending])))
            pending.clear()

    def close(self) -> None:
        self.conn.close()

    def turn(self, session: str, tid: str, stamps: list[float] | None = None) -> None:
        ex = self.conn.execute
        name, local = self.name, self.local
        LOG, FENCE = self.LOG, self.FENCE
        opening = _dumps({"v": 1, "role": "user", "text": OPENING, "turn": tid})
        # accept the turn (creating the session on its first): one statement, as the engine
        state = self.sessions.get(session)
        if state is None:
            cur = ex("INSERT INTO sessions (agent, session) VALUES (?, ?)", (AGENT, session))
            state = self.sessions[session] = [cur.lastrowid or 0, 0, 0, 0]
        sid, n, seq, _ = state
        ex("INSERT INTO turns (sid, turn_id, kind, status, opening, event, policy, data) "
           "VALUES (?, ?, 'turn', 'queued', ?, ?, ?, ?)", (sid, tid, opening, None, None, None))
        # claim the session's lease: a new epoch (one statement)
        epoch = state[3] = ex(self.CLAIM, (sid,)).fetchall()[0][0]

        def check() -> None:
            # the fencing check of every step's commit (one primary-key read)
            if ex(FENCE, (sid,)).fetchone()[0] != epoch:
                ex("ROLLBACK")
                raise RuntimeError(f"floor: lost the lease of {session}")

        fence = check if self.fence else _nothing

        def append(row: tuple[Any, ...]) -> None:
            # A step that writes its row and nothing else: the fencing check and the write
            # in one statement, its own transaction (as the engine writes it).
            if not self.fence:
                ex(LOG, row)
            elif ex(self.FENCED_LOG, (*row, sid, epoch)).rowcount != 1:
                raise RuntimeError(f"floor: lost the lease of {session}")

        # the opening
        ex("BEGIN IMMEDIATE")
        fence()
        ex(LOG, (sid, seq + 1, n + 1, tid, opening, None, None,
                 _events(("turn.started", {"@": 0}))))
        ex(self.TURN, ("running", None, None, None, None, None, sid, tid))
        self.copy_transcript(session, sid, [(n + 1, seq + 1, opening)])
        ex(self.STATUS, ("running", sid))
        ex("COMMIT")
        n, seq = n + 1, seq + 1
        if stamps is not None:
            stamps.append(time.perf_counter())
        written: list[tuple[int, int, str]] = []  # (n, seq, body) for the transcript
        for k in range(self.calls):
            # model step: the assistant message, its checkpoint and its events in one row
            call = {"id": call_id(tid, k), "name": name, "input": {"n": k}}
            body = _dumps({"v": 1, "role": "assistant", "calls": [call], "turn": tid})
            written.append((n + 1, seq + 2, body))
            append((sid, seq + 2, n + 1, tid, body,
                    f"model:{n}", _dumps({"m": n, "stop": "tool_use"}),
                    _events(("message.completed", {"@": 0, "stop_reason": "tool_use"}),
                            ("action.requested", {"@": 0, "c": 0}))))
            a, n, seq = n, n + 1, seq + 2
            if stamps is not None:
                stamps.append(time.perf_counter())
            # tool step: (the tool's row) + result + tool message + its event
            if local:
                ex("BEGIN IMMEDIATE")
                ex(EFFECT_INSERT, (tid, call["id"], k))
            result = {"n": k, "ok": True}
            body = _dumps({"v": 1, "role": "tool", "call_id": call["id"], "result": result,
                           "turn": tid})
            written.append((n + 1, seq + 1, body))
            append((sid, seq + 1, n + 1, tid, body,
                    f"tool:{a}:{call['id']}", f'{{"m":{n}}}',
                    _events(("action.completed", {"@": 0, "call": call}))))
            if local:
                ex("COMMIT")
            n, seq = n + 1, seq + 1
            if stamps is not None:
                stamps.append(time.perf_counter())
        # the final model step ends the turn
        ex("BEGIN IMMEDIATE")
        fence()
        body = _dumps({"v": 1, "role": "assistant", "text": FINAL, "turn": tid})
        written.append((n + 1, seq + 2, body))
        ex(LOG, (sid, seq + 2, n + 1, tid, body,
                 f"model:{n}", _dumps({"m": n, "stop": "end_turn"}),
                 _events(("message.completed", {"@": 0, "stop_reason": "end_turn"}),
                         ("turn.completed", {"@": 0}))))
        ex(self.TURN, ("completed", FINAL, None, None, None, None, sid, tid))
        self.copy_transcript(session, sid, written)
        ex(self.STATUS, ("idle", sid))
        ex("COMMIT")
        if stamps is not None:
            stamps.append(time.perf_counter())
        state[1], state[2] = n + 1, seq + 2


class MinimalFloor:
    """The issue's minimal floor: raw sqlite3 (WAL, ``synchronous=NORMAL``), one transaction
    and two rows per step (the step's message and one event, each JSON-encoded), no
    lease, no chain, no fencing: what any durable agent loop on SQLite must at least pay."""

    def __init__(self, db: Path, calls: int) -> None:
        self.conn = c = sqlite3.connect(db, isolation_level=None)
        c.execute("PRAGMA journal_mode = WAL")
        c.execute("PRAGMA synchronous = NORMAL")
        c.execute("CREATE TABLE floor_messages (sid INTEGER NOT NULL, idx INTEGER NOT NULL, "
                  "body TEXT NOT NULL, PRIMARY KEY (sid, idx))")
        c.execute("CREATE TABLE floor_events (sid INTEGER NOT NULL, seq INTEGER NOT NULL, "
                  "data TEXT NOT NULL, PRIMARY KEY (sid, seq))")
        self.steps = 2 * calls + 1
        self.counts: dict[str, list[int]] = {}

    def close(self) -> None:
        self.conn.close()

    def turn(self, session: str, tid: str) -> None:
        ex = self.conn.execute
        state = self.counts.setdefault(session, [len(self.counts) + 1, 0])
        sid, n = state
        for k in range(self.steps):
            ex("BEGIN IMMEDIATE")
            ex("INSERT INTO floor_messages VALUES (?, ?, ?)",
               (sid, n, _dumps({"role": "assistant", "turn": tid, "step": k})))
            ex("INSERT INTO floor_events VALUES (?, ?, ?)",
               (sid, n + 1, _dumps({"type": "step", "turn": tid, "step": k,
                                    "at": time.time()})))
            ex("COMMIT")
            n += 1
        state[1] = n


def _drive_floor(floor: Floor | MinimalFloor, w: Workload,
                 trace_memory: bool) -> dict[str, Any]:
    """A floor over the whole workload, in the engine's order."""
    with measured(trace_memory) as out:
        for t in range(w.turns):
            for i in range(w.sessions):
                floor.turn(session_id(i), turn_id(i, t))
    floor.close()
    return out


def run_minimal(db: Path, w: Workload, trace_memory: bool = False) -> dict[str, Any]:
    """The minimal floor over the whole workload's steps."""
    return _drive_floor(MinimalFloor(db, w.calls), w, trace_memory)


def run_floor(db: Path, w: Workload, trace_memory: bool = False,
              fence: bool = True) -> dict[str, Any]:
    """The floor writing the engine's rows over the whole workload."""
    return _drive_floor(Floor(db, w.calls, w.tool, fence), w, trace_memory)


# -- history ------------------------------------------------------------------------------


def history_summary(gaps: dict[str, list[float]], turn_seconds: dict[str, list[float]],
                    grown: int, outside: list[float]) -> dict[str, Any]:
    med = {k: statistics.median(v) * 1e6 for k, v in gaps.items()}
    return {
        "turn_overhead_us": statistics.median(outside) * 1e6,
        "messages_at_start_of_long_probes": grown,
        "short_step_median_us": med["short"],
        "long_step_median_us": med["long"],
        "short_step_mean_us": statistics.fmean(gaps["short"]) * 1e6,
        "long_step_mean_us": statistics.fmean(gaps["long"]) * 1e6,
        "short_turn_ms": statistics.median(turn_seconds["short"]) * 1e3,
        "long_turn_ms": statistics.median(turn_seconds["long"]) * 1e3,
        "ratio": med["long"] / med["short"],
        "samples": len(gaps["long"]),
    }


def history_plan(calls: int, target: int, probes: int) -> tuple[int, list[tuple[str, str, str]]]:
    """Turns that grow ``long`` to ``target`` messages, then probes alternating fresh/long."""
    per_turn = 2 * calls + 2  # opening + 2 * calls + the final reply
    grow = -(-target // per_turn)
    plan = [("", "long", f"long-t{t:04d}") for t in range(grow)]
    for p in range(probes):
        plan.append(("short", f"short-{p:03d}", f"short-{p:03d}-t0"))
        plan.append(("long", "long", f"long-t{grow + p:04d}"))
    return grow * per_turn, plan


class StampSink:
    """A runtime sink: the time of each step's commit of one turn (the opening's, then one
    per step), taken when the runtime publishes its events, synchronously after the commit."""

    STEP_TYPES = frozenset(("turn.started", "message.completed", "action.completed"))

    def __init__(self) -> None:
        self.turn_id: str | None = None
        self.stamps: list[float] = []

    def start(self, turn_id: str) -> list[float]:
        self.turn_id, self.stamps = turn_id, []
        return self.stamps

    def emit(self, event: Any) -> None:
        if event.turn_id == self.turn_id and event.type in self.STEP_TYPES:
            self.stamps.append(time.perf_counter())


async def engine_history(db: Path, calls: int, target: int, probes: int) -> dict[str, Any]:
    agent, model = build_agent("remote", calls)
    gaps: dict[str, list[float]] = {"short": [], "long": []}
    turn_seconds: dict[str, list[float]] = {"short": [], "long": []}
    grown, plan = history_plan(calls, target, probes)

    sink = StampSink()

    async def timed_turn(rt: Any, sid: str, tid: str) -> tuple[list[float], float]:
        s = rt.session(AGENT, sid)
        stamps = sink.start(tid)
        t0 = time.perf_counter()
        r = await s.turn(OPENING, turn_id=tid)
        dt = time.perf_counter() - t0
        if r.status != "completed":
            raise SystemExit(f"turn {tid} ended {r.status}: {r.error}")
        return stamps, dt

    outside: list[float] = []
    async with Runtime([agent], SqliteStore(db), model, sink) as rt:
        for which, sid, tid in plan:
            stamps, dt = await timed_turn(rt, sid, tid)
            if which:
                gaps[which] += [b - a for a, b in itertools.pairwise(stamps)]
                turn_seconds[which].append(dt)
                outside.append(dt - (stamps[-1] - stamps[0]))
    # A new runtime has no cached transcript: its first turn reads the whole log once.
    async with Runtime([agent], SqliteStore(db), model, sink) as rt:
        _, cold = await timed_turn(rt, "long", f"long-t{len(plan):04d}")
    return {**history_summary(gaps, turn_seconds, grown, outside),
            "cold_long_turn_ms": cold * 1e3}


def floor_history(db: Path, calls: int, target: int, probes: int,
                  fence: bool = True) -> dict[str, Any]:
    floor = Floor(db, calls, "remote", fence)
    gaps: dict[str, list[float]] = {"short": [], "long": []}
    turn_seconds: dict[str, list[float]] = {"short": [], "long": []}
    grown, plan = history_plan(calls, target, probes)
    outside: list[float] = []
    for which, sid, tid in plan:
        stamps: list[float] = []
        t0 = time.perf_counter()
        floor.turn(sid, tid, stamps)
        dt = time.perf_counter() - t0
        if which:
            gaps[which] += [b - a for a, b in itertools.pairwise(stamps)]
            turn_seconds[which].append(dt)
            outside.append(dt - (stamps[-1] - stamps[0]))
    floor.close()
    return history_summary(gaps, turn_seconds, grown, outside)


# -- orchestration ------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """Run one measured phase in this process and print its figures as one JSON line."""
    db = Path(args.dir) / f"{args.phase}.sqlite"
    if args.phase == "history-engine":
        out = asyncio.run(engine_history(db, args.calls, args.history, args.probes))
    elif args.phase == "history-floor":
        out = floor_history(db, args.calls, args.history, args.probes, not args.no_fence)
    else:
        kind, _, tool_kind = args.phase.partition("-")
        w = Workload(args.sessions, args.turns, args.calls, tool_kind or "remote")
        if kind == "minimal":
            out = run_minimal(db, w, args.trace_memory)
        elif kind == "engine":
            out = run_engine(db, w, args.trace_memory)
        else:
            out = run_floor(db, w, args.trace_memory, not args.no_fence)
        out.update(payload_bytes(db))
        out["steps_run"] = w.steps
    print(json.dumps(out))


def spawn(phase: str, tmp: Path, args: argparse.Namespace, *, trace_memory: bool = False
          ) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix=f"{phase}-", dir=tmp))
    cmd = [sys.executable, __file__, "--phase", phase, "--dir", str(d),
           "--sessions", str(args.sessions), "--turns", str(args.turns),
           "--calls", str(args.calls), "--history", str(args.history),
           "--probes", str(args.probes)]
    if trace_memory:
        cmd.append("--trace-memory")
    if args.no_fence:
        cmd.append("--no-fence")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{proc.stderr}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["dir"] = str(d)
    return out


def engine_version() -> str:
    """Where the measured ``durable_turns`` comes from, and its git commit if it has one."""
    import durable_turns

    where = Path(durable_turns.__file__).parent
    try:
        head = subprocess.run(["git", "-C", str(where), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    return f"{where} @ {head}" if head else str(where)


def same_rows(a: Path, b: Path) -> list[str]:
    """Tables whose rows differ between two databases (empty: the writes are identical)."""
    tables = {
        "sessions": "sid", "turns": "ordinal", "log": "sid, seq, sub",
        "log_transcript": "sid, gen, n", "bench_effects": "id",
    }
    ca, cb = sqlite3.connect(a), sqlite3.connect(b)
    try:
        return [
            t for t, key in tables.items() if _rows(ca, t, key) != _rows(cb, t, key)
        ]
    finally:
        ca.close()
        cb.close()


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    steps = runs[0]["steps_run"]
    secs = statistics.median(r["seconds"] for r in runs)
    return {
        "us_per_step": secs / steps * 1e6,
        "us_per_step_all": [round(r["seconds"] / steps * 1e6, 1) for r in runs],
        "cpu_us_per_step": statistics.median(r["cpu_seconds"] for r in runs) / steps * 1e6,
        "cpu_us_per_step_all": [round(r["cpu_seconds"] / steps * 1e6, 1) for r in runs],
        "steps_per_s": steps / secs,
        "payload_json_bytes_per_step": runs[0]["json_bytes"] / steps,
        "payload_row_bytes_per_step": runs[0]["row_bytes"] / steps,
        "write_syscall_bytes_per_step": statistics.median(r["wchar"] for r in runs) / steps,
        "storage_write_bytes_per_step": statistics.median(r["write_bytes"] for r in runs) / steps,
        "peak_rss_mb": max(r["maxrss"] for r in runs) / 2**20,
        "rows": runs[0]["rows"],
        "steps": steps,
    }


def parent(args: argparse.Namespace) -> dict[str, Any]:
    kinds = ["local", "remote"] if args.tool == "both" else [args.tool]
    if args.tmpdir:
        os.makedirs(args.tmpdir, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="dt-bench-", dir=args.tmpdir))
    raw: dict[str, list[dict[str, Any]]] = {}
    identical: dict[str, list[str]] = {}
    t0 = time.perf_counter()
    for rep in range(args.repeat):
        raw.setdefault("minimal", []).append(spawn("minimal", tmp, args))
        for kind in kinds:
            for phase in (f"floor-{kind}", f"engine-{kind}"):
                raw.setdefault(phase, []).append(spawn(phase, tmp, args))
            if rep == 0:
                f, e = raw[f"floor-{kind}"][0], raw[f"engine-{kind}"][0]
                identical[kind] = same_rows(Path(f["dir"]) / f"floor-{kind}.sqlite",
                                            Path(e["dir"]) / f"engine-{kind}.sqlite")
    memory = {}
    if not args.no_tracemalloc:
        for phase in (f"floor-{kinds[0]}", f"engine-{kinds[0]}"):
            memory[phase] = spawn(phase, tmp, args, trace_memory=True)["traced_peak"] / 2**20
    history = spawn("history-engine", tmp, args)
    floor_hist = spawn("history-floor", tmp, args)
    wall = time.perf_counter() - t0
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    history.pop("dir", None)
    floor_hist.pop("dir", None)
    w = Workload(args.sessions, args.turns, args.calls)
    result: dict[str, Any] = {
        "workload": {
            "sessions": w.sessions, "turns_per_session": w.turns, "calls_per_turn": w.calls,
            "steps_per_turn": w.steps_per_turn, "steps": w.steps, "repeat": args.repeat,
            "sqlite": sqlite3.sqlite_version, "python": sys.version.split()[0],
            "journal_mode": "wal", "synchronous": "NORMAL", "engine": engine_version(),
        },
        "tools": {},
        "history": {**history, "target": TARGET_HISTORY, "floor": floor_hist},
        "minimal_floor": summarise(raw["minimal"]),
        "wall_seconds": wall,
        "loadavg": os.getloadavg(),
    }
    minimal = result["minimal_floor"]
    for kind in kinds:
        floor = summarise(raw[f"floor-{kind}"])
        engine = summarise(raw[f"engine-{kind}"])
        floor["tracemalloc_peak_mb"] = memory.get(f"floor-{kind}")
        engine["tracemalloc_peak_mb"] = memory.get(f"engine-{kind}")
        result["tools"][kind] = {
            "floor": floor, "engine": engine,
            "ratio": engine["us_per_step"] / floor["us_per_step"], "target": TARGET_RATIO,
            "cpu_ratio": engine["cpu_us_per_step"] / floor["cpu_us_per_step"],
            "minimal_ratio": engine["us_per_step"] / minimal["us_per_step"],
            "minimal_cpu_ratio": engine["cpu_us_per_step"] / minimal["cpu_us_per_step"],
            "floor_writes_identical": not identical[kind],
            "tables_differing": identical[kind],
        }
    return result


def render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 130)
    w = result["workload"]
    table = Table(title=(
        f"durable_turns steps on SqliteStore (WAL, synchronous=NORMAL) — {w['sessions']} "
        f"sessions x {w['turns_per_session']} turns x {w['steps_per_turn']} steps = "
        f"{w['steps']} steps, median of {w['repeat']}"
    ))
    table.add_column("")
    cols: list[tuple[str, dict[str, Any]]] = []
    for kind, r in result["tools"].items():
        for side in ("floor", "engine"):
            table.add_column(f"{side} ({kind} tool)", justify="right")
            cols.append((side, r[side]))

    def row(label: str, fn: Callable[[dict[str, Any]], str]) -> None:
        table.add_row(label, *(fn(c) for _, c in cols))

    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    row("µs / step", lambda c: f"{c['us_per_step']:.0f}")
    row("CPU µs / step", lambda c: f"{c['cpu_us_per_step']:.0f}")
    row("steps / s", lambda c: f"{c['steps_per_s']:,.0f}")
    row("payload bytes / step (JSON)", lambda c: f"{c['payload_json_bytes_per_step']:.0f}")
    row("payload bytes / step (rows)", lambda c: f"{c['payload_row_bytes_per_step']:.0f}")
    row("write() bytes / step", lambda c: f"{c['write_syscall_bytes_per_step']:,.0f}")
    row("storage write_bytes / step", lambda c: f"{c['storage_write_bytes_per_step']:,.0f}")
    row("peak RSS (MB)", lambda c: mb(c["peak_rss_mb"]))
    row("tracemalloc peak (MB)", lambda c: mb(c["tracemalloc_peak_mb"]))
    con.print(table)
    m = result["minimal_floor"]
    con.print(f"minimal floor (raw sqlite3, 1 transaction and 2 rows per step): "
              f"{m['us_per_step']:.0f} µs / step wall, {m['cpu_us_per_step']:.0f} CPU µs / step")
    for kind, r in result["tools"].items():
        con.print(f"{kind} tool: engine / minimal floor = [bold]{r['minimal_cpu_ratio']:.2f}x[/] "
                  f"CPU (target ≤ {TARGET_MINIMAL}x), {r['minimal_ratio']:.2f}x wall")
    for kind, r in result["tools"].items():
        ok = "ok" if r["ratio"] <= r["target"] else "MISSED"
        same = "identical rows" if r["floor_writes_identical"] else (
            f"DIFFERENT rows in {', '.join(r['tables_differing'])}")
        con.print(f"{kind} tool: engine / floor = [bold]{r['ratio']:.2f}x[/] wall "
                  f"(target ≤ {r['target']}x: {ok}), {r['cpu_ratio']:.2f}x CPU; "
                  f"floor vs engine databases: {same}")
    h = result["history"]
    ht = Table(title=(
        f"history: one session grown to {h['messages_at_start_of_long_probes']:,} messages; "
        f"{h['samples'] // w['steps_per_turn']} turns on it alternate with first turns of "
        "fresh sessions (remote tool)"
    ))
    big = f"~{h['messages_at_start_of_long_probes']:,}"
    for col in ("", "step µs at ~10 msgs (median)", f"step µs at {big} (median)", "ratio",
                f"step µs means (~10 / {big})", f"turn ms (~10 / {big})",
                "µs per turn outside its steps"):
        ht.add_column(col, justify="right" if col else "left")
    for label, x in (("engine", h), ("floor", h["floor"])):
        ht.add_row(label, f"{x['short_step_median_us']:.0f}", f"{x['long_step_median_us']:.0f}",
                   f"{x['ratio']:.2f}x",
                   f"{x['short_step_mean_us']:.0f} / {x['long_step_mean_us']:.0f}",
                   f"{x['short_turn_ms']:.2f} / {x['long_turn_ms']:.2f}",
                   f"{x['turn_overhead_us']:.0f}")
    con.print(ht)
    ok = "ok" if h["ratio"] <= h["target"] else "MISSED"
    con.print(
        f"history ratio (engine, medians) = [bold]{h['ratio']:.2f}x[/] (target ≤ "
        f"{h['target']}x: {ok}); the first turn on the long session after a restart "
        f"(transcript read once) took {h['cold_long_turn_ms']:.1f} ms"
    )
    load = ", ".join(f"{x:.1f}" for x in result["loadavg"])
    con.print(f"[dim]durable_turns from {w['engine']}; sqlite {w['sqlite']}, python "
              f"{w['python']}; wall time {result['wall_seconds']:.1f} s; load average "
              f"{load}[/]")


def profile(args: argparse.Namespace) -> None:
    """cProfile one engine run in-process; print the top functions by own and total time."""
    import cProfile
    import pstats

    tmp = Path(tempfile.mkdtemp(prefix="dt-prof-", dir=args.tmpdir))
    w = Workload(args.sessions, args.turns, args.calls, "local" if args.tool == "both"
                 else args.tool)
    prof = cProfile.Profile()
    prof.enable()
    out = run_engine(tmp / "engine.sqlite", w)
    prof.disable()
    prof.dump_stats(args.profile)
    print(f"{w.steps} steps in {out['seconds']:.2f} s (profiled); stats in {args.profile}")
    st = pstats.Stats(prof).strip_dirs()
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumulative").print_stats(40)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small run (a few seconds)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--sessions", type=int, default=None, help="sessions (default 20)")
    p.add_argument("--turns", type=int, default=None, help="turns per session (default 10)")
    p.add_argument("--calls", type=int, default=10, help="tool calls per turn (default 10)")
    p.add_argument("--history", type=int, default=None,
                   help="messages to grow the long session to (default 2000)")
    p.add_argument("--probes", type=int, default=None,
                   help="turns timed at each history length (default 10)")
    p.add_argument("--repeat", type=int, default=None, help="runs per phase (default 5)")
    p.add_argument("--tool", choices=("local", "remote", "both"), default="both")
    p.add_argument("--no-fence", action="store_true",
                   help="the floor skips the per-step fencing read (SELECT epoch)")
    p.add_argument("--no-tracemalloc", action="store_true",
                   help="skip the extra runs that measure the traced Python heap")
    p.add_argument("--tmpdir", default=None, help="where the databases go (default: $TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the databases")
    p.add_argument("--profile", metavar="PATH", help="cProfile one engine run instead")
    p.add_argument("--phase", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--trace-memory", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    quick = args.quick
    for name, full, small in (("sessions", 20, 4), ("turns", 10, 3), ("history", 2000, 400),
                              ("probes", 10, 3), ("repeat", 5, 1)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    if args.phase:
        child(args)
    elif args.profile:
        profile(args)
    else:
        result = parent(args)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            render(result)


if __name__ == "__main__":
    # The children inherit it: the same string hashing in every run, one less source of noise.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
