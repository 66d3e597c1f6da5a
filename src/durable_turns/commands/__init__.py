"""Commands: what is asked of a session besides a turn — cancel it, reset it, answer its
parked turn, retry a failed turn, steer it, and the clock's wake-ups and reminders (F2, F6,
F7, F8, F24) — one module each, and the registry.

Each module declares its command once (a :class:`~durable_turns.commands._registry.
CommandSpec`): how it is accepted (``queued`` behind the running turn as a chain entry,
``joins``: a chain entry that joins the running turn at its next model-call boundary — a
steer, F25 — or ``at once`` as a durable signal), its check (written once, run when it is
accepted and again where it applies, since the session may have changed in between), its effect (the
chain entry's ``apply``, run by the session's driver at its place), its HTTP route, its CLI
verb and its authorization action. :data:`COMMANDS` registers them; the HTTP routes, the
OpenAPI document, ``durable-turns sessions`` and the actions ``access`` knows are built
from the runtime's registry (``Runtime(commands=COMMANDS.with_(MY_SPEC))`` adds one).
"""

from __future__ import annotations

from ._accepting import check_redelivery, supersede_at_once
from ._cancel import SPEC as CANCEL_SPEC
from ._cancel import Cancel
from ._joining import JOINED, Join, JoiningCommand, joined_turn
from ._place import Place
from ._registry import (
    Acceptance,
    Arg,
    Call,
    ChainCommand,
    CommandSpec,
    Registry,
    Route,
    Streamed,
    Verb,
)
from ._reset import RESET, Reset, live_turns
from ._reset import SPEC as RESET_SPEC
from ._resume import SPEC as RESUME_SPEC
from ._resume import Resume
from ._retry import SPEC as RETRY_SPEC
from ._retry import Retry, latest_turn
from ._steer import SPEC as STEER_SPEC
from ._steer import Steer, check_steer, steer_entry
from ._wake import REMIND_SPEC, WAKE_SPEC, Remind, Wake

__all__ = [
    "COMMANDS",
    "JOINED",
    "RESET",
    "Acceptance",
    "Arg",
    "Call",
    "Cancel",
    "ChainCommand",
    "CommandSpec",
    "Join",
    "JoiningCommand",
    "Place",
    "Registry",
    "Remind",
    "Reset",
    "Resume",
    "Retry",
    "Route",
    "Steer",
    "Streamed",
    "Verb",
    "Wake",
    "check_redelivery",
    "check_steer",
    "joined_turn",
    "latest_turn",
    "live_turns",
    "steer_entry",
    "supersede_at_once",
]

COMMANDS = Registry([CANCEL_SPEC, RESET_SPEC, RESUME_SPEC, RETRY_SPEC, STEER_SPEC, WAKE_SPEC,
                     REMIND_SPEC])
"""The commands every runtime knows."""
