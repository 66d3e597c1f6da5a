"""The web console (F12) in Chromium shows a remote call in doubt (F26) and how it was
settled: a real child process (``tests/indoubtkit.py``) is SIGKILLed after an
``in_doubt="ask"`` call's remote effect, a new one recovers the turn (it parks asking), and
the session's page marks the call's row; once a person answered no (another process), the
page says it was not run again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from playwright.async_api import expect

from durable_turns import Agent, SqliteStore, scripted
from indoubtkit import AGENT, SESSION, build_tools, crash, deliver
from test_console import CHROMIUM, console, shot

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium (.ci/run installs it)")


async def shown(work: Path, text: str, picture: str) -> None:
    """The session's page, served over the store ``work`` holds, marks call c1 with ``text``."""
    agent = Agent(AGENT, "You charge.", build_tools(work, ("", "")), model=scripted([]))
    async with console([agent], SqliteStore(work / "store.sqlite")) as c:
        ctx = await c.context()
        page = await c.page(ctx, "ann", f"#/s/{AGENT}/{SESSION}")
        row = page.locator("[data-role=tool][data-call=c1]").last
        await expect(row.locator("[data-role=in-doubt]")).to_have_text(text)
        await shot(page, picture)
    assert c.errors == []


async def test_the_session_page_shows_a_call_in_doubt_and_how_it_was_settled(
        tmp_path: Path) -> None:
    await asyncio.to_thread(crash, tmp_path, "a", "effect:c1", "--tools", "ask")
    parked = await asyncio.to_thread(deliver, tmp_path, "b", "--recover", "--tools", "ask")
    assert parked["status"] == "suspended"
    await shown(tmp_path, "in doubt (attempt 1): may have run; asking", "31-in-doubt-asking")
    done = await asyncio.to_thread(deliver, tmp_path, "c", "--answer", "no", "--tools", "ask")
    assert done["status"] == "completed"
    await shown(tmp_path, "in doubt (attempt 1): not run again", "32-in-doubt-settled")
