"""The web console (F12) in a real browser: Debian's chromium driven by Playwright.

The app runs under uvicorn on loopback in the test's own event loop (so the models and tools
below can wait on the test's ``asyncio`` events); the browser talks to it over HTTP like any
user's. Every test saves screenshots under ``tests/artifacts/console/`` and fails on any error
in the browser's console log or any uncaught script error, and every URL the page asked for
must be a public route of ``/openapi.json`` (or one of the console's own files).
"""

from __future__ import annotations

import asyncio
import re
import socket
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
from playwright.async_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Error,
    Page,
    Request,
    async_playwright,
    expect,
)

from confirm_pair import confirm_pair
from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    SqliteStore,
    Stop,
    TextDelta,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns._demo.brain import ops_model
from durable_turns._demo.refunds import ensure_refunds_schema, read_refunds, refund_tool
from durable_turns.clock import Clock, ManualClock
from durable_turns.models import ModelEvent, ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app
from durable_turns.stores import SessionStore
from fakes.serving import serving

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
WAIT = 30.0
"""The bound on every wait of these tests, in seconds."""

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium (.ci/run installs it)")
expect.set_options(timeout=WAIT * 1000)


# -- the agents ------------------------------------------------------------------------------

@dataclass
class Gates:
    """What the test holds the turn on: the ``lookup`` tool, and the last reply's end."""

    tool: asyncio.Event = field(default_factory=asyncio.Event)
    answer: asyncio.Event = field(default_factory=asyncio.Event)


class GatedModel:
    """A model whose second reply streams half its text, then waits for ``gates.answer``.

    First reply: "Looking it up." with two calls, ``lookup`` (waits for ``gates.tool``) and
    ``broken`` (raises). Second: "The answer " … "is 42." with a thinking block.
    """

    def __init__(self, gates: Gates) -> None:
        self.gates = gates

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if calls_this_turn(request) == 0:
            yield TextDelta("Looking it up.")
            yield ToolCall("c1", "lookup", {"q": "the answer"})
            yield ToolCall("c2", "broken", {})
            yield Stop("tool_use", {"input_tokens": 10, "output_tokens": 4})
            return
        yield TextDelta("The answer ")
        await asyncio.wait_for(self.gates.answer.wait(), WAIT)
        yield TextDelta("is 42.")
        yield Stop("end_turn", {"input_tokens": 30, "output_tokens": 6},
                   ({"type": "thinking", "thinking": "The index said 42.", "signature": "s"},))


def desk(gates: Gates) -> Agent:
    @tool
    async def lookup(q: str) -> dict[str, Any]:
        """Look ``q`` up (waits for the test)."""
        await asyncio.wait_for(gates.tool.wait(), WAIT)
        return {"found": 42}

    @tool
    def broken() -> dict[str, Any]:
        """Always fails."""
        raise ValueError("the index is down")

    return Agent("desk", "You help.", [lookup, broken], model=GatedModel(gates))


def ops(db: Path) -> Agent:
    """The demo's refund agent: ``issue_refund`` parks for a person's approval."""
    with closing(sqlite3.connect(db)) as conn, conn:
        ensure_refunds_schema(conn)
    return Agent("ops", "You refund orders.", [refund_tool(db)], model=ops_model())


def refunds(db: Path) -> list[tuple[str, int]]:
    with closing(sqlite3.connect(db)) as conn:
        return [(r.order_id, r.attempts) for r in read_refunds(conn)]


# -- the browser -----------------------------------------------------------------------------

@dataclass
class Console:
    url: str
    rt: Runtime
    browser: Browser
    errors: list[str] = field(default_factory=list)
    """Errors in the browser's console log and uncaught script errors, with the page's name."""
    paths: list[str] = field(default_factory=list)
    """Every path (and query) the pages asked the server for."""

    async def context(self, **options: Any) -> BrowserContext:
        ctx = await self.browser.new_context(**options)
        def asked(request: Request) -> None:
            url = urlsplit(request.url)
            self.paths.append(url.path + (f"?{url.query}" if url.query else ""))

        ctx.on("request", asked)
        return ctx

    async def asked(self, part: str, count: int) -> list[str]:
        """The paths with ``part`` in them, once the pages asked for ``count`` of them (the
        page renders what it read before its EventSource's request goes out)."""
        async def enough() -> list[str]:
            while len(found := [p for p in self.paths if part in p]) < count:
                await asyncio.sleep(0.02)
            return found
        return await asyncio.wait_for(enough(), WAIT)

    async def page(self, ctx: BrowserContext, name: str, hash_: str = "#/") -> Page:
        page = await ctx.new_page()

        def logged(message: ConsoleMessage) -> None:
            if message.type == "error":
                self.errors.append(f"{name}: {message.text}")

        def uncaught(error: Error) -> None:
            self.errors.append(f"{name}: uncaught {error}")

        page.on("console", logged)
        page.on("pageerror", uncaught)
        await page.goto(f"{self.url}/{hash_}")
        return page


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@asynccontextmanager
async def console(agents: list[Agent], store: SessionStore | None = None,
                  authenticate: Any = None, clock: Clock | None = None,
                  **options: Any) -> AsyncIterator[Console]:
    """The agents served (``create_app(…, **options)``) to a Chromium of the test's own."""
    rt = Runtime(agents, store or MemoryStore(), clock=clock)
    async with rt, serving(create_app(rt, authenticate, **options)) as url, \
            async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM))
        c = Console(url, rt, browser)
        try:
            yield c
            await check_public(c)
        finally:
            await browser.close()
            await asyncio.wait_for(rt.idle(), WAIT)


async def check_public(c: Console) -> None:
    """Every request the console made is a route of /openapi.json, or one of its files."""
    headers = {"Authorization": "Bearer t0k"}
    async with httpx.AsyncClient(base_url=c.url, timeout=WAIT, headers=headers) as client:
        spec = (await client.get("/openapi.json")).json()
    routes = [re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", p) + "$") for p in spec["paths"]]
    files = {f"/console/{name}" for name in ("kit.js", "timetravel.js", "schedules.js", "app.js",
                                               "app.css")}
    private = [p for p in c.paths
               if p.split("?")[0] not in files and not any(r.match(p.split("?")[0])
                                                            for r in routes)]
    assert private == []


async def name_me(page: Page, name: str) -> None:
    await page.fill("#me", name)
    await page.press("#me", "Tab")  # the change event stores it


async def ask(page: Page, text: str) -> None:
    await page.fill("#ask", text)
    await page.click("form.ask button[type=submit]")


# -- the scenarios ---------------------------------------------------------------------------

async def test_a_turn_from_the_text_box_streams_its_answer_and_its_tool_rows() -> None:
    gates = Gates()
    async with console([desk(gates)]) as c:
        page = await c.page(await c.context(), "desk", "#/s/desk/s1")
        await expect(page.locator("#turns")).to_contain_text("No turn yet")
        await ask(page, "What is the answer?")

        lookup = page.locator("[data-role=tool][data-call=c1]")
        broken = page.locator("[data-role=tool][data-call=c2]")
        await expect(lookup.locator(".badge")).to_have_text("running")
        replies = page.locator(".msg.assistant:not(.streaming)")
        await expect(replies).to_have_count(1)
        await expect(replies).to_contain_text("Looking it up.")
        await shot(page, "1-session-tool-running")

        gates.tool.set()
        await expect(lookup.locator(".badge")).to_have_text("done")
        await expect(broken.locator(".badge")).to_have_text("error")
        # An error is marked red, and open so its message shows.
        await expect(broken).to_have_class(re.compile(r"\berror\b"))
        # Asked with retries: a snapshot may redraw the row between two reads of it.
        await expect(broken).to_have_js_property("open", True)
        await expect(broken.locator(".label")).to_have_css("color", "rgb(179, 38, 30)")
        await expect(broken.locator("pre.result")).to_contain_text("ValueError: the index is down")

        # The second reply streams: half of it shows before the model has finished.
        streaming = page.locator("[data-role=streaming]")
        await expect(streaming).to_contain_text("The answer")
        await shot(page, "2-session-streaming")
        gates.answer.set()
        await expect(page.locator(".turn-end .badge")).to_have_text("completed")
        await expect(streaming).to_have_count(0)
        await expect(replies.last).to_contain_text("The answer is 42.")
        # Thinking is there, collapsed; usage is summed over the turn's model calls.
        thinking = page.locator("details.thinking")
        await expect(thinking).to_have_count(1)
        assert await thinking.evaluate("e => e.open") is False
        await expect(page.locator(".usage")).to_have_text("tokens: input 40 · output 10")
        await lookup.locator("summary").click()
        await expect(lookup.locator("pre").first).to_contain_text('"q": "the answer"')
        await expect(lookup.locator("pre.result")).to_contain_text('"found": 42')
        await shot(page, "3-session-completed")

        await page.click("#tab-timeline")
        rows = page.locator("table.timeline tr.step")
        await expect(rows).to_have_count(4)
        await expect(rows.locator("td:nth-child(2)")).to_have_text(
            ["model", "tool lookup", "tool broken", "model"])
        await expect(rows.locator(".badge")).to_have_text(["done", "done", "error", "done"])
        times = await rows.locator("td:nth-child(4)").all_inner_texts()
        assert all(re.fullmatch(r"\d+ ms|\d+\.\d\d s", t) for t in times), times
        await shot(page, "4-session-timeline")
        # The text box sent an Idempotency-Key: the turn's id is the one the key names.
        (turn,) = [t for t in await c.rt.session("desk", "s1").chain() if t.kind == "turn"]
        assert turn.turn_id.startswith("k-") and "idempotency" in (turn.data or {})
    assert c.errors == []


async def test_a_parked_refund_is_approved_from_the_inbox_without_a_reload(tmp_path: Path
                                                                          ) -> None:
    db = tmp_path / "refunds.db"
    async with console([ops(db)], SqliteStore(tmp_path / "store.db")) as c:
        page = await c.page(await c.context(), "alice", "#/s/ops/r1")
        await name_me(page, "alice")
        await ask(page, "Refund $30 on order 42.")
        request = page.locator("[data-role=input]")
        await expect(request).to_contain_text("Approve a $30 refund on order 42?")
        await expect(request).to_contain_text("Only http:alice may answer.")
        await expect(page.locator("#session-status .badge")).to_have_text("suspended")
        # Another turn cannot start while this one waits: the page says why, in words.
        await ask(page, "Refund $1 on order 7.")
        await expect(page.locator("#session-notice .notice.error")).to_contain_text(
            "The session is waiting for an answer: answer it (here or in the inbox) first.")
        await shot(page, "5-session-parked")

        await page.click("#nav-sessions")
        row = page.locator("tr[data-session=r1]")
        await expect(row.locator(".badge")).to_have_text("suspended")
        await expect(row).to_contain_text("s ago")
        await page.select_option("#status-filter", "idle")
        await expect(page.locator("main")).to_contain_text("No idle session.")
        await page.select_option("#status-filter", "suspended")
        await expect(row).to_have_count(1)
        await shot(page, "6-sessions")

        await page.click("#nav-inbox")
        await expect(page.locator("#inbox-count")).to_have_text("1")
        card = page.locator(".card.request[data-session=r1]")
        await expect(card.locator(".prompt")).to_have_text("Approve a $30 refund on order 42?")
        await expect(card.locator(".answerers")).to_have_text("Only http:alice may answer.")
        await shot(page, "7-inbox")
        loads = await page.evaluate("performance.getEntriesByType('navigation').length")
        await card.get_by_role("button", name="Approve").click()
        await expect(card.locator(".notice.ok")).to_contain_text(
            "the turn completed. Refunded $30 on order 42 (refund #1), as approved.")
        assert await page.evaluate("performance.getEntriesByType('navigation').length") == loads
        await shot(page, "8-inbox-approved")
        assert refunds(db) == [("42", 1)]

        await card.get_by_role("link").click()
        await expect(page.locator(".turn-end .badge")).to_have_text("completed")
        await expect(page.locator("[data-role=input]")).to_contain_text("answered true by alice")
        await page.click("#tab-timeline")
        await expect(page.locator("table.timeline tr.step td:nth-child(2)")).to_have_text(
            ["model", "tool issue_refund", "input: Approve a $30 refund on order 42?",
             "tool ↻ issue_refund", "model"])
        await expect(page.locator("table.timeline .badge")).to_have_text(
            ["done", "parked", "answered", "done", "done"])
        await shot(page, "9-timeline-approved")
    # The refused second turn is the one error the log may show: the 409 itself.
    assert [e for e in c.errors if "status of 409" not in e] == []


async def test_a_second_tab_answering_differently_sees_the_conflict_explained(tmp_path: Path
                                                                             ) -> None:
    db = tmp_path / "refunds.db"
    async with console([ops(db)]) as c:
        async with httpx.AsyncClient(base_url=c.url, timeout=WAIT) as client:
            parked = (await client.post("/agents/ops/sessions/r2/chat", json={
                "text": "Refund $12.50 on order A-7.", "by": "alice"})).json()
        assert parked["status"] == "suspended"
        tabs = []
        for name, who in (("tab-1", "alice"), ("tab-2", "alice"), ("tab-3", "bob")):
            ctx = await c.context()
            await ctx.add_init_script(f"localStorage.setItem('durable_turns.me', '{who}')")
            # The inbox refreshes only when the test says: the clock stands still until then.
            await ctx.clock.install()
            tabs.append(await c.page(ctx, name, "#/inbox"))
        cards = [p.locator(".card.request[data-session=r2]") for p in tabs]
        for card in cards:
            await expect(card.locator(".prompt")).to_have_text(
                "Approve a $12.50 refund on order A-7?")

        await cards[0].get_by_role("button", name="Approve").click()
        await expect(cards[0].locator(".notice.ok")).to_contain_text("the turn completed")
        # Answered: the card's buttons are off, so it cannot be answered again from here.
        for name in ("Approve", "Deny"):
            await expect(cards[0].get_by_role("button", name=name)).to_be_disabled()
        await cards[1].get_by_role("button", name="Deny").click()
        refused = cards[1].locator(".notice.error")
        await expect(refused).to_contain_text("Conflict: input 'approve-refund' of turn")
        # alice's own answer, given in the other tab: said to be hers, not "someone's".
        await expect(refused).to_contain_text("answered already by 'alice' (true), with "
                                              "another answer than this one. You answered it "
                                              "yourself, in another tab or window; your first "
                                              "answer stands.")
        text = await refused.inner_text()
        assert "Traceback" not in text and "Internal" not in text and "Someone" not in text
        for name in ("Approve", "Deny"):
            await expect(cards[1].get_by_role("button", name=name)).to_be_disabled()
        await shot(tabs[1], "10-second-tab-conflict")

        # bob's same answer is not a double click of alice's: refused, and said whose.
        await cards[2].get_by_role("button", name="Approve").click()
        other = cards[2].locator(".notice.error")
        await expect(other).to_contain_text("answered already by 'alice' (true), with the "
                                            "same answer. Someone answered this request "
                                            "first; their answer stands.")
        await expect(cards[2].get_by_role("button", name="Deny")).to_be_disabled()
        await shot(tabs[2], "11-third-tab-someone-else")

        await tabs[1].clock.run_for(6_000)  # the inbox's next refresh: the request is gone
        await expect(cards[1].locator(".gone")).to_have_text(
            "No longer waiting (answered, or reset).")
        await expect(cards[1].locator(".notice.error")).to_contain_text("You answered")
        assert refunds(db) == [("A-7", 1)]  # one answer, one refund, paid once
    # The refused answers are the one error the other tabs' logs may show: the 409 itself.
    assert [e for e in c.errors if not (e.startswith(("tab-2:", "tab-3:"))
                                        and "status of 409" in e)] == []


async def test_a_reload_mid_turn_continues_without_a_duplicate_row() -> None:
    gates = Gates()
    async with console([desk(gates)]) as c:
        page = await c.page(await c.context(), "desk", "#/s/desk/s2")
        await expect(page.locator("#turns")).to_contain_text("No turn yet")
        await ask(page, "What is the answer?")
        await expect(page.locator("[data-call=c1] .badge")).to_have_text("running")

        await page.reload()
        await expect(page.locator("[data-call=c1] .badge")).to_have_text("running")
        follows = await c.asked("/events?after=", 2)
        # The first is opened once the turn has started the session (before, it has no
        # stream); the reload's from its new snapshot: started, reply, two calls requested.
        assert len(follows) == 2 and int(follows[0].rsplit("=", 1)[1]) >= 1
        assert int(follows[1].rsplit("=", 1)[1]) >= 4
        gates.tool.set()
        await expect(page.locator("[data-role=streaming]")).to_contain_text("The answer")
        await shot(page, "12-reloaded-streaming")
        gates.answer.set()
        await expect(page.locator(".turn-end .badge")).to_have_text("completed")
        await expect(page.locator(".msg.user")).to_have_count(1)
        await expect(page.locator("[data-role=tool]")).to_have_count(2)
        replies = page.locator(".msg.assistant")
        await expect(replies).to_have_count(2)
        await expect(replies.first).to_contain_text("Looking it up.")
        await expect(replies.last).to_contain_text("The answer is 42.")
        await shot(page, "13-reloaded-completed")
    assert c.errors == []


async def test_phone_width_reads_without_sideways_scrolling(tmp_path: Path) -> None:
    db = tmp_path / "refunds.db"
    async with console([ops(db)]) as c:
        async with httpx.AsyncClient(base_url=c.url, timeout=WAIT) as client:
            await client.post("/agents/ops/sessions/phone-1/chat", json={
                "text": "Refund $30 on order 42.", "by": "alice"})
        ctx = await c.context(viewport={"width": 375, "height": 740}, is_mobile=True)
        for hash_, name, ready in [("#/", "14-phone-sessions", "tr[data-session=phone-1]"),
                                   ("#/inbox", "15-phone-inbox", ".card.request"),
                                   ("#/s/ops/phone-1", "16-phone-session", "[data-role=input]")]:
            page = await c.page(ctx, name, hash_)
            await expect(page.locator(ready)).to_be_visible()
            await shot(page, name)
            wide = await page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 375, f"{name}: {wide}px wide"
            await page.close()
    assert c.errors == []


def bearer(request: Any) -> dict[str, str] | None:
    ok = request.headers.get("authorization") == "Bearer t0k"
    return {"id": "alice"} if ok else None


async def test_in_production_the_console_is_behind_authenticate(tmp_path: Path) -> None:
    db = tmp_path / "refunds.db"
    async with console([ops(db)], authenticate=bearer) as c:
        async with httpx.AsyncClient(base_url=c.url, timeout=WAIT) as client:
            for path in ("/", "/console/app.js", "/agents", "/agents/ops/sessions/x/timeline"):
                refused = await client.get(path)
                assert refused.status_code == 401, path
                assert refused.json()["error"]["type"] == "Unauthorized"
        ctx = await c.context(extra_http_headers={"Authorization": "Bearer t0k"})
        page = await c.page(ctx, "alice", "#/s/ops/p1")
        await expect(page.locator("#principal")).to_have_text("Signed in as http:alice")
        await expect(page.locator("#who")).to_be_hidden()
        await ask(page, "Refund $5 on order 9.")
        request = page.locator("[data-role=input]")
        await expect(request).to_contain_text("Only http:alice may answer.")
        await request.get_by_role("button", name="Approve").click()
        await expect(page.locator(".turn-end .badge")).to_have_text("completed")
        await expect(page.locator(".msg.assistant").last).to_contain_text("Refunded $5")
        await shot(page, "17-production-approved")
        assert refunds(db) == [("9", 1)]
    assert c.errors == []


async def test_cancel_and_reset_from_the_session_page() -> None:
    gates = Gates()
    async with console([desk(gates)]) as c:
        page = await c.page(await c.context(), "desk", "#/s/desk/s3")
        await expect(page.locator("#turns")).to_contain_text("No turn yet")
        await ask(page, "What is the answer?")
        await expect(page.locator("[data-call=c1] .badge")).to_have_text("running")
        await page.click("#cancel")
        await expect(page.locator("#session-notice")).to_contain_text(
            "Cancelling 1 turn(s); they stop at their next checkpoint.")
        gates.tool.set()  # the running tool finishes; the turn stops at the next checkpoint
        end = page.locator(".turn-end")
        await expect(end.locator(".badge")).to_have_text("cancelled")
        await expect(end).to_contain_text("cancelled from the console")
        await shot(page, "18-cancelled")

        await page.click("#reset")
        await expect(page.locator("#reset")).to_have_text("Confirm reset")
        await page.click("#reset")
        await expect(page.locator("#session-notice")).to_contain_text(
            "Reset: the history is archived as s3#g0.")
        await expect(page.locator("#turns")).to_contain_text("No turn yet")
        await expect(page.locator("#session-status")).to_contain_text("generation 1")
        await shot(page, "19-reset")
    assert c.errors == []


TRANSFER = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "maximum": 100, "title": "Amount"},
        "currency": {"enum": ["EUR", "USD"], "title": "Currency"},
        "urgent": {"type": "boolean", "title": "Urgent"},
        "note": {"type": "string", "title": "Note"},
    },
    "required": ["amount", "currency"],
}


@tool
async def transfer(ctx: ToolContext) -> dict[str, Any]:
    """Move money once a person fills in how much."""
    answer: dict[str, Any] = await ctx.request_input("how-much", "How much, and in what?",
                                                     schema=TRANSFER)
    return {"sent": answer}


def teller() -> Agent:
    def reply(request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("Asking.", [ToolCall("t1", "transfer", {})])
        sent = next(m.result for m in request.messages if m.call_id == "t1")
        return ModelReply(f"Sent {sent['sent']['amount']} {sent['sent']['currency']}.")

    return Agent("teller", "You move money.", [transfer], model=scripted(reply))


async def test_an_input_that_is_not_yes_or_no_gets_a_form_from_its_schema() -> None:
    async with console([teller()]) as c:
        async with httpx.AsyncClient(base_url=c.url, timeout=WAIT) as client:
            await client.post("/agents/teller/sessions/t1/chat", json={"text": "pay bob",
                                                                       "by": "alice"})
        ctx = await c.context()
        await ctx.add_init_script("localStorage.setItem('durable_turns.me', 'alice')")
        page = await c.page(ctx, "inbox", "#/inbox")
        card = page.locator(".card.request[data-session=t1]")
        await expect(card.locator(".prompt")).to_have_text("How much, and in what?")
        await expect(card.locator("label > span")).to_have_text(
            ["Amount *", "Currency *", "Urgent", "Note"])
        await expect(card.get_by_role("button", name="Approve")).to_have_count(0)
        await card.get_by_label("Amount").fill("500")
        await card.get_by_label("Currency").select_option("USD")
        await card.get_by_role("button", name="Answer").click()
        refused = card.locator(".notice.error")
        await expect(refused).to_contain_text("That answer does not fit the request")
        await expect(refused).to_contain_text("100")
        await shot(page, "20-form-refused")

        await card.get_by_label("Amount").fill("50")
        await card.get_by_label("Urgent").check()
        await card.get_by_role("button", name="Answer").click()
        await expect(card.locator(".notice.ok")).to_contain_text("the turn completed. Sent 50 USD.")
        await shot(page, "21-form-answered")
        s = c.rt.session("teller", "t1")
        tool_result = next(m.result for m in await s.transcript() if m.role == "tool")
        assert tool_result == {"sent": {"amount": 50, "currency": "USD", "urgent": True}}
    # The refused answer is the one error the log may show: the 422 itself.
    assert [e for e in c.errors if "status of 422" not in e] == []


@asynccontextmanager
async def listening(app: Any, port: int) -> AsyncIterator[None]:
    """uvicorn serving ``app`` on ``127.0.0.1:port`` (a port the test means to serve again)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=1))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(WAIT):
            while not server.started:  # uvicorn has no event for it: a bounded poll
                if task.done():
                    task.result()
                await asyncio.sleep(0.005)
        yield
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT)
        sock.close()


async def test_a_dropped_connection_resumes_without_a_gap_or_a_duplicate() -> None:
    gates = Gates()
    rt = Runtime([desk(gates)], MemoryStore())
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    cursors: list[str] = []
    inner = create_app(rt)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        # What the browser sent when it (re)opened the event stream, seen by the server.
        if scope["type"] == "http" and scope["path"].endswith("/events"):
            # Where it resumes: the Last-Event-ID it saw, else the cursor in its URL.
            seen = dict(scope["headers"]).get(b"last-event-id", b"").decode()
            cursors.append(seen or scope["query_string"].decode().removeprefix("after="))
        await inner(scope, receive, send)

    async with rt, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM))
        c = Console(f"http://127.0.0.1:{port}", rt, browser)
        try:
            ctx = await c.context()
            async with listening(app, port):
                page = await c.page(ctx, "desk", "#/s/desk/s4")
                await expect(page.locator("#turns")).to_contain_text("No turn yet")
                await ask(page, "What is the answer?")
                await expect(page.locator("[data-call=c1] .badge")).to_have_text("running")
            # The server is gone; the turn goes on without anyone watching, to its end.
            gates.tool.set()
            gates.answer.set()
            await asyncio.wait_for(rt.idle(), WAIT)
            async with listening(app, port):
                # The browser reconnects by itself, telling the server the last event it saw.
                await expect(page.locator(".turn-end .badge")).to_have_text("completed")
                await expect(page.locator(".msg.user")).to_have_count(1)
                await expect(page.locator("[data-role=tool]")).to_have_count(2)
                replies = page.locator(".msg.assistant")
                await expect(replies).to_have_count(2)
                await expect(replies.last).to_contain_text("The answer is 42.")
                await shot(page, "22-reconnected")
                await check_public(c)
        finally:
            await browser.close()
    assert len(cursors) >= 2
    assert any(int(cursor) >= 4 for cursor in cursors[1:]), cursors
    # The server going away cut the event stream, and the browser's attempts to reconnect
    # were refused while it was down: those are the only errors its log may show.
    gone = ("net::ERR_CONNECTION_REFUSED", "net::ERR_INCOMPLETE_CHUNKED_ENCODING")
    assert [e for e in c.errors if not e.endswith(gone)] == []


async def test_two_calls_parked_at_once_are_two_cards_answered_one_by_one() -> None:
    async with console([confirm_pair("pair")]) as c:
        page = await c.page(await c.context(), "alice", "#/s/pair/p1")
        await name_me(page, "alice")
        await ask(page, "Confirm a and b.")
        await expect(page.locator("#session-status .badge")).to_have_text("suspended")
        await page.click("#nav-inbox")
        await expect(page.locator("#inbox-count")).to_have_text("2")
        cards = page.locator(".card.request[data-session=p1]")
        await expect(cards.locator(".prompt")).to_have_text(["Confirm a?", "Confirm b?"])
        await shot(page, "13-inbox-two-parked")
        await cards.nth(1).get_by_role("button", name="Deny").click()
        await expect(cards.nth(1).locator(".notice.ok")).to_contain_text(
            "Answered: the turn is waiting again (Confirm a?)")
        await cards.nth(0).get_by_role("button", name="Approve").click()
        await expect(cards.nth(0).locator(".notice.ok")).to_contain_text(
            "the turn completed. Both answered: a: yes, b: no.")
        await shot(page, "14-inbox-both-answered")
    assert c.errors == []


@tool
async def timed_refund(ctx: ToolContext) -> dict[str, Any]:
    """Refund once approved; unanswered for an hour, it is not."""
    ok = await ctx.request_input("approve", "Refund order 9?", schema={"type": "boolean"},
                                 timeout=3600, default=False, remind_every=1200)
    return {"refunded": ok}


@tool
async def nap(ctx: ToolContext) -> str:
    """Sleep an hour."""
    await ctx.sleep(3600)
    return "rested"


def _timed_model(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) > 0:
        return ModelReply("Done.")
    opening = next(m for m in reversed(request.messages) if m.is_opening)
    name = "nap" if opening.text == "nap" else "timed_refund"
    return ModelReply("", [ToolCall("c1", name, {})])


async def test_the_inbox_shows_a_deadline_and_its_reminders_and_no_sleep() -> None:
    """F24: a request with a deadline shows when it ends and what it answers then, and its
    reminders; a sleeping turn is parked too but is no card (only the clock answers it)."""
    clock = ManualClock()
    agent = Agent("timed", "", [timed_refund, nap], model=scripted(_timed_model))
    async with console([agent], clock=clock) as c:
        napping = c.rt.session("timed", "n1")
        await napping.start("nap", turn_id="n")
        asking = c.rt.session("timed", "a1")
        await asking.start("refund 9", turn_id="a")
        for s, turn in ((napping, "n"), (asking, "a")):
            assert (await s.result(turn)).status == "suspended"
        page = await c.page(await c.context(), "alice", "#/inbox")
        await expect(page.locator("#inbox-count")).to_have_text("1")
        card = page.locator(".card.request")
        await expect(card).to_have_count(1)
        await expect(card.locator(".prompt")).to_have_text("Refund order 9?")
        await expect(card.locator(".deadline")).to_contain_text("else: false")
        await expect(card.locator(".deadline")).to_contain_text("reminded every 20 min")
        await shot(page, "31-inbox-deadline")
        clock.advance(3600)  # the deadline: the card's request is gone
        await expect(card.locator(".gone")).to_contain_text("No longer waiting", timeout=15_000)
        done = await asking.result("a")
        assert done.text == "Done."
    assert c.errors == []

