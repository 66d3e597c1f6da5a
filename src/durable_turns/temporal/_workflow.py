"""The session workflow: Temporal schedules a session's steps, the store records them.

One workflow per session (:func:`workflow_id`), so Temporal runs at most one driver of a
session at a time, as the lease does. The workflow holds no transcript and makes no
decision of the turn: it runs the ``durable_turns.step`` activity (``Runtime.step``: the
chain's next step against the store, committed under the lease's epoch) while the activity
says more is left, then waits on the ``wake`` signal — a new turn, an answer, a cancel, a
reset, each durable in the store before the signal is sent. Signals are kept while no worker
runs (an Update is not), so a park waits on one.

Before a step no earlier step's outcome described (after a wake), a local activity reads
the chain's next step from the store (``durable_turns.plan``), so that the step's activity
is scheduled with its own limit, retry policy and summary.

A step's retries are Temporal's: its activity's retry policy is the step's own — a model call
gets the agent's ``model_retries`` and ``model_retry_delay``, a tool call its ``retries`` and
``retry_delay`` (doubled per attempt, up to 30 s) — and the worker runs one attempt per
activity attempt, raising for Temporal to retry (with the attempt's own backoff as the next
delay) until the last, which commits the error. An attempt lost with its worker counts as
one; when the policy's attempts are spent that way (no attempt committed), the step is
scheduled again with its attempt count carried on, so it still ends in a committed result.
A wake that interrupts (a cancel, a replace, a reset) while the step waits out a backoff
cancels that wait and runs the step's next attempt at once, where the turn ends.

It continues as new every
:data:`STEPS_PER_RUN` steps (or when Temporal suggests it), which bounds its history, and
ends after ``idle`` seconds with nothing to do and nothing parked; the next wake starts it
again (signal-with-start).

This module is imported into workflow code: it imports nothing but the standard library and
``temporalio``, and does nothing non-deterministic.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, RetryState
from temporalio.workflow import ActivityHandle

WORKFLOW = "durable_turns.session"
"""The workflow's type name, as Temporal's UI shows it."""
ACTIVITY = "durable_turns.step"
"""The activity's type name: one per step of a session's chain."""
PLAN = "durable_turns.plan"
"""A local activity: how to schedule the session's next step, from the store's chain (after
a wake, before a step no earlier step's outcome described)."""
FIRE = "durable_turns.fire"
"""An activity: fire the wake-ups that are due (a parked session's workflow runs it when its
timer ends: a sleep's end, a deadline, a reminder); returns when the session's next one is
due (Unix seconds; 0: none)."""
BACKOFF = "durable_turns.backoff"
"""A local activity: the attempt the session's step waits to run, if it waits out a retry's
backoff (0 if it runs or is not retried)."""
WAKE = "wake"
"""The signal that tells a session's workflow it has work."""
STEPS_PER_RUN = 500
"""Steps before the workflow continues as new (a run's history stays small)."""
NON_RETRYABLE = ("ConfigurationError", "UnknownAgentError")
"""The worker's failures no attempt can mend: the workflow fails on them."""


def workflow_id(task_queue: str, agent: str, session: str) -> str:
    """The workflow id of a session: readable, and the same from every process.

    The task queue is part of it: two deployments (two stores) on one Temporal namespace
    use two queues, and their sessions of the same name stay apart.

    Args:
        task_queue: the deployment's task queue.
        agent: the session's agent.
        session: the session id.

    Returns:
        ``<task_queue>/<agent>/<session>``, or that with a hash in place of a long session
        id (Temporal ids are bounded).
    """
    wid = f"{task_queue}/{agent}/{session}"
    if len(wid) <= 400:
        return wid
    digest = hashlib.sha256(session.encode()).hexdigest()[:32]
    return f"{task_queue}/{agent}/{session[:200]}…{digest}"


@dataclass
class StepOptions:
    """How the workflow schedules a step's activity (the worker says, in each outcome)."""

    timeout: float = 86400.0
    """Seconds the step may take (``start_to_close``): from the tools' limits and retries."""
    heartbeat: float = 2.0
    """Seconds without a heartbeat before Temporal takes the step as lost and runs it again."""
    retry_initial: float = 0.2
    """Seconds before the step's second attempt (a tool's ``retry_delay``, the agent's
    ``model_retry_delay``; else a pause after a lost worker or a refused store); doubled per
    attempt."""
    retry_max: float = 2.0
    """The longest pause between two attempts."""
    attempts: int = 0
    """The step's attempts (``retries + 1`` of its tool or model call); 0: unlimited (a step
    without retries of its own runs again only when its worker was lost or the store refused
    it)."""
    summary: str = "step"
    """What Temporal's UI shows for the activity (``model``, ``tool create_order``, …)."""


@dataclass
class SessionStart:
    """The workflow's input: which session, and how to schedule its first step."""

    agent: str
    session: str
    idle: float = 60.0
    """Seconds the workflow waits with nothing to do and nothing parked before it ends."""
    woken: bool = True
    """Whether to run a step at once (a run continued as new with work left does)."""
    options: StepOptions = field(default_factory=StepOptions)
    steps_per_run: int = STEPS_PER_RUN
    """Steps before the workflow continues as new."""
    known: bool = False
    """Whether :attr:`options` are the next step's (the last step's outcome said what comes
    next); else the workflow asks the store (``durable_turns.plan``) before the step."""


@dataclass
class StepInput:
    """The activity's input: the session whose next step to run."""

    agent: str
    session: str
    attempts_before: int = 0
    """Attempts of this step spent by earlier activities (each lost with its worker): the
    activity's attempt counts on from them."""


@dataclass
class StepOutcome:
    """The activity's result: what is left of the chain, and how to schedule the next step."""

    more: bool
    parked: bool
    options: StepOptions = field(default_factory=StepOptions)
    wake_at: float | None = None
    """While parked: when the session's next wake-up is due (Unix seconds; F24), which the
    workflow waits for with a timer of its own."""


@workflow.defn(name=WORKFLOW)
class SessionWorkflow:
    """Runs a session's chain one step (one activity) at a time; see the module docstring."""

    def __init__(self) -> None:
        self._woken = False
        self._interrupt = False

    @workflow.signal(name=WAKE)
    def wake(self, interrupt: bool = False) -> None:
        """The session has work (durable in the store already); ``interrupt``: a turn was
        asked to stop, so a step waiting out a retry's backoff should run now."""
        self._woken = True
        self._interrupt = self._interrupt or interrupt

    @workflow.run
    async def run(self, start: SessionStart) -> str:
        """Drive the session until it is idle for ``start.idle`` seconds.

        Returns:
            ``idle`` when it ended with nothing to do.
        """
        self._woken = self._woken or start.woken
        options, parked, steps, known = start.options, False, 0, start.known
        wake_at: float | None = None
        while True:
            if not self._woken:
                # Parked: wait for the answer (or a cancel) as long as it takes, or until
                # its next wake-up (a workflow timer: F24); idle: a while, then end (the
                # next wake starts the workflow again).
                timeout: float | None = None if parked else start.idle
                if parked and wake_at is not None:
                    timeout = max(wake_at - workflow.now().timestamp(), 0.0)
                try:
                    await workflow.wait_condition(lambda: self._woken, timeout=timeout)
                except TimeoutError:
                    if not self._woken and parked and wake_at is not None:
                        # Fired as a command of the session, which wakes this workflow.
                        later = await self._fire(start)
                        floor = workflow.now().timestamp() + 1.0  # never a busy loop
                        wake_at = None if later is None else max(later, floor)
                        continue
                    if not self._woken:
                        return "idle"
            if steps >= start.steps_per_run or workflow.info().is_continue_as_new_suggested():
                workflow.continue_as_new(
                    SessionStart(start.agent, start.session, start.idle, True, options,
                                 start.steps_per_run, known),
                    task_timeout=workflow.info().task_timeout)
            self._woken = False
            if not known:
                options = await self._plan(start, options)
            out = await self._step(start, options)
            steps += 1
            options, parked, known = out.options, out.parked, out.more
            wake_at = out.wake_at
            self._woken = self._woken or out.more

    async def _fire(self, start: SessionStart) -> float | None:
        """Fire the wake-ups due now (an activity); the session's next one, if any."""
        try:
            later: float = await workflow.execute_activity(
                FIRE, StepInput(start.agent, start.session), result_type=float,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)))
            return later if later > 0 else None
        except ActivityError:
            return workflow.now().timestamp() + 10.0

    async def _plan(self, start: SessionStart, options: StepOptions) -> StepOptions:
        """The next step's options, read from the store by a local activity (its retry
        policy, limit and summary); ``options`` if that fails (the step itself decides)."""
        try:
            planned: StepOptions = await workflow.execute_local_activity(
                PLAN, StepInput(start.agent, start.session), result_type=StepOptions,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=2))
            return planned
        except ActivityError:
            return options

    async def _step(self, start: SessionStart, options: StepOptions) -> StepOutcome:
        """Run the session's next step: one activity, scheduled again (its attempts counted
        on) when its policy's attempts were all lost without a committed result, or at once
        when an interrupt finds it waiting out a retry's backoff."""
        before = 0
        while True:
            self._interrupt = False
            step = workflow.start_activity(
                ACTIVITY, StepInput(start.agent, start.session, before),
                result_type=StepOutcome,
                start_to_close_timeout=timedelta(seconds=options.timeout),
                heartbeat_timeout=timedelta(seconds=options.heartbeat),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=options.retry_initial),
                    maximum_interval=timedelta(seconds=options.retry_max),
                    maximum_attempts=options.attempts,
                    non_retryable_error_types=list(NON_RETRYABLE)),
                summary=options.summary,
            )
            waiting = await self._until_done_or_waiting(step)
            if waiting and not step.done():
                step.cancel()  # not started: Temporal cancels its wait at once
            try:
                out: StepOutcome = await step
                return out
            except ActivityError as e:
                if waiting:
                    before += waiting - 1  # the attempts that failed count on
                    # The wake is served: the step scheduled now starts after it, so what
                    # it left is in the step's outcome (``more``).
                    self._woken = False
                elif e.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED:
                    before += options.attempts
                else:
                    raise

    async def _until_done_or_waiting(self, step: ActivityHandle[StepOutcome]) -> int:
        """Wait for the step to end; on an interrupt, look whether it waits out a retry's
        backoff, and return the attempt it waits to run if so (else 0, once it ended)."""
        while not step.done():
            await workflow.wait_condition(lambda: step.done() or self._interrupt)
            if step.done():
                break
            self._interrupt = False
            try:
                waiting: int = await workflow.execute_local_activity(
                    BACKOFF, result_type=int, start_to_close_timeout=timedelta(seconds=10),
                    retry_policy=RetryPolicy(maximum_attempts=2))
            except ActivityError:
                continue  # unknown: the step keeps its own pace (its next attempt ends it)
            if waiting:
                return waiting
        return 0


__all__ = [
    "ACTIVITY",
    "BACKOFF",
    "FIRE",
    "NON_RETRYABLE",
    "PLAN",
    "STEPS_PER_RUN",
    "WAKE",
    "WORKFLOW",
    "SessionStart",
    "SessionWorkflow",
    "StepInput",
    "StepOptions",
    "StepOutcome",
    "workflow_id",
]
