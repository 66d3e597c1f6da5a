"""Run on Temporal: the same agents, store and hosts, with turns driven by Temporal workers.

*Temporal schedules, the store records.* Each session is a Temporal workflow
(:func:`workflow_id`); each step of its chain — a model call, a tool call, a command — is an
activity that runs the engine's own step against the store and commits it fenced by the
session lease's epoch. Accepting a turn stores it, then signals-with-start the session's
workflow (:class:`TemporalScheduler`, a runtime's scheduler). Local tools keep their
exactly-once (they run inside the step's transaction), parks live in the store and wait on a
signal, cancel/replace/reset are the store's commands, and events stay in the store for any
client to resume by cursor. README: "Running on Temporal".

Needs the ``temporal`` extra: ``pip install 'durable-turns[temporal]'``.
"""

from __future__ import annotations

try:
    import temporalio  # noqa: F401
except ImportError as e:  # pragma: no cover - the extra is part of the dev install
    raise ImportError(
        "durable_turns.temporal needs the Temporal SDK: pip install 'durable-turns[temporal]'"
    ) from e

from ._client import TASK_QUEUE, Connection, TemporalScheduler, connect
from ._worker import StepActivity, WorkerSettings, step_options, temporal_worker
from ._workflow import SessionWorkflow, workflow_id

__all__ = [
    "TASK_QUEUE",
    "Connection",
    "SessionWorkflow",
    "StepActivity",
    "TemporalScheduler",
    "WorkerSettings",
    "connect",
    "step_options",
    "temporal_worker",
    "workflow_id",
]
