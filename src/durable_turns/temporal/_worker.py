"""The worker side: a Temporal worker whose activity runs a session's next step.

:func:`temporal_worker` builds a ``temporalio`` worker for a :class:`~durable_turns.Runtime`
(made with a :class:`~durable_turns.temporal.TemporalScheduler`, so the subagents its tools
start wake their own workflows). It runs the session workflow and one activity,
``durable_turns.step``: ``Runtime.step`` against the runtime's store — the lease claimed,
the step run and committed fenced by the lease's epoch, the lease released — heartbeating to
Temporal while it runs. Its outcome tells the workflow how to schedule the next step: a
tool's ``timeout`` becomes the activity's ``start_to_close``, a tool's ``retries`` and
``retry_delay`` (the agent's ``model_retries`` and ``model_retry_delay`` for a model call)
become the activity's retry policy, and the summary in Temporal's UI names them.

Retries are Temporal's: the activity passes its attempt number to ``Runtime.step``, which
runs that one attempt of the model call or tool; a failure its policy retries raises
``RetryStep`` (nothing written), which the activity raises as a retryable
``ApplicationError`` whose next retry delay is the attempt's backoff (with jitter, or the
provider's ``retry-after``). The attempt past the last commits the error as it would
without Temporal. In a parallel batch, the calls that succeed commit, and only the failed
ones run again.

Why a regular activity and not a local one: a local activity re-runs with its whole workflow
task when a worker dies, and its heartbeat-free timeout cannot tell a slow model from a dead
worker; a regular activity is seen in the UI, heartbeats, and re-runs alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from ..agent import Agent
from ..engine._driver import ChainState
from ..engine._model_step import BACKOFF_CAP
from ..errors import RetryStep
from ..records import SessionKey
from ..runtime import Runtime
from ..scheduling import StoreWakeups
from ..tools import RETRY_BACKOFF_CAP
from ._client import TASK_QUEUE
from ._workflow import (
    ACTIVITY,
    BACKOFF,
    FIRE,
    PLAN,
    SessionWorkflow,
    StepInput,
    StepOptions,
    StepOutcome,
)

MARGIN = 30.0
"""Seconds added to a tool step's computed limit: its commit, and a slow store."""


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a worker takes and runs steps (every one a ``temporal-worker`` option)."""

    task_queue: str = TASK_QUEUE
    """The queue the sessions' workflows and steps run on (the scheduler's)."""
    max_steps: int = 100
    """Steps this worker runs at once (``max_concurrent_activities``). A subagent's step
    waits on its child's steps: give it room for both."""
    heartbeat: float = 2.0
    """Seconds without a heartbeat before Temporal runs a step again elsewhere (measured: a
    dead worker's turn goes on 2.5 to 3 times this after its death, ``bench/temporal.py``)."""
    sticky_timeout: float = 1.0
    """Seconds a workflow task waits for this worker's sticky queue before any worker takes
    it (Temporal's default is 10: a dead worker's sessions would wait that long)."""
    lease_timeout: float = 30.0
    """Seconds a step waits for the session's lease (a lost worker's lease expires after
    the store's ``lease_ttl``)."""
    step_timeout: float = 86400.0
    """The limit of a step with no limit of its own (a model call, a tool without
    ``timeout``); heartbeats, not this, notice a dead worker."""


def step_options(agent: Agent, state: ChainState, settings: WorkerSettings) -> StepOptions:
    """How the workflow should schedule the step ``state`` names.

    A model step's retry policy is the agent's ``model_retries`` and ``model_retry_delay``.
    A tool step's limit is what one attempt of its tools may take (their ``timeout``s, plus
    :data:`MARGIN`), and its retry policy that of its tools with ``retries``: the most
    attempts and the longest first delay of them (each call keeps its own count and backoff:
    the worker decides). The summary names the tools and their limits, so Temporal's UI
    shows them.

    Args:
        agent: the session's agent.
        state: what the last step left.
        settings: the worker's settings.

    Returns:
        The next activity's options.
    """
    base = StepOptions(timeout=settings.step_timeout, heartbeat=settings.heartbeat)
    if state.next == "model":
        base.summary = f"model (retries {agent.model_retries})"
        return _retried(base, agent.model_retries, agent.model_retry_delay, BACKOFF_CAP)
    if state.next != "tool":
        base.summary = state.next or "step"
        return base
    total, parts, retries, delay = 0.0, [], 0, 0.0
    # One call a step unless the agent runs a reply's calls at once (F15).
    for name in state.tools if agent.parallel_tools else state.tools[:1]:
        tool = agent.tools_by_name.get(name)
        if tool is not None and tool.retries:
            retries, delay = max(retries, tool.retries), max(delay, tool.retry_delay)
        if tool is None or tool.timeout is None:
            total = settings.step_timeout
            parts.append(name if tool is None or not tool.retries
                         else f"{name} (retries {tool.retries})")
            continue
        total += tool.timeout
        parts.append(f"{name} (timeout {tool.timeout:g}s, retries {tool.retries})")
    base.timeout = min(total + MARGIN, settings.step_timeout)
    base.summary = "tool " + ", ".join(parts)
    return _retried(base, retries, delay, RETRY_BACKOFF_CAP)


def _retried(options: StepOptions, retries: int, delay: float, cap: float) -> StepOptions:
    """``options`` with the retry policy of a step with ``retries`` of its own (none: the
    default, unlimited attempts for a lost worker or a refused store)."""
    if retries:
        options.attempts = retries + 1
        options.retry_initial = max(delay, 0.001)  # Temporal wants a positive interval
        options.retry_max = max(cap, options.retry_initial)
    return options


class StepActivity:
    """The ``durable_turns.step`` activity of one runtime (and ``durable_turns.backoff``).

    Args:
        runtime: drives the steps (its store is where they commit).
        settings: the worker's settings.
        client: the worker's Temporal client (``backoff`` reads a workflow's pending step).
    """

    def __init__(self, runtime: Runtime, settings: WorkerSettings,
                 client: Client | None = None) -> None:
        self.runtime = runtime
        self.settings = settings
        self.client = client

    @activity.defn(name=ACTIVITY)
    async def step(self, req: StepInput) -> StepOutcome:
        """Run the session's next step; see the module docstring.

        Raises:
            UnknownAgentError: this worker has no such agent (not retried).
            LeaseTimeoutError: another holder kept the lease (retried by Temporal).
            StoreError: the store refused the step, nothing written (retried).
            ApplicationError: this attempt of a model call or a tool failed and its policy
                retries it (type ``RetryStep``, retried after the attempt's backoff).
        """
        key = self.runtime.key(req.agent, req.session)
        beat = asyncio.create_task(self._beat())
        attempt = req.attempts_before + activity.info().attempt
        try:
            state = await self.runtime.step(key, lease_timeout=self.settings.lease_timeout,
                                            attempt=attempt)
        except RetryStep as e:
            # Benign: the SDK logs it without a traceback (the engine logged the failure).
            raise ApplicationError(str(e), type="RetryStep",
                                   next_retry_delay=timedelta(seconds=e.delay),
                                   category=ApplicationErrorCategory.BENIGN) from None
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        agent = self.runtime.agents[key.agent]
        return StepOutcome(state.more, state.parked, step_options(agent, state, self.settings),
                           await self._wake_at(key) if state.parked else None)

    @activity.defn(name=FIRE)
    async def fire(self, req: StepInput) -> float:
        """Fire the wake-ups due now (``scheduling.StoreWakeups``: each is claimed once and
        accepted as a command, which signals its session's workflow); returns when the
        session's next one is due (Unix seconds; 0: it has none)."""
        key = self.runtime.key(req.agent, req.session)
        await StoreWakeups(self.runtime).fire_due(self.runtime.clock.now())
        return await self._wake_at(key) or 0.0

    async def _wake_at(self, key: SessionKey) -> float | None:
        due = await self.runtime.store.next_timer([key.agent], key=key)
        return None if due is None else due.timestamp()

    @activity.defn(name=PLAN)
    async def plan(self, req: StepInput) -> StepOptions:
        """How to schedule the session's next step, from what is left of its chain (the
        workflow asks after a wake: no step's outcome said what comes next)."""
        key = self.runtime.key(req.agent, req.session)
        return step_options(self.runtime.agents[key.agent], await self.runtime.chain(key),
                            self.settings)

    @activity.defn(name=BACKOFF)
    async def backoff(self) -> int:
        """The attempt the calling workflow's step waits to run, when it waits out a retry's
        backoff (scheduled, not started, after a failed or lost attempt); 0 otherwise."""
        info = activity.info()
        if self.client is None or info.workflow_id is None:
            return 0
        handle = self.client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
        described = await handle.describe()
        for pending in described.raw_description.pending_activities:
            if pending.activity_type.name == ACTIVITY and pending.attempt > 1 and \
                    pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED:
                return int(pending.attempt)
        return 0

    async def _beat(self) -> None:
        # A third of the timeout: two heartbeats may be late before the step counts as lost.
        timeout = activity.info().heartbeat_timeout
        every = timeout.total_seconds() / 3 if timeout else self.settings.heartbeat / 3
        while True:
            activity.heartbeat()
            await asyncio.sleep(every)


def temporal_worker(runtime: Runtime, client: Client,
                    settings: WorkerSettings | None = None) -> Worker:
    """A Temporal worker that drives ``runtime``'s sessions; run it with ``await w.run()``
    or ``async with w:``.

    The workflow runs unsandboxed: its module imports only ``temporalio`` and the standard
    library and is deterministic, and the sandbox is dear (an empty workflow: 31 ms
    sandboxed, 18 ms not, on a dev server of this machine).

    Args:
        runtime: the runtime whose agents and store the steps use (open it first).
        client: a connected Temporal client.
        settings: the worker's settings.

    Returns:
        The worker (not running yet).
    """
    settings = settings or WorkerSettings()
    acts = StepActivity(runtime, settings, client)
    return Worker(
        client, task_queue=settings.task_queue, workflows=[SessionWorkflow],
        activities=[acts.step, acts.plan, acts.backoff, acts.fire],
        max_concurrent_activities=settings.max_steps,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=settings.sticky_timeout),
        workflow_runner=UnsandboxedWorkflowRunner(),
    )


__all__ = ["MARGIN", "StepActivity", "WorkerSettings", "step_options", "temporal_worker"]
