"""The CLI's demos: a small ops agent on a SQLite file.

``durable-turns demo``: the agent's turn is SIGKILLed mid-way and delivered again, two child
processes, then the store proves nothing ran twice. ``durable-turns refund | approve |
pending``: a refund parks for a person's approval in one process and is answered from another.
Offline and deterministic by default (a scripted model); Anthropic when ``ANTHROPIC_API_KEY``
is set, or any provider with ``--model``.

- ``ops``: the agent — ``create_order`` (local: its row commits with its step, exactly once),
  ``notify`` (remote: at least once, keyed by ``ctx.idempotency_key``), ``list_orders``,
  ``issue_refund`` (``refunds``: parks for approval, pays only after the answer);
- ``brain``: the scripted model, which reads its position off the transcript;
- ``choice``: which model the processes run on, and why;
- ``_child``: one delivery of the turn in a child process, streaming its events;
- ``runner``: the parent — delivers, kills, delivers again;
- ``report``: reads the store back and proves nothing ran twice;
- ``reach``: tells a model that could not be reached from one that misbehaved;
- ``approval``: ``refund``, ``approve`` and ``pending``;
- ``term``: the rich console, plain when stdout is not a terminal.

Like every adapter, the demo depends on the engine and never the reverse; only ``cli`` runs
its coroutines.
"""

from __future__ import annotations

from .child import KILL_POINTS, ChildOptions, run_child
from .runner import DemoFailure, DemoInputError, DemoOptions, run_demo

__all__ = [
    "KILL_POINTS",
    "ChildOptions",
    "DemoFailure",
    "DemoInputError",
    "DemoOptions",
    "run_child",
    "run_demo",
]
