"""What the store shows after the demo, and the checks that prove nothing ran twice.

Everything here is read back from the SQLite file and the outbox — never from what a process
remembers — through the public session API (transcript, status) plus the demo's own tables.
Step ids are derived from the transcript exactly as the engine assigns them (SPEC F1):
``model:<n>`` for the assistant message at index ``n``, ``tool:<n>:<call_id>`` for the tool
message answering a call of that assistant message.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from ..messages import Message
from ..records import ModelStepId, ToolStepId
from ..runtime import Runtime
from ..stores.sqlite import SqliteStore
from .ops import AGENT_NAME, OrderRow, build_agent, outbox_path, read_orders, read_outbox
from .term import call_text, compact, heading, table


@dataclass(frozen=True, slots=True)
class StoreState:
    """The turn as the store has it at one moment."""

    session_status: str
    turn_status: str | None
    turn_text: str | None
    messages: list[tuple[int, Message]]
    """The turn's messages with their transcript indexes."""
    orders: list[OrderRow]
    outbox: list[dict[str, Any]]

    def step_ids(self) -> list[str]:
        """The step ids recorded for this turn, in order (the opening is not a step)."""
        return [s for i, m in self.messages if (s := step_id(i, m, self.messages))]


def step_id(index: int, m: Message, messages: list[tuple[int, Message]]) -> str:
    """The id of the step that committed message ``m`` ('' for the opening)."""
    if m.role == "assistant":
        return str(ModelStepId(index))
    if m.role == "tool":
        for i, a in messages:
            if a.role == "assistant" and any(c.id == m.call_id for c in a.tool_calls):
                return str(ToolStepId(i, m.call_id or ""))
        return f"tool:?:{m.call_id}"
    return ""


async def read_state(db: Path, session_id: str, turn_id: str) -> StoreState:
    """Open the store, read the turn's state, close it again."""
    store = SqliteStore(db)
    async with Runtime([build_agent(db)], store) as runtime:
        session = runtime.session(AGENT_NAME, session_id)
        transcript = await session.transcript()
        status = await session.status()
        rec = next(iter(await store.entries(session.key, turn_id=turn_id)), None)
        orders = read_orders(store.unwrap(), turn_id)
    return StoreState(
        session_status=status,
        turn_status=rec.status.value if rec else None,
        turn_text=rec.text if rec else None,
        messages=[(i, m) for i, m in enumerate(transcript) if m.turn_id == turn_id],
        orders=orders,
        outbox=read_outbox(outbox_path(db), turn_id),
    )


@dataclass(slots=True)
class Verdict:
    """The checks, each a line that is either true or not."""

    checks: list[tuple[bool, str]] = field(default_factory=list)

    def check(self, ok: bool, text: str) -> None:
        self.checks.append((ok, text))

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.checks)


def judge(final: StoreState, at_kill: StoreState, killed: bool) -> Verdict:
    """Check the final state against what the kill left (``at_kill``)."""
    v = Verdict()
    k = {i for i, _ in at_kill.messages}
    v.check(killed and at_kill.turn_status == "running",
            f"delivery 1 died by SIGKILL mid-turn (the store had the turn "
            f"{at_kill.turn_status!r}, {len(at_kill.step_ids())} steps recorded)")
    v.check(final.turn_status == "completed",
            f"the redelivery finished the turn ({final.turn_status}): {final.turn_text!r}")

    openings = [m for _, m in final.messages if m.is_opening]
    v.check(len(openings) == 1,
            f"one opening message for the turn ({len(openings)} found; never appended twice)")

    calls = {c.id: (i, c) for i, m in final.messages for c in m.tool_calls}
    answers = Counter(m.call_id for _, m in final.messages if m.role == "tool")
    bad = {cid: n for cid, n in answers.items() if cid not in calls or n != 1}
    missing = [cid for cid in calls if cid not in answers]
    v.check(not bad and not missing,
            f"each of the {len(calls)} calls has exactly one tool message"
            + (f" (wrong: {bad}, unanswered: {missing})" if bad or missing else ""))
    steps = final.step_ids()
    v.check(len(steps) == len(set(steps)), f"each of the {len(steps)} steps is recorded once")

    # Orders: one row per successful create_order, written by the delivery that recorded it.
    answered_at = {m.call_id: i for i, m in final.messages if m.role == "tool"}
    results = {m.call_id: m.result for _, m in final.messages if m.role == "tool"}
    order_calls = [cid for cid, (_, c) in calls.items()
                   if c.name == "create_order" and _order_id(results.get(cid)) is not None]
    rows = Counter(o.call_id for o in final.orders)
    wrong_rows = {cid: n for cid, n in rows.items() if cid not in order_calls or n != 1}
    wrong_rows.update({cid: 0 for cid in order_calls if cid not in rows})
    v.check(not wrong_rows,
            f"each of the {len(order_calls)} orders is written exactly once"
            + (f" (rows per call: {wrong_rows})" if wrong_rows else ""))
    by_delivery = Counter(o.delivery for o in final.orders)
    misplaced = [
        o.call_id for o in final.orders
        if o.delivery != (1 if answered_at.get(o.call_id) in k else 2)
        or _order_id(results.get(o.call_id)) != o.order_id
    ]
    v.check(not misplaced,
            f"recorded steps were replayed, not re-run: {by_delivery[1]} order(s) written by "
            f"delivery 1, {by_delivery[2]} by delivery 2, each matching its recorded result"
            + (f" (mismatched: {misplaced})" if misplaced else ""))

    # notify: remote, at-least-once; per delivery at most once under its idempotency key.
    for cid, (_, c) in calls.items():
        if c.name != "notify":
            continue
        entries = [e for e in final.outbox if e.get("call_id") == cid]
        keys = {e["key"] for e in entries}
        per_delivery = Counter(e["delivery"] for e in entries)
        once_each = bool(entries) and len(keys) == 1 and max(per_delivery.values()) == 1
        if len(entries) == 1:
            text = f"notify posted once (idempotency key {entries[0]['key'][:12]}…)"
        else:
            text = (f"notify posted {len(entries)} times under one idempotency key, at most "
                    "once per delivery: at-least-once, as a remote tool promises; the receiver "
                    "drops the repeat by its key")
        v.check(once_each, text)
    return v


def render(console: Console, final: StoreState, at_kill: StoreState, verdict: Verdict) -> None:
    """Print the steps, the transcript, the orders, the outbox and the verdict."""
    before = {i for i, _ in at_kill.messages}
    replayed = [step_id(i, m, final.messages) for i, m in final.messages
                if i in before and not m.is_opening]
    ran = [step_id(i, m, final.messages) for i, m in final.messages if i not in before]
    console.print()
    console.print(Text.assemble(
        ("Delivery 2 ", "bold"),
        f"replayed {len(replayed)} recorded step(s) from the store without running them "
        f"({', '.join(replayed) or 'none'}) and ran {len(ran)} now ({', '.join(ran)}).",
    ))

    heading(console, "Transcript (the message log), and what delivery 2 did with each step")
    t = table(console, "#", "role", "step", "delivery 2", "text / call / result")
    for i, m in final.messages:
        if m.is_opening:
            origin = "kept, not appended again" if i in before else "appended"
        elif i in before:
            origin = "replayed from store"
        elif m.role == "tool" and any(e["call_id"] == m.call_id and e["delivery"] == 1
                                      for e in final.outbox):
            origin = "ran again (unrecorded)"
        else:
            origin = "ran now"
        t.add_row(str(i), m.role, step_id(i, m, final.messages),
                  Text(origin, style="dim" if i in before else "bold green"), _content(m))
    console.print(t)

    heading(console, "orders table (create_order's rows, committed with their steps)")
    t = table(console, "order_id", "call", "qty", "written by", "item")
    for o in final.orders:
        t.add_row(str(o.order_id), o.call_id, str(o.quantity),
                  f"delivery {o.delivery} (pid {o.pid})", o.item)
    console.print(t)

    heading(console, "outbox (notify's posts, one line per attempt)")
    t = table(console, "idempotency key", "call", "channel", "posted by", "text")
    for e in final.outbox:
        t.add_row(e["key"][:16] + "…", e["call_id"], e["channel"],
                  f"delivery {e['delivery']} (pid {e['pid']})", e["text"])
    console.print(t)
    console.print()

    for ok, text in verdict.checks:
        console.print(Text(f"  {'✓' if ok else '✗'} {text}", style="green" if ok else "red"))
    console.print()
    if verdict.ok and any(e["delivery"] == 1 for e in final.outbox if not _recorded(e, before,
                                                                                 final)):
        console.print(Text("VERDICT: PASS — killed mid-turn and delivered again: no recorded "
                           "step ran again; the one unrecorded remote call was repeated under "
                           "its idempotency key, as at-least-once allows", style="bold green"))
    elif verdict.ok:
        console.print(Text("VERDICT: PASS — killed mid-turn and delivered again: nothing ran "
                           "twice", style="bold green"))
    else:
        failed = sum(1 for ok, _ in verdict.checks if not ok)
        console.print(Text(f"VERDICT: FAIL — {failed} check(s) failed (see ✗ above)",
                           style="bold red"))


def _recorded(entry: dict[str, Any], before: set[int], state: StoreState) -> bool:
    """Whether the outbox entry's step was recorded before the kill."""
    return any(m.role == "tool" and m.call_id == entry["call_id"] and i in before
               for i, m in state.messages)


def _order_id(result: Any) -> Any:
    return result.get("order_id") if isinstance(result, dict) else None


def _content(m: Message) -> str:
    if m.role == "tool":
        return f"→ {compact(m.result, 60)}" + (" (error)" if m.is_error else "")
    parts = [m.text] if m.text else []
    parts += [f"→ {call_text(c.name, c.input, 70)}" for c in m.tool_calls]
    return "  ".join(parts)


__all__ = ["StoreState", "Verdict", "judge", "read_state", "render", "step_id"]
