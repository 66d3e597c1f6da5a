"""F12, F21, F29: The console's time travel (issue 30) in a real browser: "Fork from here" on a
timeline step opens a fork that goes on from that step, and a replay shows its report side by
side; the tool's own counter proves neither ran it again."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import expect

from durable_turns import Agent, ModelReply, ToolCall, scripted, tool
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from test_console import CHROMIUM, console, shot

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium (.ci/run installs it)")


def _reply(request: ModelRequest, done: str) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("Counting.", [ToolCall("c1", "bump", {"by": 2})])
    return ModelReply(f"{done} {request.messages[-1].result['total']}.")


def counter() -> tuple[Agent, list[int]]:
    """An agent whose one tool counts its runs (``ran``)."""
    ran: list[int] = []

    @tool
    def bump(by: int) -> dict[str, Any]:
        """Add ``by`` to the counter."""
        ran.append(by)
        return {"total": sum(ran)}

    return Agent("ops", "You count.", [bump],
                 model=scripted(lambda r: _reply(r, "The total is"))), ran


async def test_fork_from_a_timeline_step_and_replay_with_another_model() -> None:
    agent, ran = counter()
    other = scripted(lambda r: _reply(r, "Now at"))
    async with console([agent], replay_models={"other": other}) as c:
        done = await c.rt.session("ops", "s1").turn("count for me")
        assert done.text == "The total is 2." and ran == [2]

        page = await c.page(await c.context(), "s1", "#/s/ops/s1")
        await expect(page.locator(".msg.assistant").last).to_contain_text("The total is 2.")
        await page.click("#tab-timeline")
        forks = page.locator("[data-role=fork]")
        await expect(forks).to_have_count(3)  # model, tool, model: each a checkpoint
        await shot(page, "timetravel-timeline")

        # Right after the tool's step: the fork asks the model again (its own timeline),
        # with the tool's result it copied; the tool does not run again.
        await page.click("tr[data-step='tool:1:c1'] [data-role=fork]")
        await expect(page.locator("h1")).to_contain_text("s1-fork-")
        forked = page.url.split("/")[-1]
        await expect(page.locator(".msg.assistant").last).to_contain_text("The total is 2.")
        await expect(page.locator("#session-status .badge")).to_have_text("idle")
        assert ran == [2]
        turns = await c.rt.session("ops", forked).turns()
        assert [t.result.text for t in turns] == ["The total is 2."]
        assert [t.result.text for t in await c.rt.session("ops", "s1").turns()] == \
            ["The total is 2."]  # the source is untouched
        await shot(page, "timetravel-fork")

        # A replay of the source with the host's other model: the recorded tool result
        # answers its call, the text differs, side by side.
        await page.goto(f"{c.url}/#/s/ops/s1")
        await page.select_option("#replay-model", "other")
        await page.click("#replay")
        await expect(page.locator("#replay-summary")).to_contain_text("0 of 1 turns identical")
        turn = page.locator(".replay-turn")
        await expect(turn).to_have_attribute("data-summary", "text differs")
        await expect(turn.locator(".recorded")).to_have_text("The total is 2.")
        await expect(turn.locator(".replayed")).to_have_text("Now at 2.")
        assert ran == [2]
        # Named as the CLI names a replay (F29: one name whichever host made it).
        assert "~replay-" in page.url, page.url
        await shot(page, "timetravel-replay")

        # A reload keeps the report (the tab's storage); the replayed session opens from it.
        await page.reload()
        await expect(page.locator(".replay-turn .replayed")).to_have_text("Now at 2.")
        await page.click("h1 a >> nth=1")
        await expect(page.locator(".msg.assistant").last).to_contain_text("Now at 2.")
        assert c.errors == []


async def test_a_fork_that_would_run_a_local_tool_again_asks_first() -> None:
    """Issue 37: "Fork from here" on the step that asked for a local tool's call (owed
    there) says the fork would run it again, and offers the recording or a live run."""
    agent, ran = counter()
    async with console([agent]) as c:
        await c.rt.session("ops", "s1").turn("count for me")
        assert ran == [2]
        page = await c.page(await c.context(), "s1", "#/s/ops/s1")
        await page.click("#tab-timeline")
        await expect(page.locator("[data-role=fork]")).to_have_count(3)
        await page.locator("[data-role=fork]").first.click()  # the model step: the call owed
        await expect(page.locator(".notice.warning")).to_contain_text("bump (call c1)")
        assert ran == [2]  # asked first: nothing ran, no fork was written
        await page.click("[data-role=fork-recorded]")
        await expect(page.locator("h1")).to_contain_text("s1-fork-")
        await expect(page.locator(".msg.assistant").last).to_contain_text("The total is 2.")
        assert ran == [2]  # answered from the recording
        assert [e for e in c.errors if "status of 409" not in e] == []  # the refused fork
