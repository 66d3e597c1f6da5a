"""F2 checkpoints and replay, F14 workers, F20 Temporal: every way of driving a turn is a
scheduler calling ``Runtime.step``; the in-process one holds the session's lease across a
turn's steps."""

from __future__ import annotations

from durable_turns import Agent, ModelReply, ModelRequest, Runtime, ToolCall, scripted, tool
from durable_turns.models.scripted import calls_this_turn
from durable_turns.scheduling import InProcessScheduler, NoDriveScheduler
from durable_turns.stores import SessionStore


@tool
async def look(n: int) -> int:
    """Look something up."""
    return n


def _reply(request: ModelRequest) -> ModelReply:
    n = calls_this_turn(request)
    if n < 3:
        return ModelReply("", [ToolCall(f"c{n}", "look", {"n": n})])
    return ModelReply("done")


def _agent() -> Agent:
    return Agent("ops", "You look things up.", [look])


async def test_runtime_step_runs_one_step_at_a_time_and_says_what_comes_next(
        store: SessionStore) -> None:
    async with Runtime([_agent()], store, scripted(_reply),
                       scheduler=NoDriveScheduler()) as rt:
        await rt.session("ops", "s1").start("go", turn_id="t1")
        key = rt.key("ops", "s1")
        assert (await rt.chain(key)).next == "model"
        seen = []
        while True:
            state = await rt.step(key)
            seen.append((state.more, state.next, state.tools))
            if not state.more:
                break
        # The opening goes with the first model call; each call and each reply is a step.
        assert seen == [(True, "tool", ("look",)), (True, "model", ()),
                        (True, "tool", ("look",)), (True, "model", ()),
                        (True, "tool", ("look",)), (True, "model", ()),
                        (False, "", ())]
        turn = await rt.session("ops", "s1").result("t1")
        assert (turn.status, turn.text) == ("completed", "done")
        transcript = await rt.session("ops", "s1").transcript()
        assert [m.role for m in transcript] == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]


async def test_the_in_process_scheduler_claims_the_lease_once_for_a_turn_s_steps(
        store: SessionStore) -> None:
    async with Runtime([_agent()], store, scripted(_reply),
                       scheduler=InProcessScheduler()) as rt:
        key = rt.key("ops", "s1")
        first = await rt.session("ops", "s1").turn("go", turn_id="t1")
        assert first.status == "completed"
        await rt.idle()
        before = await store.claim(key)
        await before.release()
        second = await rt.session("ops", "s1").turn("again", turn_id="t2")
        assert (second.status, second.text) == ("completed", "done")
        await rt.idle()
        after = await store.claim(key)
        await after.release()
        # Seven steps, one claim (the epoch goes up once per claim).
        assert after.epoch == before.epoch + 2
