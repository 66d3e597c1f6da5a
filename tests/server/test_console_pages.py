"""F12: The web console's pages in Chromium, on what the first run found: a refusal that must stay
explained, an inbox count that follows the page, a page for an agent not served, a failed
turn's Retry, the timeline's footer, the composer steering a running turn and a limit's ask
(F25), a compaction's mark and summary (F23).

The browser's clock is installed (``BrowserContext.clock``): the pages' timers (the 10 s
snapshot, the 5 s inbox) fire only when a test runs the clock on, so what a page shows
without them is shown by the page's own events, and a refresh happens when the test says.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import expect

from durable_turns import Agent, AgentSession, Limits, Stop, TextDelta, ToolCall, tool
from durable_turns.errors import ModelError
from durable_turns.models import ModelEvent, ModelRequest
from test_console import CHROMIUM, WAIT, ask, console, name_me, ops, shot
from test_timeline import Pages, reader

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium (.ci/run installs it)")


async def test_a_refused_answer_stays_explained_when_the_page_refreshes(tmp_path: Path
                                                                        ) -> None:
    async with console([ops(tmp_path / "refunds.db")]) as c:
        async with httpx.AsyncClient(base_url=c.url, timeout=WAIT) as client:
            parked = (await client.post("/agents/ops/sessions/r1/chat", json={
                "text": "Refund $30 on order 42.", "by": "alice"})).json()
        assert parked["status"] == "suspended"
        ctx = await c.context()
        await ctx.clock.install()
        page = await c.page(ctx, "bob", "#/s/ops/r1")
        await name_me(page, "bob")
        request = page.locator("[data-role=input]")
        await expect(request).to_contain_text("Only http:alice may answer.")
        await request.get_by_role("button", name="Approve").click()
        refused = request.locator(".notice.error")
        await expect(refused).to_contain_text("You may not do this: only user 'http:alice' may "
                                              "answer 'approve-refund'; 'bob' may not.")
        snapshots = len(await c.asked("/timeline", 1))
        await page.clock.run_for(10_500)  # the page's periodic snapshot, and its render
        await c.asked("/timeline", snapshots + 1)
        await page.click("#tab-timeline")  # two more renders, around the same form
        await page.click("#tab-transcript")
        await expect(refused).to_contain_text("'bob' may not.")
        await expect(request.get_by_role("button", name="Approve")).to_be_enabled()
        await shot(page, "23-refusal-kept")
    assert [e for e in c.errors if "status of 403" not in e] == []


async def test_the_inbox_count_follows_a_park_on_the_page_being_viewed(tmp_path: Path) -> None:
    async with console([ops(tmp_path / "refunds.db")]) as c:
        ctx = await c.context()
        await ctx.clock.install()  # no timer refreshes the count: the page's events must
        page = await c.page(ctx, "alice", "#/s/ops/r1")
        await name_me(page, "alice")
        await expect(page.locator("#turns")).to_contain_text("No turn yet")
        await expect(page.locator("#inbox-count")).to_have_text("")
        await ask(page, "Refund $30 on order 42.")
        await expect(page.locator("#session-status .badge")).to_have_text("suspended")
        await expect(page.locator("#inbox-count")).to_have_text("1")
        await shot(page, "24-inbox-count-live")
        await page.locator("[data-role=input]").get_by_role("button", name="Approve").click()
        await expect(page.locator(".turn-end .badge")).to_have_text("completed")
        await expect(page.locator("#inbox-count")).to_have_text("")
    assert c.errors == []


async def test_a_page_for_an_agent_not_served_offers_nothing_to_press(tmp_path: Path
                                                                      ) -> None:
    async with console([ops(tmp_path / "refunds.db")]) as c:
        page = await c.page(await c.context(), "nobody", "#/s/nobody/s1")
        await expect(page.locator("#session-notice .notice.error")).to_have_text(
            "There is no agent “nobody” here; the agents served are: “ops”.")
        for control in ("#cancel", "#reset", "#ask", "form.ask", "#tab-timeline"):
            await expect(page.locator(control)).to_have_count(0)
        await shot(page, "25-unknown-agent")
    assert c.errors == []


class Flaky:
    """A model that is down until the test brings it back."""

    def __init__(self) -> None:
        self.down = True

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if self.down:
            raise ModelError("provider: HTTP 401 authentication_error: bad key",
                             provider="provider", status=401)
        yield TextDelta("Back up.")
        yield Stop("end_turn", {"input_tokens": 12, "output_tokens": 3})


async def test_a_failed_turn_is_retried_from_its_page() -> None:
    model = Flaky()
    async with console([Agent("desk", "You help.", model=model, model_retries=0)]) as c:
        page = await c.page(await c.context(), "desk", "#/s/desk/s1")
        await expect(page.locator("#turns")).to_contain_text("No turn yet")
        await ask(page, "Are you there?")
        end = page.locator(".turn-end")
        await expect(end.locator(".badge")).to_have_text("failed")
        await expect(end).to_contain_text("HTTP 401 authentication_error")
        retry = page.locator("[data-role=retry]")
        await expect(retry).to_have_text("Retry")
        await shot(page, "26-failed-with-retry")

        model.down = False
        await retry.click()
        await expect(page.locator("#session-notice")).to_contain_text(
            "Retrying: the turn goes on from the step that failed.")
        await expect(end.locator(".badge")).to_have_text("completed")
        await expect(page.locator(".msg.assistant")).to_have_text(["assistantBack up."])
        await expect(retry).to_have_count(0)
        await expect(page.locator(".msg.user")).to_have_count(1)  # the same turn, re-opened
        await shot(page, "27-retried")

        await page.click("#tab-timeline")
        footer = page.locator("section.turn .turn-end")
        await expect(footer).to_have_text(re.compile(
            r"^turn: (\d+ ms|\d+\.\d\d s) · tokens: input 12 · output 3$"))
        await shot(page, "28-timeline-footer")
        async with httpx.AsyncClient(base_url=c.url, timeout=WAIT) as client:
            again = await client.post("/agents/desk/sessions/s1/retry",
                                      json={"turn_id": "nope"})
            assert again.status_code == 404
            turns: list[dict[str, Any]] = (await client.get(
                "/agents/desk/sessions/s1")).json()["turns"]
            done = await client.post("/agents/desk/sessions/s1/retry",
                                     json={"turn_id": turns[0]["turn_id"]})
            assert done.status_code == 409  # it did not fail (any more)
    assert c.errors == []


async def stored(s: AgentSession, n: int) -> None:
    """Until the session's chain has ``n`` entries (a poll the caller bounds)."""
    while len(await s.chain()) < n:
        await asyncio.sleep(0.01)


class Steered:
    """First call of a turn: ``wait`` (a tool held until the test lets it go); then the user
    texts it was shown, joined by ``|``."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        users = [m.text for m in request.messages if m.role == "user"]
        if request.messages[-1].role == "user" and len(users) == 1:
            yield ToolCall("c1", "wait", {})
            yield Stop("tool_use")
            return
        yield TextDelta("|".join(users))
        yield Stop("end_turn")


async def test_the_composer_steers_the_running_turn(tmp_path: Path) -> None:
    """F25: sent while a turn runs, the message joins it before its next model call."""
    held = asyncio.Event()

    @tool
    async def wait() -> str:
        """Hold the turn until the test lets it go."""
        await asyncio.wait_for(held.wait(), WAIT)
        return "waited"

    async with console([Agent("desk", "You help.", [wait], model=Steered())]) as c:
        page = await c.page(await c.context(), "desk", "#/s/desk/s1")
        await ask(page, "first")
        await expect(page.locator("form.ask button[type=submit]")).to_have_text("Steer")
        await ask(page, "and also")
        s = c.rt.session("desk", "s1")
        await asyncio.wait_for(stored(s, 2), WAIT)
        held.set()
        steered = page.locator("[data-role=steered]")
        await expect(steered).to_contain_text("and also")
        await expect(page.locator(".msg.assistant")).to_have_text(["assistantfirst|and also"])
        await expect(page.locator("section.turn")).to_have_count(1)
        await expect(page.locator("form.ask button[type=submit]")).to_have_text("Send")
        await shot(page, "29-steered")
        assert [e.kind for e in await s.chain()] == ["turn", "steer"]
    assert c.errors == []


class Endless:
    """Always asks for one more ``step``: only a limit ends its turn."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        n = sum(1 for m in request.messages if m.role == "assistant")
        yield ToolCall(f"c{n}", "step", {"n": n})
        yield Stop("tool_use", {"input_tokens": 10, "output_tokens": 5})


async def test_a_limit_asks_on_the_page_and_approve_grants_more() -> None:
    """F25: a turn at its limit shows its ask (the limit and the spend); Approve runs it on
    to twice the limit."""

    @tool
    async def step(n: int) -> int:
        """One more step."""
        return n

    agent = Agent("desk", "", [step], model=Endless(),
                  limits=Limits(model_calls=2, on_exceed="ask"))
    async with console([agent]) as c:
        page = await c.page(await c.context(), "ann", "#/s/desk/s1")
        await name_me(page, "ann")
        await ask(page, "work")
        request = page.locator("[data-role=input]")
        await expect(request).to_contain_text("model_calls limit (2)")
        await expect(request).to_contain_text("2 model calls")
        await shot(page, "30-limit-ask")
        await request.get_by_role("button", name="Approve").click()
        await expect(page.locator("[data-role=input]").nth(1)).to_contain_text(
            "model_calls limit (4)")
        s = c.rt.session("desk", "s1")
        pending = await s.pending()
        assert pending is not None and pending.id == "limit:2"
    assert c.errors == []


async def test_a_compaction_shows_where_it_happened_and_its_summary_reads() -> None:
    """F23: the transcript marks where the session was compacted (tokens before and after);
    opening the mark shows the summary later model calls are sent; the timeline has the
    compaction's row, with Fork from here."""
    agent = dataclasses.replace(reader(), model=Pages())
    async with console([agent]) as c:
        s = c.rt.session("reader", "s1")
        for i in range(8):
            assert (await s.turn(f"read {i}")).status == "completed"
        events = [e.to_dict() for e in await s.events() if e.type == "context.compacted"]
        summarised = [e for e in events if e["summarised"]]
        assert summarised
        page = await c.page(await c.context(), "ann", "#/s/reader/s1")
        marks = page.locator("[data-role=compaction]")
        await expect(marks).to_have_count(len(events))
        last = marks.nth(events.index(summarised[-1]))
        e = summarised[-1]
        await expect(last.locator("summary")).to_have_text(
            f"context compacted {e['tokens_before']} → {e['tokens_after']} tokens · "
            f"messages before #{e['covered']} summarised")
        await expect(last.locator("pre.summary")).to_be_hidden()
        await last.locator("summary").click()
        await expect(last.locator("pre.summary")).to_have_text(e["summary"])
        await shot(page, "31-compaction")
        await page.click("#tab-timeline")
        row = page.locator(f"tr[data-kind=compact][data-step='{e['step']}']")
        await expect(row).to_contain_text(
            f"compaction: {e['tokens_before']} → {e['tokens_after']} tokens")
        await expect(row.locator("[data-role=fork]")).to_have_count(1)
        await shot(page, "32-compaction-timeline")
    assert c.errors == []
