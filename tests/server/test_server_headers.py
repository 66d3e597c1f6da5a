"""F18: Every response of the HTTP host carries its security headers (``server/headers.py``), and
in Chromium: no page may frame the console (clickjacking), and the console itself runs
under its Content-Security-Policy without a violation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from durable_turns import Agent, MemoryStore, ModelReply, Runtime, ToolCall, scripted, tool
from durable_turns.channels.slack import slack_channel
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app
from durable_turns.server.headers import SECURITY_HEADERS
from fakes.serving import serving

CHROMIUM = Path("/usr/bin/chromium")
WAIT = 30.0
"""The bound on every wait of these tests."""


@tool
async def look(q: str) -> dict[str, Any]:
    """Look something up."""
    return {"found": q}


def reply(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("Looking.", [ToolCall("c1", "look", {"q": "x"})])
    return ModelReply("Found it.")


def signed_in(request: Request) -> dict[str, str] | None:
    return {"id": "alice"} if request.cookies.get("session") == "s3cret" else None


def runtime() -> Runtime:
    return Runtime([Agent("desk", "You help.", [look])], MemoryStore(), scripted(reply))


async def test_every_kind_of_response_carries_the_headers() -> None:
    rt = runtime()
    slack = slack_channel(signing_secret="s", bot_token="xoxb-t",
                          base_url="http://127.0.0.1:9/api/")
    async with rt, serving(create_app(rt, signed_in, channels=[slack])) as url, \
            httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
        responses = [await c.get("/"), await c.get("/agents")]           # 401s
        c.cookies.set("session", "s3cret")
        responses += [
            await c.get("/"), await c.get("/console/app.js"), await c.get("/console/app.css"),
            await c.get("/agents"), await c.get("/openapi.json"),
            await c.post("/agents/desk/sessions/s1/chat", json={"text": "hi"}),
            await c.get("/agents/desk/sessions/s1/timeline"),
            await c.get("/agents/desk/sessions/s1/turn"),                  # 405
            await c.get("/nowhere"),                                       # 404
            await c.post("/agents/desk/sessions/s1/chat", content=b"x"),   # 415
            await c.post("/slack/events", content=b"{}"),                  # the channel's 401
        ]
        async with c.stream("GET", "/agents/desk/sessions/s1/events",
                            params={"after": "0", "until": "turn"}) as stream:
            await stream.aread()
            responses.append(stream)
        async with c.stream("POST", "/agents/desk/sessions/s1/turn",
                            json={"text": "again"}) as stream:
            await stream.aread()
            responses.append(stream)
    for r in responses:
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get_list(name) == [value], (r.request.url, name, r.headers)
    assert "frame-ancestors 'none'" in SECURITY_HEADERS["Content-Security-Policy"]


def framing(target: str) -> Starlette:
    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(f"<h1>Win a prize</h1><iframe id=f src='{target}'></iframe>")

    return Starlette(routes=[Route("/", page)])


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (.ci/run installs it)")
async def test_no_page_may_frame_the_console_and_the_console_runs_under_its_policy() -> None:
    from playwright.async_api import ConsoleMessage, async_playwright, expect

    rt = runtime()
    asked: list[str] = []
    async with rt, serving(create_app(rt, signed_in)) as url, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM))
        try:
            ctx = await browser.new_context()
            await ctx.add_cookies([{"name": "session", "value": "s3cret", "url": url,
                                    "sameSite": "Lax"}])
            ctx.on("request", lambda r: asked.append(r.url))
            errors: list[str] = []
            refused = asyncio.Event()  # the browser said it refused to frame the console
            page = await ctx.new_page()

            def logged(message: ConsoleMessage) -> None:
                if message.type == "error":
                    errors.append(message.text)
                    if "frame-ancestors" in message.text:
                        refused.set()

            page.on("console", logged)
            # Another port of the same site (its cookie is sent): the console is not shown.
            async with serving(framing(f"{url}/#/inbox")) as evil:
                async with page.expect_response(lambda r: r.url.startswith(url)) as framed:
                    await page.goto(evil)
                assert (await framed.value).status == 200  # the page came, and was refused
                await expect(page.locator("h1")).to_have_text("Win a prize")
                frame = next(f for f in page.frames if f is not page.main_frame)
                assert await frame.locator("#view").count() == 0
                await asyncio.wait_for(refused.wait(), WAIT)
                assert not any(u.endswith("/console/app.js") for u in asked)
            # The console itself, under its policy: a turn and its timeline's bars.
            errors.clear()
            await page.goto(f"{url}/#/s/desk/s1")
            await page.fill("#ask", "look it up")
            await page.click("form.ask button[type=submit]")
            await expect(page.locator(".msg.assistant").last).to_contain_text("Found it.")
            await page.click("#tab-timeline")
            bar = page.locator(".bar").first
            await expect(bar).to_be_visible()
            assert (await bar.evaluate("b => b.style.width")).endswith("%")
            assert errors == []
        finally:
            await browser.close()
        await asyncio.wait_for(rt.idle(), WAIT)

