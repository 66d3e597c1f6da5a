"""durable_turns: an LLM agent's turn as a durable process.

Layers, bottom to top (each imports only from the ones below it):

1. records  — ``errors``, ``messages``, ``records``, ``events``, ``inbound``, ``tools``,
              ``agent``, ``hitl``
2. seams    — ``stores`` (SessionStore, its event feed), ``models`` (Model),
              ``events.EventSink``
3. engine   — ``engine`` (the turn loop), ``driver`` (one session's driver: lease, chain,
              cancel, reset, resume), ``runtime`` (Runtime: accept, wait, subscribe,
              interrupt), ``sessions`` (AgentSession: a façade over the runtime),
              ``batch`` (parallel tool calls' order), ``subagents`` (a tool that runs
              another agent's turn as a durable child)
4. adapters — ``stores.memory``/``sqlite``/``postgres``, ``models.scripted``/``anthropic``/
              ``openai_compat``, ``server``, ``channels``; they depend on the engine,
              never the reverse (``tests/test_layers.py`` checks it)
5. composition — ``cli`` (the only ``asyncio.run``)

Adapters that need an SDK resolve lazily, so ``import durable_turns`` imports none.
"""

from __future__ import annotations

import typing

from .agent import Agent, SurfacePolicy
from .channels import mount_agent, receive
from .errors import (
    FatalToolError,
    InvalidInputError,
    LeaseLostError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionBusyError,
    ToolCrashedError,
    TurnConflictError,
    TurnSuspendedError,
    UnknownTurnError,
)
from .events import TurnEvent
from .inbound import InboundEvent, Trigger, User
from .loader import load_agent
from .messages import Message, ToolCall
from .model import Model, ModelRequest, Stop, TextDelta
from .models.scripted import ModelReply, scripted
from .records import InputRequest, SessionKey, TurnResult, TurnStatus
from .runtime import Runtime
from .sessions import AgentSession, ResetResult, StartedTurn, grant_answer
from .stores.memory import MemoryStore
from .stores.sqlite import SqliteStore
from .subagents import subagent
from .tools import ActionContext, Tool, ToolContext, ToolSpec, define_action, tool

if typing.TYPE_CHECKING:
    from .stores.postgres import PostgresStore

__all__ = [
    "ActionContext",
    "Agent",
    "AgentSession",
    "FatalToolError",
    "InboundEvent",
    "InputRequest",
    "InvalidInputError",
    "LeaseLostError",
    "MemoryStore",
    "Message",
    "Model",
    "ModelReply",
    "ModelRequest",
    "PostgresStore",
    "ResetResult",
    "ResumeAuthorizationError",
    "ResumeConflictError",
    "Runtime",
    "SessionBusyError",
    "SessionKey",
    "SqliteStore",
    "StartedTurn",
    "Stop",
    "SurfacePolicy",
    "TextDelta",
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
