"""Long sessions (F23): tokens sent per turn with and without compaction, and what the
compaction itself costs.

Usage (from the repository root, with the package installed)::

    python bench/compaction.py              # 1,000 turns each way (about a minute)
    python bench/compaction.py --turns 200  # a shorter session
    python bench/compaction.py --store sqlite
    python bench/compaction.py --json

One session of ``--turns`` turns; in each the model asks for one document (a tool result of
about 500 tokens), then answers: two model calls a turn. The same session runs twice, on a
fresh store each: with no ``Agent(context=…)`` (every request sends the whole transcript) and
with ``Compaction(trigger_tokens=--trigger, keep_recent=8)``. The model is a fake that
measures what it is sent (each message's stored JSON, its length over four: the providers'
own tokenizers differ by 10 to 30 % but grow the same way) and reports that as its
``input_tokens``, as a provider does;
the summary model is another fake, answering a summary of about 200 tokens.

It prints the tokens sent in each of the turns 10, 100 and 1,000 (both model calls), the
total over the session, and for the compacted run the compaction's own cost: compaction
steps (clearing only, or summarising), summary calls and the tokens they were sent, and the
median wall time of a turn with a compaction step beside one without. Only the public API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from durable_turns import (
    Agent,
    Compaction,
    MemoryStore,
    Runtime,
    SqliteStore,
    Stop,
    TextDelta,
    ToolCall,
    tool,
)
from durable_turns.messages import Message, encode_message
from durable_turns.model import ModelEvent, ModelRequest
from durable_turns.stores import SessionStore

MARKS = (10, 100, 1000)


@tool
async def fetch(n: int) -> str:
    """A document of about 500 tokens."""
    return f"document {n}: " + "lorem ipsum dolor sit amet " * 74


class Sizes:
    """Each message's size in tokens (JSON length over four), measured once per object."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Message, int]] = {}

    def __call__(self, request: ModelRequest) -> int:
        total = len(request.system)
        for m in request.messages:
            got = self._seen.get(id(m))
            if got is None or got[0] is not m:
                got = (m, len(encode_message(m)))
                self._seen[id(m)] = got
            total += got[1]
        return total // 4


class Reader:
    """Asks for a document when the last message is the user's, else answers."""

    def __init__(self) -> None:
        self.size = Sizes()
        self.sent: list[int] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        size = self.size(request)
        self.sent.append(size)
        if request.messages[-1].role == "user":
            yield ToolCall(f"c{len(self.sent)}", "fetch", {"n": len(self.sent)})
            yield Stop("tool_use", {"input_tokens": size, "output_tokens": 20})
        else:
            yield TextDelta("Read it; nothing new.")
            yield Stop("end_turn", {"input_tokens": size, "output_tokens": 8})


class Summariser:
    def __init__(self) -> None:
        self.size = Sizes()
        self.sent: list[int] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.sent.append(self.size(request))
        yield TextDelta("The user asked for documents one by one; each was read. " * 14)
        yield Stop("end_turn", {"input_tokens": self.sent[-1], "output_tokens": 200})


async def run(turns: int, trigger: int | None, store: SessionStore) -> dict[str, Any]:
    model, summariser = Reader(), Summariser()
    context = None if trigger is None else Compaction(trigger_tokens=trigger, keep_recent=8,
                                                      model=summariser)
    agent = Agent("reader", "You read documents for the user.", [fetch], context=context)
    times: list[tuple[float, bool]] = []
    async with Runtime([agent], store, model) as rt:
        s = rt.session("reader", "long")
        compacted = 0
        for i in range(turns):
            t0 = time.perf_counter()
            done = await s.turn(f"Please read document {i}.")
            took = time.perf_counter() - t0
            assert done.status == "completed", done.error
            events = await s.events(turn_id=done.turn_id)
            here = sum(1 for e in events if e.type == "context.compacted")
            compacted += here
            times.append((took, here > 0))
        events = [e.to_dict() for e in await s.events() if e.type == "context.compacted"]
    per_turn = [model.sent[2 * i] + model.sent[2 * i + 1] for i in range(turns)]
    out: dict[str, Any] = {
        "turns": turns, "trigger_tokens": trigger,
        "per_turn": {str(k): per_turn[k - 1] for k in MARKS if k <= turns},
        "total": sum(per_turn), "largest_request": max(model.sent),
    }
    out["turn_ms"] = round(statistics.median(t for t, _ in times) * 1000, 2)
    if trigger is not None:
        with_step = [t for t, c in times if c]
        without = [t for t, c in times if not c]
        out["compaction"] = {
            "steps": len(events),
            "summarising": sum(1 for e in events if e["summarised"]),
            "summary_calls": len(summariser.sent),
            "summary_input_tokens": sum(summariser.sent),
            "summary_input_tokens_each": round(statistics.median(summariser.sent))
            if summariser.sent else 0,
            "turn_ms_with_a_compaction": round(statistics.median(with_step) * 1000, 2)
            if with_step else None,
            "turn_ms_without": round(statistics.median(without) * 1000, 2)
            if without else None,
        }
    return out


def fresh(kind: str, folder: Path, name: str) -> SessionStore:
    return SqliteStore(str(folder / f"{name}.db")) if kind == "sqlite" else MemoryStore()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--turns", type=int, default=1000)
    p.add_argument("--trigger", type=int, default=20_000)
    p.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = await run(a.turns, None, fresh(a.store, Path(tmp), "plain"))
        compacted = await run(a.turns, a.trigger, fresh(a.store, Path(tmp), "compacted"))
    if a.json:
        print(json.dumps({"store": a.store, "without": plain, "with": compacted}, indent=2))
        return
    print(f"{a.turns} turns on {a.store}; tokens sent per turn (two model calls):")
    print(f"{'turn':>6} {'without':>10} {'with':>10}")
    for k, v in plain["per_turn"].items():
        print(f"{k:>6} {v:>10,} {compacted['per_turn'][k]:>10,}")
    print(f"{'total':>6} {plain['total']:>10,} {compacted['total']:>10,}")
    print(f"largest request: {plain['largest_request']:,} without, "
          f"{compacted['largest_request']:,} with (trigger {a.trigger:,})")
    c = compacted["compaction"]
    print(f"compaction steps: {c['steps']} ({c['summarising']} summarising); summary calls: "
          f"{c['summary_calls']}, sent {c['summary_input_tokens']:,} tokens "
          f"({c['summary_input_tokens_each']:,} each, median)")
    print(f"median turn: {plain['turn_ms']} ms without compaction; with it, "
          f"{c['turn_ms_with_a_compaction']} ms for a turn with a compaction step, "
          f"{c['turn_ms_without']} ms for one without")


if __name__ == "__main__":
    asyncio.run(main())
