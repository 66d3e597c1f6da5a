"""Take the web console's screenshots that the documentation shows (docs/images/console-*.png).

Run from a checkout, with the ``dev`` extra and Debian's chromium::

    .venv/bin/python docs_build/screenshots.py

It serves ``examples/ops`` as a user would (``durable-turns serve``, on a SQLite file in a
temporary folder), has ann order two things and ask for a refund (which parks for her
approval), then opens the console in Chromium and saves the pages the guide shows: the
sessions, the session with its transcript and its question, its timeline, and the inbox.
Run it again when the console changes; the tests do not (the pictures are for reading).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from playwright.async_api import Page, async_playwright, expect

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
CHROMIUM = "/usr/bin/chromium"
WAIT = 30.0
"""The bound on every wait, in seconds."""


async def serve(db: Path) -> tuple[subprocess.Popen[str], str]:
    """``durable-turns serve examples/ops`` on a free port; returns it and the console's URL."""
    with socket.socket() as sock:  # a free port (serve takes 1 to 65535, not 0)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_turns.cli", "serve", str(ROOT / "examples" / "ops"),
         "--db", str(db), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    stdout = proc.stdout

    def console_url() -> str:
        for line in stdout:  # serve prints the console's URL once it listens
            m = re.match(r"console: (http://\S+)/", line)
            if m:
                return m.group(1)
        raise RuntimeError(f"durable-turns serve exited {proc.wait()} before it listened")

    return proc, await asyncio.wait_for(asyncio.to_thread(console_url), WAIT)


async def shot(page: Page, name: str, *, full: bool = False, height: int | None = None) -> None:
    """Save the page (the whole page with ``full``, its top ``height`` pixels with ``height``)."""
    path = str(IMAGES / f"console-{name}.png")
    if height:
        await page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1100, "height": height})
    else:
        await page.screenshot(path=path, full_page=full)
    print("wrote", IMAGES / f"console-{name}.png")


async def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = await serve(Path(tmp) / "ops.db")
        try:
            async with httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
                chat = "/agents/ops/sessions/new-hire/chat"
                for text in ("order a keyboard and a mouse", "list orders",
                             "refund order 42, $30"):
                    answer = await client.post(chat, json={"text": text, "by": "ann"})
                    answer.raise_for_status()
                await client.post("/agents/ops/sessions/desk/chat",
                                  json={"text": "list orders", "by": "bob"})
            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM)
                page = await browser.new_page(viewport={"width": 1100, "height": 760})
                await page.goto(f"{url}/#/")
                await page.fill("#me", "ann")
                await page.press("#me", "Tab")
                await expect(page.locator("tr[data-session=new-hire]")).to_be_visible()
                await shot(page, "sessions", height=400)
                await page.goto(f"{url}/#/s/ops/new-hire")
                await expect(page.locator("[data-role=input]")).to_contain_text("Refund")
                await shot(page, "session", full=True)
                await page.click("#tab-timeline")
                await page.wait_for_load_state("networkidle")
                await shot(page, "timeline")
                await page.click("#nav-inbox")
                await expect(page.locator(".card.request[data-session=new-hire]")).to_be_visible()
                await shot(page, "inbox", height=320)
                await browser.close()
        finally:
            proc.terminate()
            proc.wait(WAIT)


if __name__ == "__main__":
    asyncio.run(main())
