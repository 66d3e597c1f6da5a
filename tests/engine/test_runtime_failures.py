"""F4: A store failure met by a tool through its context abandons the step; it is never the tool's
result (issue: a terminated backend inside ``request_input`` became ``{"error": "StoreError:
…"}``, the approval was never asked and the model was told the tool failed).

The memory store here fails a read on purpose (a wrapper that raises ``StoreError`` as the
PostgreSQL store does when its backend is gone); ``test_postgres_work.py`` terminates a real
backend inside ``request_input``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    ToolCall,
    ToolContext,
    scripted,
    subagent,
    tool,
)
from durable_turns.errors import StoreError, runtime_failure
from durable_turns.events import ActionCompleted, InputRequested
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.records import SessionKey, StepRecord

WAIT = 30.0


class FailingReads(MemoryStore):
    """A memory store whose next ``failures`` reads of a step by id fail as a lost database
    connection does (``StoreError``), then work again."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.failed: list[str] = []

    async def read_steps(self, key: SessionKey, *, generation: int | None = None,
                         step_id: str | None = None) -> dict[str, StepRecord]:
        if step_id is not None and self.failures > 0:
            self.failures -= 1
            self.failed.append(step_id)
            raise StoreError("PostgreSQL failed: terminating connection due to administrator "
                             "command")
        return await super().read_steps(key, generation=generation, step_id=step_id)


def _model(tool_name: str) -> Any:
    def reply(request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("Asking.", [ToolCall("c1", tool_name, {"order": "42"})])
        return ModelReply(f"The tool said {request.messages[-1].result}.")
    return scripted(reply)


async def _park_then_approve(rt: Runtime) -> tuple[Any, list[Any]]:
    session = rt.session("ops", "s1")
    async with asyncio.timeout(WAIT):
        parked = await session.start("refund 42", turn_id="t1")
        first = await session.result(parked.turn_id)
        assert first.status == "suspended", first
        assert first.request is not None and first.request.id == "approve"
        await session.resume("t1", "approve", True)
        done = await session.result("t1")
    return done, await session.events()


@pytest.mark.parametrize("retries", [0, 3])
async def test_a_store_failure_inside_request_input_abandons_the_step(retries: int) -> None:
    attempts: list[int] = []

    @tool(retries=retries, retry_delay=0.001)
    async def refund(order: str, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order once a person approves."""
        attempts.append(ctx.attempt)
        ok = await ctx.request_input("approve", f"Refund order {order}?",
                                     schema={"type": "boolean"})
        return {"refunded": ok}

    store = FailingReads(failures=1)
    async with Runtime([Agent("ops", tools=[refund])], store, _model("refund")) as rt:
        done, events = await _park_then_approve(rt)
    assert store.failed == ["input:t1:approve"]
    # The failed attempt committed nothing: the request was stored once, after the drive
    # that followed, and the one result is the approved one.
    assert [e.request.id for e in events if isinstance(e, InputRequested)] == ["approve"]
    assert [e.result for e in events if isinstance(e, ActionCompleted)] == [{"refunded": True}]
    assert done.status == "completed" and "'refunded': True" in (done.text or "")
    # The failed attempt, the park, the run after the answer; the failed one was abandoned,
    # not retried as attempt 2 (a tool's retries never retry a store failure): each drive
    # runs the tool from the top, where attempts count from 1.
    assert attempts == [1, 1, 1]


async def test_a_tool_that_swallows_the_store_failure_is_abandoned_all_the_same() -> None:
    caught: list[str] = []

    @tool(retries=3, retry_delay=0.001)
    async def refund(order: str, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order once a person approves; it turns every failure into a result."""
        try:
            ok = await ctx.request_input("approve", f"Refund order {order}?",
                                         schema={"type": "boolean"})
        except Exception as e:  # what a careless tool does: its failure becomes its "result"
            caught.append(type(e).__name__)
            return {"refunded": False, "why": str(e)}
        return {"refunded": ok}

    store = FailingReads(failures=1)
    async with Runtime([Agent("ops", tools=[refund])], store, _model("refund")) as rt:
        done, events = await _park_then_approve(rt)
    assert caught == ["StoreError"]
    assert [e.result for e in events if isinstance(e, ActionCompleted)] == [{"refunded": True}]
    assert done.status == "completed"


async def test_a_store_failure_a_subagent_meets_is_not_its_parent_s_tool_result() -> None:
    # The parent's subagent tool reads its child step first (services.remember): that read
    # fails once; the parent's tool must not report "subagent failed" to its model.
    helper = Agent("helper", "You help.", model=scripted([ModelReply("Helped.")]))
    lead = Agent("lead", "You delegate.", [subagent("helper", description="Helps.")],
                 model=scripted([
                     ModelReply("", [ToolCall("c1", "helper", {"task": "help"})]),
                     ModelReply("Done with help."),
                 ]))
    store = FailingReads(failures=1)
    async with Runtime([lead, helper], store) as rt:
        r = await rt.session("lead", "s1").turn("Get help", turn_id="t1")
        events = await rt.session("lead", "s1").events()
    assert store.failed == ["child:t1:c1"]
    assert r.status == "completed" and r.text == "Done with help."
    results = [e.result for e in events if isinstance(e, ActionCompleted) and e.child is None]
    assert results == [{"answer": "Helped."}]


@pytest.mark.parametrize("raised", [
    StoreError("away"),
    RuntimeError("driving session failed"),
])
def test_runtime_failure_finds_the_store_failure_behind_an_error(raised: Exception) -> None:
    if isinstance(raised, StoreError):
        assert runtime_failure(raised) is raised
        return
    cause = StoreError("away")
    raised.__cause__ = cause
    assert runtime_failure(raised) is cause
    assert runtime_failure(ValueError("a tool's own")) is None


class FailingAccepts(MemoryStore):
    """A memory store whose first ``failures`` accepts fail after writing (a commit whose
    answer was lost: the worst case for a retry)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def enqueue(self, key: SessionKey, entry: Any) -> Any:
        out = await super().enqueue(key, entry)
        if self.failures > 0:
            self.failures -= 1
            raise StoreError("PostgreSQL failed: server closed the connection unexpectedly")
        return out


async def test_the_chat_repl_offers_a_line_s_turn_again_and_it_is_started_once() -> None:
    from durable_turns.channels import mount_agent
    from durable_turns.channels._repl import chat

    written: list[str] = []

    class Typed:
        """A terminal where one line is typed, then the input ends (``channels.Terminal``)."""

        lines = iter(["order a keyboard"])

        async def prompt(self, text: str) -> str:
            written.append(text)
            try:
                return next(self.lines)
            except StopIteration:
                raise EOFError from None

        def write(self, text: str) -> None:
            written.append(text)

        def quiet(self) -> contextlib.AbstractContextManager[None]:
            return contextlib.nullcontext()

        def on_interrupt(self, handler: Callable[[], None] | None) -> None:
            pass

    store = FailingAccepts(failures=1)
    agent = Agent("ops")
    async with Runtime([agent], store, scripted([ModelReply("Ordered.")])) as rt:
        async with asyncio.timeout(WAIT):
            await chat(mount_agent(agent, rt), session="s1", user="ann", terminal=Typed())
        turns = [t for t in await rt.session("ops", "s1").chain() if t.kind == "turn"]
    assert len(turns) == 1 and turns[0].status == "completed"
    out = "".join(written)
    assert "the store is unavailable; trying again" in out and "Ordered." in out
