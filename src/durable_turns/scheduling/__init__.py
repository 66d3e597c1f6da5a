"""The ways a runtime's turns get driven: each a :class:`Scheduler` calling ``Runtime.step``.

A runtime tells its scheduler that a session has work (:meth:`Scheduler.wake`, after the
work is durable); the scheduler has :meth:`Runtime.step <durable_turns.Runtime.step>` called
for each step of the session's chain, here or elsewhere, until the :class:`ChainState` it
returns has nothing ``more``. The runtime takes one in ``Runtime(scheduler=…)``:

- :class:`InProcessScheduler` (the default): steps each session in this process as its work
  arrives, the session's lease held across its steps;
- :class:`NoDriveScheduler`: steps nothing here; a front (``durable-turns serve --no-drive``)
  that accepts durably while workers drive;
- :class:`ClaimingScheduler`: a worker (``durable-turns worker``): claims ready sessions of a
  shared store (:meth:`ClaimingScheduler.run`) and steps them here, as the in-process one;
- ``durable_turns.temporal.TemporalScheduler``: a Temporal workflow per session, each step an
  activity on a Temporal worker (the ``temporal`` extra).

Time (F24): a runtime's :class:`ClockLoop` (``runtime.clock_loop``) waits on its clock for the
next due time of its :class:`DueSource` s (the store's wake-ups; schedules) and has them
fire; ``Runtime.open`` starts it wherever sessions are stepped here.
"""

from __future__ import annotations

from ..engine._driver import ChainState
from ._claiming import ClaimingScheduler
from ._clock_loop import ClockLoop, DueSource
from ._inprocess import InProcessScheduler, NoDriveScheduler
from ._scheduler import Scheduler, Stepped
from ._wakeups import StoreWakeups

__all__ = [
    "ChainState",
    "ClaimingScheduler",
    "ClockLoop",
    "DueSource",
    "InProcessScheduler",
    "NoDriveScheduler",
    "Scheduler",
    "Stepped",
    "StoreWakeups",
]
