"""``durable-turns demo``: a small ops agent whose turn is SIGKILLed mid-way and delivered again.

Offline and deterministic: a SQLite file, a scripted model, two child processes.

- ``ops``: the agent — ``create_order`` (local: its row commits with its step, exactly once),
  ``notify`` (remote: at least once, keyed by ``ctx.idempotency_key``), ``list_orders``;
- ``brain``: the scripted model, which reads its position off the transcript;
- ``worker``: one delivery of the turn in a child process, streaming its events;
- ``runner``: the parent — delivers, kills, delivers again;
- ``report``: reads the store back and proves nothing ran twice;
- ``term``: the rich console, plain when stdout is not a terminal.

Like every adapter, the demo depends on the engine and never the reverse; only ``cli`` runs
its coroutines.
"""

from __future__ import annotations

from .runner import DemoFailure, DemoInputError, DemoOptions, run_demo
from .worker import KILL_POINTS, WorkerOptions, run_worker

__all__ = [
    "KILL_POINTS",
    "DemoFailure",
    "DemoInputError",
    "DemoOptions",
    "WorkerOptions",
    "run_demo",
    "run_worker",
]
