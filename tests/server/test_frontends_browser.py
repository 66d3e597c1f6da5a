"""F19: The React page of the docs' "Frontend protocols" (``useChat`` with ``resume: true``) in a
real browser: the snippet is bundled with esbuild (from ``tests/js``'s packages), served by
the app beside the API, and driven in Debian's chromium by Playwright. A chat with a tool
call, an approval clicked, and a page reloaded in the middle of a turn that comes back whole.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright, expect
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from fakes.serving import serving
from frontends_app import build

CHROMIUM = Path("/usr/bin/chromium")
JS = Path(__file__).parents[1] / "js"
PAGE_DOC = Path(__file__).parents[2] / "docs" / "guides" / "frontends.md"
"""The docs page whose React component (its ``tsx`` block) this test bundles."""
WAIT = 30.0
"""The bound on every wait of these tests, in seconds."""
ENTRY = """
import { createRoot } from "react-dom/client";
import { Chat } from "./chat";

const chatId = new URLSearchParams(location.search).get("chat") ?? "page";
createRoot(document.getElementById("root")!).render(<Chat chatId={chatId} by="ann" />);
"""
PAGE = '<!doctype html><div id="root"></div><script type="module" src="/page.js"></script>'

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium (.ci/run installs it)")
expect.set_options(timeout=WAIT * 1000)


def readme_page() -> str:
    """The docs page's React component (its ``tsx`` block)."""
    text = PAGE_DOC.read_text()
    start = text.index("```tsx\n") + len("```tsx\n")
    return text[start:text.index("\n```", start)]


async def bundle(tmp_path: Path) -> bytes:
    """The docs page's component and a root that renders it, bundled for the browser."""
    if not (JS / "node_modules" / "esbuild").is_dir():
        pytest.fail("the frontend tests need tests/js's packages: cd tests/js && npm ci")
    (tmp_path / "chat.tsx").write_text(readme_page())
    (tmp_path / "main.tsx").write_text(ENTRY)
    out = tmp_path / "page.js"
    proc = await asyncio.create_subprocess_exec(
        str(JS / "node_modules" / ".bin" / "esbuild"), str(tmp_path / "main.tsx"), "--bundle",
        "--format=esm", "--jsx=automatic", "--define:process.env.NODE_ENV=\"production\"",
        f"--outfile={out}", env={**os.environ, "NODE_PATH": str(JS / "node_modules")},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    said, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, said.decode()
    return out.read_bytes()


async def test_the_readme_s_use_chat_page_streams_approves_and_resumes_after_a_reload(
        tmp_path: Path) -> None:
    script = await bundle(tmp_path)
    gate = tmp_path / "gate"
    rt, app = build(gate, name="ops", development=True)

    async def page_html(_request: Request) -> Response:
        return HTMLResponse(PAGE)

    async def page_js(_request: Request) -> Response:
        return Response(script, media_type="text/javascript")

    app.router.routes[0:0] = [Route("/page", page_html), Route("/page.js", page_js)]
    async with rt, serving(app) as url, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM))
        try:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await chat(page, url, "page-weather", "what is the weather?")
            await expect(page.get_by_text("It is 21 degrees in Paris.")).to_be_visible()
            await expect(page.get_by_text("tool-lookup output-available")).to_be_visible()

            await chat(page, url, "page-refund", "refund order A-12")
            await expect(page.get_by_text("Refund order A-12?")).to_be_visible()
            # A page reloaded while the turn waits shows the request again, and answers it.
            await page.reload()
            await expect(page.get_by_text("Refund order A-12?")).to_be_visible()
            await page.get_by_role("button", name="Yes").click()
            await expect(page.get_by_text("Done: refunded A-12.")).to_be_visible()

            await chat(page, url, "page-gated", "gated count")
            await expect(page.get_by_text("One, ", exact=False)).to_be_visible()
            await page.reload()  # mid-turn: useChat({resume: true}) asks for the stream
            # Its answer came (the chat is busy with it): the model may go on now. Until its
            # reply is stored, the step's text is held back: the new page shows none of it.
            await expect(page.get_by_role("textbox")).to_be_disabled()
            gate.write_text("open")
            await expect(page.get_by_text("One, two, three, four.", exact=True)).to_be_visible()
            texts = await page.locator("p").all_inner_texts()
            assert texts == ["One, two, three, four."], texts  # whole, once
            assert errors == []
        finally:
            await browser.close()
            await asyncio.wait_for(rt.idle(), WAIT)


async def chat(page: Page, url: str, chat_id: str, text: str) -> None:
    """Open the page on ``chat_id`` and send ``text``."""
    await page.goto(f"{url}/page?chat={chat_id}")
    box = page.get_by_role("textbox")
    await expect(box).to_be_enabled()
    await box.fill(text)
    await box.press("Enter")
