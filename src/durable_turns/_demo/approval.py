"""``durable-turns demo refund | approve | pending``: an approval that outlives its process
(F6).

- ``refund``: this process starts the ops agent's turn "Refund $30 on order 42." as an
  attested CLI user; ``issue_refund`` parks it on ``approve-refund``; the command prints the
  request and exits. Nothing waits in memory anywhere: the park is a row in the SQLite file.
- ``approve``: another process (minutes or days later) finds the parked turn in the file,
  resumes it with the answer as ``--by``, streams the rest of the turn — the tool runs again
  from the top, ``request_input`` returns the answer, the refund is paid or not — and prints
  the result and the ``refunds`` table.
- ``pending``: the sessions parked in the file, and what each one waits for.

The CLI stands in for a channel that verifies who is typing (as Slack signs its requests):
it attests ``--user`` / ``--by``, by default the operating-system user.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from .._hitl import who_may_answer
from ..errors import ResumeAuthorizationError, ResumeConflictError, SessionBusyError
from ..inbound import InboundEvent
from ..records import InputRequest, SessionKey, TurnResult
from ..runtime import Runtime
from ..stores.sqlite import SqliteStore
from .child import LEASE_TIMEOUT, EventPrinter
from .choice import OFFLINE, ModelChoice, build_model
from .ops import AGENT_NAME, build_agent
from .refunds import APPROVAL_ID, RefundRow, money, read_refunds
from .runner import DemoInputError, prepare_db
from .term import compact, heading, table

SOURCE = "cli"
"""The inbound event's ``source`` for turns the CLI starts."""


@dataclass(frozen=True, slots=True)
class RefundOptions:
    """``durable-turns refund``'s options."""

    db: Path
    order_id: str
    amount: float
    user: str
    """Who asks (attested); the default answerer when there is no ``approver``."""
    approver: str | None = None
    """Who must approve instead of ``user`` (four eyes)."""
    session: str | None = None
    model: ModelChoice = OFFLINE


@dataclass(frozen=True, slots=True)
class ApproveOptions:
    """``durable-turns approve``'s options."""

    db: Path
    turn_id: str
    input_id: str = APPROVAL_ID
    approve: bool = True
    """The answer: ``True`` approves, ``False`` (``--deny``) denies."""
    by: str = ""
    """Who answers (attested)."""
    session: str | None = None
    """Only needed when two sessions have a turn with this id."""
    model: ModelChoice = OFFLINE


def refund_request(order_id: str, amount: float) -> str:
    """What the CLI "says" to the agent."""
    return f"Refund {money(amount)} on order {order_id}."


def _timeout(model: ModelChoice) -> float:
    return 30.0 if model.scripted else 300.0


def _kv(console: Console, rows: list[tuple[str, str]]) -> None:
    for name, value in rows:
        console.print(Text.assemble((f"  {name:<9} ", "bold"), value))


# -- refund ------------------------------------------------------------------------------------


async def run_refund(opts: RefundOptions, console: Console) -> int:
    """Start the refund turn and return once it parked (0), completed (0) or failed (1).

    Raises:
        DemoInputError: an unusable ``--db``, or ``--session`` is parked on another turn.
        ConfigurationError: the model cannot be built.
    """
    db = opts.db.expanduser().absolute()
    await prepare_db(db)
    session_id = opts.session or f"refund-{uuid.uuid4().hex[:8]}"
    turn_id = f"turn-{uuid.uuid4().hex[:12]}"
    text = refund_request(opts.order_id, opts.amount)
    event = InboundEvent(SOURCE, {"id": opts.user, "attested": True}, text,
                         meta={"approver": opts.approver} if opts.approver else None)
    store = SqliteStore(db)
    async with Runtime([build_agent(db)], store, build_model(opts.model),
                       lease_timeout=LEASE_TIMEOUT) as runtime:
        session = runtime.session(AGENT_NAME, session_id)
        printer = EventPrinter(console, await session.transcript())
        session.observe(printer, turn_id=turn_id)
        try:
            await session.start(event=event, turn_id=turn_id)
        except SessionBusyError as e:
            raise DemoInputError(f"{e} (see: durable-turns demo pending --db {db})") from None
        # Nothing awaited since start() returned: the turn's first event prints after this.
        console.print(Text("durable-turns demo refund: a refund that waits for a person's "
                           "approval", style="bold"))
        _kv(console, [
            ("store", f"{db} (SqliteStore, WAL)"),
            ("model", opts.model.label),
            ("session", f"{AGENT_NAME}/{session_id}, turn {turn_id}"),
            ("asked by", f"{opts.user} (attested by the CLI)"),
            ("approver", f"{opts.approver} (--approver)" if opts.approver else
                         f"{opts.user}: nobody else is named, so the attested speaker answers"),
            ("request", text),
        ])
        console.print(Text(f"pid {os.getpid()} started the turn (durable before start() "
                           "returned)", style="bold"))
        result = await asyncio.wait_for(session.result(turn_id), _timeout(opts.model))
        printer.end_line()
    return _report_refund(console, db, session_id, result)


def _report_refund(console: Console, db: Path, session_id: str, result: TurnResult) -> int:
    console.print()
    if result.status == "suspended" and result.request is not None:
        req: InputRequest = result.request
        who = (req.answerers or {}).get("user")
        console.print(Text(f"The turn is parked. pid {os.getpid()} now exits: the request "
                           "lives only in the store, and any process can answer it.",
                           style="bold yellow"))
        _kv(console, [
            ("session", f"{AGENT_NAME}/{session_id}"),
            ("turn", req.turn_id),
            ("input", req.id),
            ("prompt", req.prompt),
            ("answerer", f"user {who}" if who else compact(req.answerers)),
        ])
        console.print()
        approve = (f"durable-turns demo approve --db {db} --turn {req.turn_id} --input {req.id}"
                   + (f" --by {who}" if who else ""))
        console.print("Approve it (from another shell, now or later):")
        console.print(f"  {approve}", markup=False, highlight=False)
        console.print("or deny it:")
        console.print(f"  {approve} --deny", markup=False, highlight=False)
        return 0
    if result.status == "completed":
        console.print(Text(f"The turn completed without asking for approval: {result.text}",
                           style="bold"))
        return 0
    console.print(Text(f"The turn ended {result.status}: {result.error or result.reason}",
                       style="bold red"))
    return 1


# -- approve -----------------------------------------------------------------------------------


async def run_approve(opts: ApproveOptions, console: Console) -> int:
    """Answer the parked turn, drive it to its end; 0 when it completed, 1 when not.

    Raises:
        DemoInputError: an unusable ``--db``; no such turn; the turn is not parked on that
            input (``ResumeConflictError``); ``--by`` may not answer it
            (``ResumeAuthorizationError``). Nothing was stored.
        ConfigurationError: the model cannot be built.
    """
    db = opts.db.expanduser().absolute()
    await prepare_db(db, create=False)
    store = SqliteStore(db)
    async with Runtime([build_agent(db)], store, build_model(opts.model),
                       lease_timeout=LEASE_TIMEOUT) as runtime:
        key = await _session_of(store, db, opts.turn_id, opts.session)
        session = runtime.session(AGENT_NAME, key.session)
        printer = EventPrinter(console, await session.transcript())
        session.observe(printer, turn_id=opts.turn_id)
        waiting = await session.pending()
        fresh = waiting is not None and waiting.turn_id == opts.turn_id
        try:
            await session.resume(opts.turn_id, opts.input_id, opts.approve, by=opts.by)
        except ResumeAuthorizationError as e:
            raise DemoInputError(f"ResumeAuthorizationError: {e}") from None
        except ResumeConflictError as e:
            rec = next(iter(await store.entries(key, turn_id=opts.turn_id)), None)
            why = (f"; turn {opts.turn_id!r} already {rec.status}"
                   if rec is not None and rec.status.final else "")
            raise DemoInputError(f"ResumeConflictError: {e}{why}") from None
        # Nothing awaited since resume() returned, so the replay's first event cannot print
        # before this header: the observer that prints it has not run yet.
        answer = "yes (approve)" if opts.approve else "no (--deny)"
        console.print(Text("durable-turns demo approve: answer a parked turn from another "
                           "process", style="bold"))
        _kv(console, [
            ("store", str(db)),
            ("model", opts.model.label),
            ("session", f"{key}, turn {opts.turn_id}"),
            ("answer", f"{opts.input_id} = {answer}, by {opts.by} "
                       + ("(stored)" if fresh else "(given already: the same answer)")),
        ])
        console.print(Text(
            f"pid {os.getpid()} replays the turn: the parked tool runs again from the top, "
            "and request_input returns the answer" if fresh else
            "The turn had this answer already: it is one answer, and nothing runs again.",
            style="bold"))
        result = await asyncio.wait_for(session.result(opts.turn_id), _timeout(opts.model))
        printer.end_line()
        refunds = read_refunds(store.unwrap())
    console.print()
    if result.status == "completed":
        console.print(Text(f"  answer: {result.text}", style="bold"))
    elif result.status == "suspended" and result.request is not None:
        console.print(Text(f"  parked again, on {result.request.id!r}: "
                           f"{result.request.prompt}", style="bold yellow"))
    else:
        console.print(Text(f"  the turn ended {result.status}: "
                           f"{result.error or result.reason}", style="bold red"))
    _render_refunds(console, refunds)
    return 0 if result.status in ("completed", "suspended") else 1


async def _session_of(store: SqliteStore, db: Path, turn_id: str,
                      session: str | None) -> SessionKey:
    keys = [k for k in await store.find_sessions(turn_id=turn_id)
            if session is None or k.session == session]
    where = f" of session {session!r}" if session else ""
    if not keys:
        raise DemoInputError(
            f"no turn {turn_id!r}{where} in {db} (durable-turns demo pending --db {db} lists "
            "the turns waiting for input)"
        )
    if len(keys) > 1:
        raise DemoInputError(
            f"turn {turn_id!r} exists in {len(keys)} sessions "
            f"({', '.join(map(str, keys))}); name one with --session"
        )
    if keys[0].agent != AGENT_NAME:
        raise DemoInputError(
            f"turn {turn_id!r} belongs to agent {keys[0].agent!r}, not the demo's: answer it "
            f"with its app, durable-turns approve APP_DIR --db {db} --turn {turn_id}"
        )
    return keys[0]


def _render_refunds(console: Console, refunds: list[RefundRow]) -> None:
    heading(console, f"refunds table ({len(refunds)} row(s); issue_refund writes one only "
                     "after an approval, keyed by its idempotency key)")
    t = table(console, "refund_id", "order", "amount", "attempts", "paid by",
              "idempotency key", "turn")
    for r in refunds:
        pid = f"pid {r.pid}" + (" (this process)" if r.pid == os.getpid() else "")
        t.add_row(str(r.refund_id), r.order_id, money(r.amount), str(r.attempts), pid,
                  r.key[:12] + "…", r.turn_id)
    console.print(t)


# -- pending -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Parked:
    """One session waiting for input."""

    key: SessionKey
    request: InputRequest
    asked_by: str | None


async def find_parked(db: Path) -> list[Parked]:
    """Every session of the SQLite file that is parked, with its request."""
    store = SqliteStore(db)
    await store.open()
    try:
        found = []
        for key in await store.find_sessions("parked"):
            for t in await store.entries(key, unfinished=True):
                if t.status == "suspended" and t.request:
                    user: Any = (t.event or {}).get("user") or {}
                    found.append(Parked(key, t.request,
                                        user.get("id")))
        return found
    finally:
        await store.close()


async def run_pending(db: Path, console: Console) -> int:
    """List the parked sessions of ``db``; 0 (also when there are none).

    Raises:
        DemoInputError: an unusable ``--db``.
    """
    db = db.expanduser().absolute()
    await prepare_db(db, create=False)
    parked = await find_parked(db)
    if not parked:
        console.print(f"nothing in {db} is waiting for input")
        return 0
    heading(console, f"{len(parked)} session(s) in {db} waiting for input")
    t = table(console, "session", "turn", "input", "asked by", "who may answer", "prompt")
    for p in parked:
        t.add_row(str(p.key), p.request.turn_id, p.request.id, p.asked_by or "-",
                  who_may_answer(p.request.answerers), p.request.prompt)
    console.print(t)
    console.print()
    console.print("Answer one with:")
    for p in parked:
        who = (p.request.answerers or {}).get("user")
        cmd = (f"durable-turns demo approve --db {db} --turn {p.request.turn_id} "
               f"--input {p.request.id}" + (f" --by {who}" if who else "") + "  [--deny]")
        if p.key.agent != AGENT_NAME:
            cmd = (f"(agent {p.key.agent!r} is not the demo's: answer it with its own app, "
                   f"durable-turns approve APP_DIR --db {db} --turn {p.request.turn_id})")
        console.print(f"  {cmd}", markup=False, highlight=False)
    return 0


__all__ = [
    "SOURCE",
    "ApproveOptions",
    "Parked",
    "RefundOptions",
    "find_parked",
    "refund_request",
    "run_approve",
    "run_pending",
    "run_refund",
]
