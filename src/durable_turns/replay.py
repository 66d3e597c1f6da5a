"""Replay: run a recorded session's turns again against another model, prompt or agent, with
the tools answered from what they really returned — a prompt change tested on real traffic
without touching a real system.

:func:`replay` starts a new session (a fork of the source before its first turn) and sends it
each of the source's turns in order, under the same turn ids, with the same openings and
speakers. A tool call whose name and input match a call the source made in that turn gets
the recorded result and the tool does not run (the same call twice gets its results in
order); an unmatched call is, by choice, an error result the model reads (``tools=
"recorded"``, the default), run for real (``"live"``), or answered by a function of yours. A
turn that parks is answered with the answer the source recorded. The report compares each
turn: the assistant's final text, the tool calls (added, removed, changed), the tokens.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ._hitl import Grant, sign
from .agent import Agent
from .context import ToolContext
from .errors import ConfigurationError
from .history import Checkpoint, ForkPlan
from .inbound import InboundEvent, Trigger
from .messages import Message, ToolCall
from .model import Model
from .records import Answer, InputStepId, SessionKey, TurnResult, TurnStatus
from .runtime import Runtime
from .sessions import AgentSession
from .tools import Tool

__all__ = ["ReplayReport", "TurnDiff", "UnrecordedCallError", "fork_recorded", "replay"]

Answerer = Callable[[str, dict[str, Any]], Any]
"""``answer(tool_name, input)`` → the result of a call the recording does not have (may be
a coroutine function)."""
Summary = Literal["identical", "text differs", "tools differ", "not finished"]


class UnrecordedCallError(Exception):
    """A replayed turn called a tool in a way its recording did not: the model reads this as
    the call's error result (``tools="recorded"``)."""


@dataclass(frozen=True, slots=True)
class TurnDiff:
    """One turn of a replay beside its original."""

    turn_id: str
    opening: str
    original: TurnResult
    replayed: TurnResult
    calls_added: tuple[ToolCall, ...] = ()
    """Calls the replay made that the original did not (by name and input)."""
    calls_removed: tuple[ToolCall, ...] = ()
    """Calls the original made that the replay did not."""
    calls_changed: tuple[tuple[ToolCall, ToolCall], ...] = ()
    """``(original, replayed)``: a call of the same tool with another input."""
    tokens_original: dict[str, int] = field(default_factory=dict)
    tokens_replayed: dict[str, int] = field(default_factory=dict)

    @property
    def summary(self) -> Summary:
        """``identical``, ``text differs`` (same calls), ``tools differ``, or ``not
        finished`` (the replay failed, or parked without a recorded answer)."""
        if self.replayed.status != TurnStatus.COMPLETED and \
                self.replayed.status != self.original.status:
            return "not finished"
        if self.calls_added or self.calls_removed or self.calls_changed:
            return "tools differ"
        if self.replayed.text != self.original.text:
            return "text differs"
        return "identical"

    def to_dict(self) -> dict[str, Any]:
        """As JSON values."""
        return {"turn_id": self.turn_id, "opening": self.opening, "summary": self.summary,
                "original": self.original.to_dict(), "replayed": self.replayed.to_dict(),
                "calls_added": [c.to_dict() for c in self.calls_added],
                "calls_removed": [c.to_dict() for c in self.calls_removed],
                "calls_changed": [[a.to_dict(), b.to_dict()] for a, b in self.calls_changed],
                "tokens_original": self.tokens_original,
                "tokens_replayed": self.tokens_replayed}


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What :func:`replay` found, turn by turn."""

    source: SessionKey
    replay: SessionKey
    """The session the replay ran in (a fork of the source before its first turn)."""
    turns: tuple[TurnDiff, ...]

    @property
    def identical(self) -> bool:
        """Whether every turn came out as it did."""
        return all(t.summary == "identical" for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        """As JSON values."""
        return {"source": str(self.source), "replay": str(self.replay),
                "identical": self.identical, "turns": [t.to_dict() for t in self.turns]}

    def render(self) -> str:
        """A readable diff, a block per turn."""
        lines = [f"replay of {self.source} as {self.replay}"]
        for t in self.turns:
            lines.append(f"\nturn {t.turn_id}: {t.summary}  ({t.opening[:60]!r})")
            if t.replayed.text != t.original.text or t.summary == "not finished":
                lines.append(f"  - {_outcome(t.original)}")
                lines.append(f"  + {_outcome(t.replayed)}")
            lines += [f"  + call {_call(c)}" for c in t.calls_added]
            lines += [f"  - call {_call(c)}" for c in t.calls_removed]
            lines += [f"  ~ call {_call(a)} -> {json.dumps(b.input, sort_keys=True)}"
                      for a, b in t.calls_changed]
            if t.tokens_original != t.tokens_replayed:
                lines.append(f"  tokens {t.tokens_original} -> {t.tokens_replayed}")
        same = sum(t.summary == "identical" for t in self.turns)
        lines.append(f"\n{same} of {len(self.turns)} turns identical")
        return "\n".join(lines)


def _outcome(r: TurnResult) -> str:
    if r.status == TurnStatus.COMPLETED:
        return repr(r.text)
    return f"({r.status}: {r.error or r.reason or (r.request.id if r.request else '')})"


def _call(c: ToolCall) -> str:
    return f"{c.name}({json.dumps(c.input, sort_keys=True)})"


def replay_id(session: str) -> str:
    """A new id for a replay of ``session``: ``<session>~replay-<8 hex digits>``."""
    return f"{session}~replay-{uuid.uuid4().hex[:8]}"


async def replay(session: AgentSession, *, model: Model | None = None,
                 agent: Agent | None = None,
                 tools: Literal["recorded", "live"] | Answerer = "recorded",
                 to: str | None = None, owner: str | None = None) -> ReplayReport:
    """Replay ``session``'s turns in a new session with another model or agent.

    Args:
        session: the recorded session (its live generation).
        model: the model the replay asks (default: the agent's, else the runtime's).
        agent: the agent to replay with (default: the session's); it keeps the session's
            agent name, and its tools are answered from the recording.
        tools: what an unrecorded call gets: ``"recorded"`` an error result naming it,
            ``"live"`` the real tool, or a function ``answer(name, input)``.
        to: the replay's session id (default: :func:`replay_id`).
        owner: who owns the replay's session (a host's caller), written with its fork.

    Returns:
        The report, turn by turn.

    Raises:
        SessionExistsError: ``to`` exists already (or another owns it).
        ConfigurationError: ``agent`` has another name than the session's, or no model.
    """
    rt = session.runtime
    rt.require_open()
    base = agent or session.agent
    if base.name != session.key.agent:
        raise ConfigurationError(f"a replay of {session.key} needs agent {session.key.agent!r}, "
                                 f"not {base.name!r}")
    transcript = await session.transcript()
    chain = [t for t in await session.chain() if t.kind == "turn"]
    ran = {m.turn_id for m in transcript if m.is_opening}
    turns = [t for t in chain if t.turn_id in ran]
    recording = _Recording(transcript, base)
    answers = {s.id: s.result for s in (await rt.store.read_steps(session.key)).values()
               if s.kind == "input"}
    replayed = replace(base, tools=[recording.wrap(t, tools) for t in base.tools],
                       model=model or base.model)
    dst = SessionKey(base.name, to or replay_id(session.key.session))
    await rt.store.fork([ForkPlan(session.key, dst, 0, None, owner=owner)])
    others = [a for name, a in rt.agents.items() if name != base.name]
    runner = Runtime([replayed, *others], rt.store, rt.model, owns_store=False,
                     secret=rt.secret)
    diffs = []
    async with runner:
        target = runner.session(dst.agent, dst.session)
        for t in turns:
            assert t.opening is not None
            result = await _run_turn(target, t.turn_id, t.opening, t.event, answers, runner)
            diffs.append(_diff(t.turn_id, t.opening.text, t.result, result, transcript,
                               await target.transcript()))
    return ReplayReport(session.key, dst, tuple(diffs))


async def fork_recorded(session: AgentSession, to: str, at: Checkpoint | None = None, *,
                        tools: Literal["recorded", "live"] | Answerer = "recorded",
                        owner: str | None = None, timeout: float | None = None
                        ) -> AgentSession:
    """Fork ``session`` at ``at`` (as :meth:`AgentSession.fork`), the turn under way there
    driven on with its tools answered from the source's recording, as :func:`replay` answers
    them: nothing runs again for real, local or remote.

    A call of that turn whose tool and input match a call the source made after the
    checkpoint gets the source's result; one the recording lacks gets what ``tools`` says
    (an error result, the real tool, or your function's answer). The turn is driven here,
    in this process, to its end or its park; the fork's later turns (and a parked tool once
    answered) run the real tools.

    Args:
        session: the source.
        to: the fork's session id.
        at: a checkpoint of ``session.history()`` (default: its last).
        tools: what a call the recording lacks gets (as :func:`replay`'s).
        owner: who owns the fork.
        timeout: how long to wait for the turn, in seconds (default: no limit).

    Returns:
        The fork, a session of ``session``'s runtime.

    Raises:
        SessionExistsError, LookupError: as :meth:`AgentSession.fork`.
        TimeoutError: the turn did not end or park within ``timeout``.
    """
    rt = session.runtime
    rt.require_open()
    every = await session.history()
    where = at or (every[-1] if every else None)
    if where is None:
        raise LookupError(f"session {session.key} has no checkpoint to fork from")
    source = await rt.store.read_messages(session.key, generation=where.generation)
    answered = {m.call_id for m in source[:where.messages] if m.call_id is not None}
    recording = _Recording(source, session.agent, skip=answered)
    wrapped = replace(session.agent, tools=[recording.wrap(t, tools)
                                            for t in session.agent.tools])
    others = [a for name, a in rt.agents.items() if name != wrapped.name]
    runner = Runtime([wrapped, *others], rt.store, rt.model, owns_store=False,
                     secret=rt.secret)
    async with runner:
        forked = await runner.session(session.key.agent, session.key.session).fork(
            to, where, owner=owner, tools="live")
        for t in await forked.chain():
            if t.status.unfinished:
                await forked.result(t.turn_id, timeout=timeout)
    return rt.session(session.key.agent, to)


async def _run_turn(target: AgentSession, turn_id: str, opening: Message,
                    event: dict[str, Any] | None, answers: dict[str, Any],
                    runner: Runtime) -> TurnResult:
    trigger = Trigger(by=opening.by or "system") if opening.role == "trigger" else None
    await target.start(opening.text, turn_id=turn_id, trigger=trigger,
                       event=InboundEvent.from_dict(event) if event else None)
    result = await target.result(turn_id)
    while result.status == TurnStatus.SUSPENDED and result.request is not None:
        for r in result.request.all:
            recorded = answers.get(str(InputStepId(turn_id, r.id)))
            if not isinstance(recorded, Answer):
                return result  # no recorded answer: the replay stops here
            granted = None
            if "policy" in (r.answerers or {}):  # answered then; replayed as answered
                who = r.answerers or {}
                granted = sign(Grant(str(target.key), turn_id, r.id, who["policy"],
                                     who.get("scope"), recorded.by), runner.secret)
            await target.resume(turn_id, r.id, recorded.value, by=recorded.by,
                                granted=granted)
        result = await target.result(turn_id)
    return result


class _Recording:
    """The source's calls and results, by turn, tool and input (inputs normalised by the
    tool's own validation, as a replayed call's are)."""

    def __init__(self, transcript: list[Message], agent: Agent,
                 skip: Collection[str] = ()) -> None:
        results = {m.call_id: m.result for m in transcript if m.role == "tool"}
        self.calls: dict[tuple[str, str, str], list[Any]] = {}
        for m in transcript:
            for c in m.tool_calls if m.role == "assistant" else ():
                if c.id in skip:
                    continue  # answered in the fork already: not owed again
                tool = agent.tools_by_name.get(c.name)
                try:
                    args = tool.validate(dict(c.input)) if tool else dict(c.input)
                except ValueError:
                    continue
                key = (m.turn_id or "", c.name, _canonical(args))
                self.calls.setdefault(key, []).append(results.get(c.id))

    def take(self, turn_id: str, name: str, args: dict[str, Any]) -> tuple[bool, Any]:
        found = self.calls.get((turn_id, name, _canonical(args)))
        if not found:
            return False, None
        return True, found.pop(0)

    def wrap(self, tool: Tool, unrecorded: Literal["recorded", "live"] | Answerer) -> Tool:
        """``tool`` answered from the recording (the same kind of tool: a local one stays in
        its step's transaction, for ``live``)."""
        def miss(args: dict[str, Any]) -> UnrecordedCallError:
            return UnrecordedCallError(f"the recording has no call {tool.name}"
                                       f"({json.dumps(args, sort_keys=True)}) in this turn")

        if tool.remote:
            async def run_remote(args: dict[str, Any], ctx: ToolContext) -> Any:
                hit, result = self.take(ctx.turn_id, tool.name, args)
                if hit:
                    return result
                if unrecorded == "live":
                    return await tool.run(args, ctx)
                if callable(unrecorded):
                    out = unrecorded(tool.name, args)
                    return await out if inspect.isawaitable(out) else out
                raise miss(args)

            return Tool(tool.spec, run_remote, validate=tool.validate,
                        interruptible=tool.interruptible, timeout=tool.timeout,
                        retries=tool.retries, retry_on=tool.retry_on,
                        retry_delay=tool.retry_delay)

        def run_local(args: dict[str, Any], ctx: ToolContext) -> Any:
            hit, result = self.take(ctx.turn_id, tool.name, args)
            if hit:
                return result
            if unrecorded == "live":
                return tool.run(args, ctx)
            if callable(unrecorded):
                out = unrecorded(tool.name, args)
                if inspect.isawaitable(out):
                    raise ConfigurationError(f"tools=…: {tool.name} is a local tool: answer it "
                                             "with a plain function")
                return out
            raise miss(args)

        return Tool(tool.spec, run_local, validate=tool.validate, timeout=tool.timeout)


def _canonical(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, default=str)


def _turn_calls(transcript: list[Message], turn_id: str) -> list[ToolCall]:
    return [c for m in transcript if m.role == "assistant" and m.turn_id == turn_id
            for c in m.tool_calls]


def _tokens(transcript: list[Message], turn_id: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for m in transcript:
        if m.role == "assistant" and m.turn_id == turn_id:
            for k, v in m.usage.items():
                total[k] = total.get(k, 0) + v
    return total


def _diff(turn_id: str, opening: str, original: TurnResult, replayed: TurnResult,
          before: list[Message], after: list[Message]) -> TurnDiff:
    was, now = _turn_calls(before, turn_id), _turn_calls(after, turn_id)
    removed = [c for c in was if not _has(now, c)]
    added = [c for c in now if not _has(was, c)]
    changed = []
    for a in list(removed):
        b = next((c for c in added if c.name == a.name), None)
        if b is not None:
            changed.append((a, b))
            removed.remove(a)
            added.remove(b)
    return TurnDiff(turn_id, opening, original, replayed, tuple(added), tuple(removed),
                    tuple(changed), _tokens(before, turn_id), _tokens(after, turn_id))


def _has(calls: list[ToolCall], c: ToolCall) -> bool:
    return any(x.name == c.name and x.input == c.input for x in calls)

