"""The compaction step (F23): before a model step whose request would be over its agent's
``Compaction.trigger_tokens``, decide what the request sends instead of the whole transcript,
and commit that decision as step ``compact:<n>`` (``n``: the model step's own index).

A request's size is estimated from the last reply's reported usage (its ``input_tokens``,
cache counts and ``output_tokens``) plus the messages after it, and never below the request's
JSON length over four. Over the trigger, tool results older than the kept tail are cleared
first; if the request is still over, the summary model summarises everything before the kept
tail. The memo (:class:`~durable_turns.compaction.CompactionMemo`) and the ``context.compacted``
event commit in one transaction: a replay reads the memo back and sends what the first run
sent; a head already covered is never summarised again. What the view of a transcript under
a memo is, is ``durable_turns.compaction``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from ..compaction import (
    DEFAULT_INSTRUCTIONS,
    Compaction,
    CompactionMemo,
    CompactStepId,
    estimate_tokens,
    latest_compaction,
    request_view,
)
from ..errors import ModelError
from ..events import ContextCompacted, TurnEvent
from ..messages import Message
from ..model import Model, ModelRequest
from ..stores import Transaction, TurnStore
from ..tools import ToolSpec
from ._commits import StepCommits
from ._model_step import Reply, RetryPolicy, ask

__all__ = ["Compactor"]


def _tail_start(transcript: list[Message], keep: int) -> int | None:
    """Where the kept tail starts: the newest ``user``/``trigger`` message that leaves at
    least ``keep`` messages after it (itself included); ``None`` if there is none."""
    for i in range(len(transcript) - keep, 0, -1):
        if transcript[i].role in ("user", "trigger"):
            return i
    return None


class Compactor:
    """The compaction steps of one drive of a session (one lease) of an agent with
    ``context=Compaction(…)``; keeps the newest memo between its steps."""

    def __init__(self, config: Compaction, model: Model, store: TurnStore,
                 commits: StepCommits, retry: RetryPolicy) -> None:
        self.config = config
        self.model: Model = config.model if config.model is not None else model
        self._store = store
        self._commits = commits
        self._retry = retry
        self._loaded: int | None = None  # the generation the memo below was read for
        self._at, self._memo = -1, None  # type: tuple[int, CompactionMemo | None]

    async def _latest(self) -> CompactionMemo | None:
        cp = self._commits
        if self._loaded != cp.lease.generation or self._at > len(cp.transcript):
            steps = await self._store.read_steps(cp.lease.key)
            self._at, self._memo = latest_compaction(steps, cp.transcript)
            self._loaded = cp.lease.generation
        return self._memo

    def _estimate(self, system: str, view: list[Message], tools: list[ToolSpec]) -> int:
        est = estimate_tokens(system, view, tools)
        transcript = self._commits.transcript
        for i in range(len(transcript) - 1, max(self._at, 0) - 1, -1):
            m = transcript[i]
            if m.role != "assistant":
                continue
            u = m.usage or {}
            if u.get("input_tokens"):
                reported = sum(u.get(k, 0) for k in (
                    "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                    "output_tokens"))
                est = max(est, reported + estimate_tokens("", transcript[i + 1:], []))
            break
        return est

    async def messages(self, turn_id: str, n: int, system: str, tools: list[ToolSpec], *,
                       refused: bool = False) -> list[Message]:
        """What model step ``model:<n>`` sends of the transcript; runs and commits a
        compaction step first when the request would be over the trigger (or the provider
        ``refused`` it as over its window)."""
        transcript = self._commits.transcript
        memo = await self._latest()
        view = request_view(transcript, memo)
        before = self._estimate(system, view, tools)
        tail = _tail_start(transcript, self.config.keep_recent)
        if (before <= self.config.trigger_tokens and not refused) or tail is None:
            return view
        covered, cleared, summary = (memo.covered, memo.cleared, memo.summary) if memo \
            else (0, 0, None)
        if self.config.clear_tool_results and tail > cleared:
            trial = CompactionMemo(covered, tail, summary, before, 0)
            after = estimate_tokens(system, request_view(transcript, trial), tools)
            if (after <= self.config.trigger_tokens and not refused) or tail <= covered:
                return await self._commit(turn_id, n, replace(trial, after=after))
        if tail <= covered:
            return view  # nothing new before the kept tail: never summarised twice
        text = await self._summarise(transcript, memo, tail, system, tools, turn_id)
        trial = CompactionMemo(tail, tail, text, before, 0)
        after = estimate_tokens(system, request_view(transcript, trial), tools)
        return await self._commit(turn_id, n, replace(trial, after=after), summarised=True)

    async def within(self, call: Callable[[list[Message]], Awaitable[Reply]], turn_id: str,
                     n: int, system: str, tools: list[ToolSpec]) -> Reply:
        """``call`` model step ``model:<n>`` with its (compacted) messages; a refusal as over
        the window compacts once more and calls again, then fails naming the window."""
        try:
            return await call(await self.messages(turn_id, n, system, tools))
        except ModelError as e:
            if not e.context_overflow:
                raise
        messages = await self.messages(turn_id, n, system, tools, refused=True)
        try:
            return await call(messages)
        except ModelError as e:
            if not e.context_overflow:
                raise
            raise ModelError(
                f"the request is over the model's context window even after compaction "
                f"(about {estimate_tokens(system, messages, tools)} tokens by estimate; "
                f"trigger_tokens={self.config.trigger_tokens}, "
                f"keep_recent={self.config.keep_recent}): {e}",
                provider=e.provider, status=e.status, context_overflow=True) from e

    async def _summarise(self, transcript: list[Message], memo: CompactionMemo | None,
                         tail: int, system: str, tools: list[ToolSpec], turn_id: str) -> str:
        head = CompactionMemo(memo.covered if memo else 0, tail if self.config.clear_tool_results
                              else 0, memo.summary if memo else None, 0, 0)
        messages = request_view(transcript[:tail], head)
        messages.append(Message("user", self.config.instructions or DEFAULT_INSTRUCTIONS))
        request = ModelRequest(system=system, messages=messages, tools=tools, turn_id=turn_id)
        reply = await ask(self.model, request, self._retry, on_text=lambda _: None,
                          on_retry=lambda *_: None)
        if not reply.text.strip():
            raise ModelError(f"the summary model {type(self.model).__name__} returned no text",
                             provider=type(self.model).__name__)
        return reply.text

    async def _commit(self, turn_id: str, n: int, memo: CompactionMemo, *,
                      summarised: bool = False) -> list[Message]:
        cp = self._commits
        step = CompactStepId(n)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.add_step(step, turn_id, memo)
            return [tx.add_event(ContextCompacted(
                **cp.ids(turn_id), step=str(step), tokens_before=memo.before,
                tokens_after=memo.after, covered=memo.covered, cleared=memo.cleared,
                summarised=summarised))]

        await cp.commit(fill)
        self._at, self._memo = n, memo
        return request_view(cp.transcript, memo)
