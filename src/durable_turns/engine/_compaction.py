"""The compaction step (F23): before a model step whose request would be over its agent's
``Compaction.trigger_tokens``, decide what the request sends instead of the whole transcript,
and commit that decision as step ``compact:<n>`` (``n``: the model step's own index).

A request's size is counted by the agent's model when it offers ``count_tokens``
(:class:`~durable_turns.model.TokenCounter`); else it is estimated from the last reply's
reported usage (its ``input_tokens``, cache counts and ``output_tokens``) plus the messages
after it, and never below the request's JSON length over four. Over the trigger, tool results
older than the kept tail are cleared first; if the request is still over, the summary model
summarises everything before the kept tail — in parts, each summary request under the
trigger, when the head is too big for one. The memo
(:class:`~durable_turns.compaction.CompactionMemo`) and the ``context.compacted`` event commit
in one transaction: a replay reads the memo back and sends what the first run sent; a head
already covered is never summarised again. What the view of a transcript under a memo is, is
``durable_turns.compaction``.

The kept tail starts at a ``user`` or ``trigger`` message; inside one long turn (many tool
calls, one opening message) it starts at an assistant message instead, whose calls are
answered by the tool messages right after it: a call is never cut from its result.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from ..compaction import (
    DEFAULT_INSTRUCTIONS,
    SUMMARY_PREFIX,
    Compaction,
    CompactionMemo,
    CompactStepId,
    estimate_tokens,
    latest_compaction,
    request_view,
)
from ..errors import ModelError
from ..events import ContextCompacted, TurnEvent
from ..messages import Message, encode_json, encode_message
from ..model import Model, ModelRequest, TokenCounter
from ..stores import Transaction, TurnStore
from ..tools import ToolSpec
from ._commits import StepCommits
from ._model_step import Reply, RetryPolicy, ask
from ._step_context import CompactionSeen, TranscriptCache

__all__ = ["Compactor"]

log = logging.getLogger("durable_turns")
_OVERFLOW_TRIES = 3
"""How often a summary request refused as over the window is split smaller (halved)."""


def _tail_start(transcript: list[Message], keep: int, budget: int) -> int | None:
    """Where the kept tail starts, or ``None`` if nothing before it could be compacted.

    The newest ``user``/``trigger`` message that leaves at least ``keep`` messages after it
    (itself included); but when the messages from there on are by themselves over half of
    ``budget`` (one long turn of many tool calls), the newest assistant message that leaves
    ``keep`` after it: its calls' results follow it, so none is cut from its call.
    """
    last = len(transcript) - keep
    opening = next((i for i in range(last, 0, -1)
                    if transcript[i].role in ("user", "trigger")), None)
    if opening is not None and estimate_tokens("", transcript[opening:], []) <= budget // 2:
        return opening
    inside = next((i for i in range(last, 0, -1) if transcript[i].role == "assistant"), None)
    if inside is not None and (opening is None or inside > opening):
        return inside
    return opening


def _groups(transcript: list[Message], lo: int, hi: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut before every message that is not a tool result: each part is one
    message with the results of its calls, so a call and its result stay in one part."""
    cuts = [i for i in range(lo, hi) if i == lo or transcript[i].role != "tool"]
    return list(zip(cuts, [*cuts[1:], hi], strict=True))


def _trimmed(m: Message, chars: int) -> Message:
    """``m`` cut to about ``chars`` characters, for a summary request only (never stored)."""
    if m.role == "tool":
        text = m.result if isinstance(m.result, str) else encode_json(m.result)
        if len(text) <= chars:
            return m
        return replace(m, result=f"{text[:chars]} [… {len(text) - chars} characters cut]")
    if len(m.text) <= chars:
        return m
    return replace(m, text=f"{m.text[:chars]} [… {len(m.text) - chars} characters cut]")


class Compactor:
    """The compaction steps of one drive of a session (one lease) of an agent with
    ``context=Compaction(…)``; keeps the newest memo between its steps."""

    def __init__(self, config: Compaction, model: Model, store: TurnStore,
                 commits: StepCommits, retry: RetryPolicy, seen: TranscriptCache) -> None:
        self.config = config
        self.model: Model = config.model if config.model is not None else model
        self.counter = model if isinstance(model, TokenCounter) else None
        """The agent's model, when it counts its requests' tokens itself."""
        self._store = store
        self._commits = commits
        self._retry = retry
        self._seen = seen
        self._loaded: int | None = None  # the generation the memo below was read for
        self._at, self._memo = -1, None  # type: tuple[int, CompactionMemo | None]
        self._state: CompactionSeen | None = None  # what the runtime keeps of it

    def _current(self, memo: CompactionMemo | None) -> tuple[list[Message], int]:
        """The view of the live log under ``memo``, and its messages' JSON length; kept
        with the session's log between steps and leases, so a step encodes only the
        messages added since."""
        transcript = self._commits.transcript
        st = self._state
        have = st.view if st is not None and st.memo is memo else None
        if have is None or have[0] > len(transcript):
            view = list(request_view(transcript, memo))
            chars = sum(len(encode_message(m)) for m in view)
        else:
            new = transcript[have[0]:]
            view = [*have[1], *new]
            chars = have[2] + sum(len(encode_message(m)) for m in new)
        if st is not None and st.memo is memo:
            self._keep(replace(st, view=(len(transcript), view, chars)))
        return view, chars

    def _keep(self, state: CompactionSeen) -> None:
        self._state = state
        self._seen.keep_compaction(self._commits.lease.key, state)

    async def _latest(self) -> CompactionMemo | None:
        cp = self._commits
        if self._loaded == cp.lease.generation and self._at <= len(cp.transcript):
            return self._memo
        key, generation, size = cp.lease.key, cp.lease.generation, len(cp.transcript)
        seen = self._seen.compaction(key)
        view = None
        if seen is None or seen.generation != generation or seen.upto > size \
                or seen.at > size:
            steps = await self._store.read_steps(key)  # every step, once per runtime
            self._at, self._memo = latest_compaction(steps, cp.transcript)
        else:
            # Only the steps another lease (here or in another process) may have added
            # since: one compact:<n> for each n the log grew through.
            self._at, self._memo, view = seen.at, seen.memo, seen.view
            for n in range(seen.upto, size + 1):
                step_id = str(CompactStepId(n))
                found = await self._store.read_steps(key, step_id=step_id)
                if step_id in found:
                    self._at, self._memo = latest_compaction(found, cp.transcript)
                    view = None
        self._loaded = generation
        self._keep(CompactionSeen(generation, size, self._at, self._memo, view))
        return self._memo

    def _estimate(self, system: str, view: list[Message], tools: list[ToolSpec],
                  chars: int | None) -> int:
        if chars is None:
            est = estimate_tokens(system, view, tools)
        else:  # (the same sum as estimate_tokens, its messages' part known already)
            est = (len(system) + chars + sum(len(encode_json(t.to_dict())) for t in tools)) // 4
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

    async def _size(self, system: str, view: list[Message], tools: list[ToolSpec],
                    turn_id: str, *, estimate: bool = True, chars: int | None = None) -> int:
        """The request's input tokens: the model's own count when it offers one, else the
        estimate (from usage too when ``estimate``; else from the request alone)."""
        if self.counter is not None:
            try:
                return await self.counter.count_tokens(ModelRequest(system, view, tools,
                                                                    turn_id))
            except ModelError as e:
                log.warning("turn %s: counting the request's tokens failed (%s); using the "
                            "estimate", turn_id, e)
        return self._estimate(system, view, tools, chars) if estimate \
            else estimate_tokens(system, view, tools)

    async def messages(self, turn_id: str, n: int, system: str, tools: list[ToolSpec], *,
                       refused: bool = False) -> list[Message]:
        """What model step ``model:<n>`` sends of the transcript; runs and commits a
        compaction step first when the request would be over the trigger (or the provider
        ``refused`` it as over its window)."""
        transcript = self._commits.transcript
        memo = await self._latest()
        view, chars = self._current(memo)
        trigger = self.config.trigger_tokens
        before = await self._size(system, view, tools, turn_id, chars=chars)
        if before <= trigger and not refused:
            return view
        tail = _tail_start(transcript, self.config.keep_recent, trigger)
        if tail is None:
            return view
        covered, cleared, summary = (memo.covered, memo.cleared, memo.summary) if memo \
            else (0, 0, None)
        if self.config.clear_tool_results and tail > cleared:
            trial = CompactionMemo(covered, tail, summary, before, 0)
            after = await self._size(system, request_view(transcript, trial), tools, turn_id,
                                     estimate=False)
            if (after <= trigger and not refused) or tail <= covered:
                return await self._commit(turn_id, n, replace(trial, after=after))
        if tail <= covered:
            return view  # nothing new before the kept tail: never summarised twice
        text, calls = await self._summarise(transcript, memo, tail, system, tools, turn_id)
        trial = CompactionMemo(tail, tail, text, before, 0)
        after = await self._size(system, request_view(transcript, trial), tools, turn_id,
                                 estimate=False)
        return await self._commit(turn_id, n, replace(trial, after=after), calls=calls)

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
                         tail: int, system: str, tools: list[ToolSpec],
                         turn_id: str) -> tuple[str, int]:
        """The summary of ``transcript[:tail]`` (the previous summary and what follows it),
        and how many model calls it took. A summary request the summary model refuses as
        over its window is made again in smaller parts."""
        budget = self.config.trigger_tokens
        for attempt in range(_OVERFLOW_TRIES):
            try:
                return await self._rolling(transcript, memo, tail, system, tools, turn_id,
                                           budget)
            except ModelError as e:
                if not e.context_overflow or attempt == _OVERFLOW_TRIES - 1:
                    raise
                budget //= 2
        raise AssertionError("unreachable")  # pragma: no cover

    async def _rolling(self, transcript: list[Message], memo: CompactionMemo | None,
                       tail: int, system: str, tools: list[ToolSpec], turn_id: str,
                       budget: int) -> tuple[str, int]:
        """Summarise ``[covered, tail)`` in parts that each fit ``budget`` with the summary so
        far: each part's summary is the next part's prefix (one part when it all fits)."""
        start = memo.covered if memo else 0
        summary = memo.summary if memo else None
        head = transcript[:tail]
        if self.config.clear_tool_results:  # (the results are cleared in the request: F23)
            head = request_view(head, CompactionMemo(0, tail, None, 0, 0))
        ask_for = Message("user", self.config.instructions or DEFAULT_INSTRUCTIONS)
        calls = 0
        parts = _groups(head, start, tail)
        while parts:
            prefix = [Message("user", SUMMARY_PREFIX + summary)] if summary else []
            room = max(budget - estimate_tokens(system, [*prefix, ask_for], tools),
                       budget // 4)
            take, size = 0, 0
            for lo, hi in parts:
                more = estimate_tokens("", head[lo:hi], [])
                if take and size + more > room:
                    break
                take, size = take + 1, size + more
            lo, hi = parts[0][0], parts[take - 1][1]
            chunk = head[lo:hi]
            if size > room:  # one message with its results, too big by itself: cut down
                chars = max(room * 4 // len(chunk), 200)
                chunk = [_trimmed(m, chars) for m in chunk]
            request = ModelRequest(system, [*prefix, *chunk, ask_for], tools, turn_id)
            reply = await ask(self.model, request, self._retry, on_text=lambda _: None,
                              on_retry=lambda *_: None)
            calls += 1
            if not reply.text.strip():
                raise ModelError(f"the summary model {type(self.model).__name__} returned no "
                                 "text", provider=type(self.model).__name__)
            summary = reply.text
            del parts[:take]
        assert summary is not None
        return summary, calls

    async def _commit(self, turn_id: str, n: int, memo: CompactionMemo, *,
                      calls: int = 0) -> list[Message]:
        cp = self._commits
        step = CompactStepId(n)

        async def fill(tx: Transaction) -> list[TurnEvent]:
            tx.add_step(step, turn_id, memo)
            return [tx.add_event(ContextCompacted(
                **cp.ids(turn_id), step=str(step), tokens_before=memo.before,
                tokens_after=memo.after, covered=memo.covered, cleared=memo.cleared,
                summarised=calls > 0, summary=memo.summary if calls else None,
                summary_calls=calls))]

        await cp.commit(fill)
        self._at, self._memo = n, memo
        self._keep(CompactionSeen(cp.lease.generation, n, n, memo))
        return request_view(cp.transcript, memo)
