"""durable_turns: an LLM agent's turn as a durable process.

The layers, bottom to top, and which modules sit in each are declared once, in
``durable_turns/layers.py``; ``tests/docs/test_layers.py`` checks every import against them. This
module sits at the top: it only re-exports. Adapters that need an SDK resolve lazily, so
``import durable_turns`` imports none.
"""

from __future__ import annotations

import typing

from ._in_doubt import Reconciled
from ._loader import load_agent
from .agent import Agent, SurfacePolicy
from .channels import mount_agent, receive
from .compaction import Compaction
from .context import ActionContext, ToolContext
from .errors import (
    FatalToolError,
    InvalidInputError,
    LeaseLostError,
    LimitExceeded,
    OutputInvalid,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionAccessError,
    SessionBusyError,
    ToolCrashedError,
    TurnConflictError,
    TurnSuspendedError,
    UnknownTurnError,
)
from .events import TurnEvent
from .inbound import InboundEvent, Trigger, User
from .limits import Limits, Price
from .messages import Message, ToolCall
from .model import Model, ModelRequest, Stop, TextDelta, TokenCounter
from .models.scripted import ModelReply, scripted
from .records import InputRequest, SessionKey, TurnResult, TurnStatus
from .replay import replay
from .runtime import Runtime
from .sessions import AgentSession, ResetResult, StartedTurn, grant_answer
from .stores.memory import MemoryStore
from .stores.sqlite import SqliteStore
from .subagents import subagent
from .tools import Tool, ToolSpec, define_action, tool

if typing.TYPE_CHECKING:
    from .stores.postgres import PostgresStore

__all__ = [
    "ActionContext",
    "Agent",
    "AgentSession",
    "Compaction",
    "FatalToolError",
    "InboundEvent",
    "InputRequest",
    "InvalidInputError",
    "LeaseLostError",
    "LimitExceeded",
    "Limits",
    "MemoryStore",
    "Message",
    "Model",
    "ModelReply",
    "ModelRequest",
    "OutputInvalid",
    "PostgresStore",
    "Price",
    "Reconciled",
    "ResetResult",
    "ResumeAuthorizationError",
    "ResumeConflictError",
    "Runtime",
    "SessionAccessError",
    "SessionBusyError",
    "SessionKey",
    "SqliteStore",
    "StartedTurn",
    "Stop",
    "SurfacePolicy",
    "TextDelta",
    "TokenCounter",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolCrashedError",
    "ToolSpec",
    "Trigger",
    "TurnConflictError",
    "TurnEvent",
    "TurnResult",
    "TurnStatus",
    "TurnSuspendedError",
    "UnknownTurnError",
    "User",
    "define_action",
    "grant_answer",
    "load_agent",
    "mount_agent",
    "receive",
    "replay",
    "scripted",
    "subagent",
    "tool",
]


if not typing.TYPE_CHECKING:  # type checkers see the import above; unknown names stay errors

    def __getattr__(name: str) -> typing.Any:
        # PostgresStore needs psycopg (the ``postgres`` extra): imported on first use only.
        if name == "PostgresStore":
            from .stores.postgres import PostgresStore

            globals()[name] = PostgresStore
            return PostgresStore
        raise AttributeError(f"module 'durable_turns' has no attribute {name!r}")
