"""durable_turns: an LLM agent's turn as a durable process.

Layers, bottom to top (each imports only from the ones below it):

1. records  — ``errors``, ``messages``, ``events``, ``inbound``, ``tools``, ``agent``
2. seams    — ``stores`` (SessionStore), ``models`` (Model), ``events.EventSink``
3. engine   — ``engine`` (the turn loop), ``runtime`` (Runtime: pumps, leases, events),
              ``sessions`` (AgentSession: the calls on one session)
4. adapters — ``stores.memory``/``sqlite``/``postgres``, ``models.scripted``/``anthropic``/
              ``openai_compat``, ``server``, ``channels``; they depend on the engine,
              never the reverse (``tests/test_layers.py`` checks it)
5. composition — ``cli`` (the only ``asyncio.run``)

Adapters that need an SDK resolve lazily, so ``import durable_turns`` imports none.
"""

from __future__ import annotations

from .agent import Agent, SurfacePolicy
from .errors import (
    FatalToolError,
    InvalidInputError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionBusyError,
    TurnSuspendedError,
)
from .events import TurnEvent
from .hitl import InputRequest
from .inbound import InboundEvent, Trigger, User
from .loader import load_agent
from .messages import Message, ToolCall
from .models import Model, ModelRequest, Stop, TextDelta
from .models.scripted import ModelReply, scripted
from .runtime import Runtime
from .sessions import (
    AgentSession,
    ResetResult,
    StartedTurn,
    TurnResult,
    grant_answer,
)
from .stores.memory import MemoryStore
from .stores.sqlite import SqliteStore
from .tools import ActionContext, Tool, ToolContext, ToolSpec, define_action, tool

__all__ = [
    "ActionContext",
    "Agent",
    "AgentSession",
    "FatalToolError",
    "InboundEvent",
    "InputRequest",
    "InvalidInputError",
    "MemoryStore",
    "Message",
    "Model",
    "ModelReply",
    "ModelRequest",
    "ResetResult",
    "ResumeAuthorizationError",
    "ResumeConflictError",
    "Runtime",
    "SessionBusyError",
    "SqliteStore",
    "StartedTurn",
    "Stop",
    "SurfacePolicy",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolSpec",
    "Trigger",
    "TurnEvent",
    "TurnResult",
    "TurnSuspendedError",
    "User",
    "define_action",
    "grant_answer",
    "load_agent",
    "scripted",
    "tool",
]

