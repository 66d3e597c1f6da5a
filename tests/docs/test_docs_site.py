"""F12: The documentation site: ``mkdocs build --strict``, then the built folder in a real browser.

The site is built once for the module into a temporary folder, with ``--strict`` (a broken
link, a missing anchor, a reference mkdocstrings cannot resolve: each fails the build). The
built folder is then opened from ``file://`` in Debian's chromium (Playwright), with no server
and no network, as a reader of a clone would: the home page and its diagram render,
navigation reaches every guide, search finds what people look for, and the reference lists
``AgentSession``'s methods. Any error in the browser's console fails the test.

Issue 37: the site is also built as a fresh clone builds it with the README's commands only
(the repository's files, no ``npm ci``): searched from ``file://`` and over http, with no
network and no console error, its diagrams shown as their source.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import pytest
from playwright.async_api import ConsoleMessage, Error, Page, async_playwright, expect

from durable_turns import AgentSession

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
MERMAID = ROOT / "docs_build" / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
WAIT = 30.0
"""The bound on every wait of these tests, in seconds."""
BUILD_TIMEOUT = 300

HAVE_MKDOCS = all(importlib.util.find_spec(name) is not None
                  for name in ("mkdocs", "material", "mkdocstrings"))
pytestmark = pytest.mark.skipif(not HAVE_MKDOCS,
                                reason="needs the docs extra: pip install -e '.[docs]'")
expect.set_options(timeout=WAIT * 1000)

GUIDES = sorted(p.stem for p in (ROOT / "docs" / "guides").glob("*.md"))
"""Every guide page: each must be in the site's navigation."""


def build(root: Path, out: Path) -> None:
    """``mkdocs build --strict`` of the project at ``root`` into ``out``, with no warning."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=root, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert "WARNING" not in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The site, built with ``mkdocs build --strict`` into a folder of the test's own."""
    out = tmp_path_factory.mktemp("site")
    build(ROOT, out)
    yield out


@pytest.fixture(scope="module")
def fresh_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The site as a fresh clone builds it with the README's commands: no ``npm ci``.

    The clone is the repository's files (tracked, or new and not ignored), copied without
    ``docs_build/node_modules`` (which git ignores), and built as the README says.
    """
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know the repository's files")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True, timeout=WAIT)
    clone = tmp_path_factory.mktemp("clone")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a file deleted but not yet committed is listed too
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, clone / name)
    assert not (clone / "docs_build" / "node_modules").exists()
    out = tmp_path_factory.mktemp("fresh-site")
    build(clone, out)
    yield out


def test_the_site_builds_strict_with_every_page_in_it(site: Path) -> None:
    pages = [p for p in (ROOT / "docs").rglob("*.md")]
    assert len(pages) >= 40
    for page in pages:
        built = site / page.relative_to(ROOT / "docs").with_suffix(".html")
        assert built.is_file(), f"{page} was not built"
    # issues 28 and 29 move their README sections into these pages, in the navigation
    assert {"temporal", "frontends"} <= set(GUIDES)


def test_the_reference_documents_every_public_name(site: Path) -> None:
    import durable_turns

    html = (site / "reference" / "durable_turns.html").read_text()
    # durable_turns.replay is also a module's name: its function is shown as the module's
    ids = {name: f"durable_turns.{name}" for name in durable_turns.__all__}
    ids["replay"] = "durable_turns.replay.replay"
    missing = [name for name, id_ in ids.items() if name != "AgentSession"
               and f'id="{id_}"' not in html]
    assert missing == [], f"the reference of durable_turns lacks {missing}"
    for module in ("stores", "models", "channels", "server", "testing", "errors"):
        assert (site / "reference" / f"{module}.html").is_file()
    for page in (site / "reference").glob("*.html"):  # docs_build/griffe_roles.py at work
        roles = re.findall(r":(?:class|meth|func|attr|exc|mod):`", page.read_text())
        assert roles == [], f"{page.name} shows Sphinx roles as written"
    assert re.search(r":(class|meth|func):`", (ROOT / "src" / "durable_turns" / "sessions.py")
                     .read_text()), "the docstrings use no role: this check checks nothing"



ITEM = re.compile(r"^ *(?:[-*+]|\d+\.) ")


def test_every_list_item_of_a_page_is_one_in_the_site(site: Path) -> None:
    """The pages are Markdown as GitHub reads it (two-space indents, a list right after a
    paragraph); the site must read them alike (docs_build/hooks.py), not run items together."""
    for page in sorted((ROOT / "docs").rglob("*.md")):
        if "reference" in page.parts:
            continue  # generated from docstrings
        items, fenced = 0, False
        for line in page.read_text().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and ITEM.match(line):
                items += 1
        html = (site / page.relative_to(ROOT / "docs").with_suffix(".html")).read_text()
        article = html[html.index("<article"):html.index("</article>")]
        assert article.count("<li") == items, f"{page.name}: {items} items, " \
            f"{article.count('<li')} in the site"


def public_methods() -> list[str]:
    return [name for name, member in inspect.getmembers(AgentSession)
            if not name.startswith("_") and callable(member)]


# -- in the browser --------------------------------------------------------------------------

browser_only = pytest.mark.skipif(not CHROMIUM.exists(),
                                  reason="needs Debian's chromium (.ci/run installs it)")


Over = Literal["file", "http"]


class Quiet(SimpleHTTPRequestHandler):
    """``python -m http.server``'s handler, without a line on stderr per request."""

    def log_message(self, format: str, *args: object) -> None:
        """Log nothing."""


@contextmanager
def served(folder: Path) -> Iterator[str]:
    """The folder over http on 127.0.0.1 (a plain static server, as ``python -m http.server``)."""
    handler = partial(Quiet, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT)


@contextmanager
def nullserver(site: Path) -> Iterator[str]:
    """The folder's own ``file://`` address (no server)."""
    yield site.as_uri() + "/"


ELSEWHERE = re.compile(r"^https?://(?!127\.0\.0\.1[:/])")
"""Any address but the test's own server: the browser may reach none of them."""


@asynccontextmanager
async def reading(site: Path, over: Over = "file") -> AsyncIterator[Page]:
    """A Chromium page on the built site, from ``file://`` or over http; fails on any console
    error. The browser has no network: a script fetched from anywhere else fails."""
    errors: list[str] = []

    def logged(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    def uncaught(error: Error) -> None:
        errors.append(f"uncaught {error}")

    with served(site) if over == "http" else nullserver(site) as base:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=str(CHROMIUM))
            try:
                page = await browser.new_page(viewport={"width": 1400, "height": 900})
                page.on("console", logged)
                page.on("pageerror", uncaught)
                await page.route(ELSEWHERE, lambda route: route.abort())
                await page.goto(base + "index.html")
                yield page
            finally:
                await browser.close()
    assert errors == []


async def found(page: Page, query: str) -> list[str]:
    """What the search box finds for ``query``: the results' links."""
    # Typed key by key, as a reader does: Material searches on a key, and on the query
    # typed so far once its index is loaded (it says "Initializing search" until then).
    box = page.locator("input.md-search__input")
    await box.click()
    await box.press_sequentially(query)
    results = page.locator(".md-search-result__item a")
    await expect(results.first).to_be_visible()
    hrefs: list[str] = await results.evaluate_all("links => links.map(a => a.href)")
    return hrefs


async def drawn(page: Page) -> None:
    """The page's Mermaid diagrams are drawn (with the site's own Mermaid, offline)."""
    # Material draws each in a closed shadow root, in place of the fenced source.
    await expect(page.locator("article pre.mermaid")).to_have_count(0)
    for diagram in await page.locator("article div.mermaid").all():
        box = await diagram.bounding_box()
        assert box is not None and box["height"] > 100, box


@browser_only
async def test_the_home_page_renders_with_its_diagram(site: Path) -> None:
    async with reading(site) as page:
        await expect(page.locator("article h1").first).to_have_text(re.compile("^durable_turns"))
        await expect(page.locator("article table").first).to_contain_text("exactly once")
        if MERMAID.is_file():  # the site's own Mermaid, as .ci/run installs it
            await drawn(page)
            assert await page.locator("article div.mermaid").count() == 1


@browser_only
async def test_the_pictures_show(site: Path) -> None:
    """The console's screenshots load, and the spine's diagram is drawn."""
    async with reading(site) as page:
        await page.goto((site / "guides" / "console.html").as_uri())
        images = page.locator("article img")
        assert await images.count() >= 4
        for image in await images.all():
            await image.scroll_into_view_if_needed()
            assert await image.evaluate("i => i.complete && i.naturalWidth > 0"), \
                await image.get_attribute("src")
        if MERMAID.is_file():
            await page.goto((site / "concepts" / "architecture.html").as_uri())
            await drawn(page)


@browser_only
async def test_navigation_reaches_every_guide(site: Path) -> None:
    async with reading(site) as page:
        home = page.url
        for guide in GUIDES:  # from the home page, a click in the menu opens each guide
            await page.goto(home)
            await page.locator(f'nav.md-nav--primary a[href="guides/{guide}.html"]').click()
            await page.wait_for_url(f"**/guides/{guide}.html", timeout=WAIT * 1000)
            await expect(page.locator("article h1").first).not_to_be_empty()


@browser_only
@pytest.mark.parametrize("over", ["file", "http"])
@pytest.mark.parametrize(("query", "page_found"), [("approval", "guides/approvals.html"),
                                                   ("PostgreSQL", "guides/postgres.html")])
async def test_search_finds_it_offline(site: Path, query: str, page_found: str,
                                       over: Over) -> None:
    async with reading(site, over) as page:
        hrefs = await found(page, query)
        # a result's link is the page, with ?h=<query> (to highlight it) and maybe an anchor
        assert any(urlsplit(href).path.endswith(page_found) for href in hrefs), hrefs


@browser_only
@pytest.mark.parametrize("over", ["file", "http"])
async def test_a_fresh_clone_s_site_is_searchable_offline(fresh_site: Path, over: Over) -> None:
    """Issue 37: built with the README's commands only (no npm), the site fetches nothing:
    search works from file:// and over http, and a diagram is shown as its source."""
    pages = [p.read_text() for p in fresh_site.rglob("*.html")]
    assert not any("unpkg.com" in html or "js/mermaid.min.js" in html for html in pages)
    async with reading(fresh_site, over) as page:
        hrefs = await found(page, "approval")
        assert any(urlsplit(href).path.endswith("guides/approvals.html") for href in hrefs), hrefs
        await page.goto(page.url.split("index.html")[0] + "concepts/architecture.html")
        await expect(page.locator("article pre code").filter(has_text="flowchart").first) \
            .to_be_visible()
        hrefs = await found(page, "PostgreSQL")
        assert any(urlsplit(href).path.endswith("guides/postgres.html") for href in hrefs), hrefs


@browser_only
async def test_the_reference_of_agent_session_lists_its_methods(site: Path) -> None:
    methods = public_methods()
    assert {"start", "turn", "result", "resume", "cancel", "reset"} <= set(methods)
    async with reading(site) as page:
        await page.goto((site / "reference" / "session.html").as_uri())
        await expect(page.locator("article h1").first).to_have_text(re.compile("^AgentSession"))
        for name in methods:
            heading = page.locator(f'[id="durable_turns.sessions.AgentSession.{name}"]')
            await expect(heading).to_be_attached()
            await expect(heading).to_contain_text(name)
