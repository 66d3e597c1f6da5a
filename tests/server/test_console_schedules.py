"""F24 in the web console (Chromium): the schedules page lists each agent's schedules with
their next fire times and the turns they started, each a link to its session."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect

from durable_turns import Agent
from durable_turns.schedules import fire_turn_id
from durable_turns.testing import TestModel
from test_console import CHROMIUM, WAIT, console, shot

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium (.ci/run installs it)")


async def test_the_schedules_page_lists_next_fires_and_turns(tmp_path: Path) -> None:
    async with console([Agent("desk", "You help.", model=TestModel())]) as c:
        now = c.rt.clock.now().replace(microsecond=0)
        # Due now: the new schedule has the runtime's clock loop look, and fire it.
        looks = c.rt.clock_loop.looks
        await c.rt.schedule("hello", agent="desk", seed="Say hello", at=now)
        await c.rt.clock_loop.looked(looks)
        hourly = await c.rt.schedule("hourly", agent="desk", seed="Check", every=3600)
        turn = fire_turn_id("hello", now)
        await c.rt.wait(c.rt.key("desk", "schedule:hello"), turn, timeout=WAIT)
        ctx = await c.context()
        page = await c.page(ctx, "ann", "#/schedules")
        hello = page.locator("tr[data-schedule=hello]")
        await expect(hello.locator("[data-role=turns] a")).to_have_text(turn)
        await expect(hello.locator("[data-role=next-fire]")).to_have_text("—")
        next_fire = page.locator("tr[data-schedule=hourly] [data-role=next-fire]")
        assert hourly.next_fire is not None
        await expect(next_fire).not_to_have_text("—")
        shown = await page.evaluate("iso => new Date(iso).toLocaleString()",
                                    hourly.next_fire.isoformat())
        await expect(next_fire).to_have_text(shown)
        await expect(page.locator("tr[data-schedule=hourly] [data-role=turns]")
                     ).to_have_text("none yet")
        await shot(page, "30-schedules")
        await hello.locator("[data-role=turns] a").click()
        await expect(page).to_have_url(f"{c.url}/#/s/desk/schedule%3Ahello")
    assert c.errors == []

