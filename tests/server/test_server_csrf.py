"""F18: Requests the HTTP host must refuse however they were made to look: forms and scripts on
pages of other origins (CSRF, in Chromium), JSON sent as something else, and, in
development mode, requests for another host name (DNS rebinding)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app
from fakes.serving import serving

CHROMIUM = Path("/usr/bin/chromium")
WAIT = 30.0
"""The bound on every wait of these tests."""

Send = Callable[[dict[str, Any]], Awaitable[None]]


@tool
async def refund(order: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once its asker approves."""
    return {"refunded": await ctx.request_input("approve", f"Refund {order}?",
                                                schema={"type": "boolean"})}


def reply(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("", [ToolCall("c1", "refund", {"order": "42"})])
    return ModelReply("done")


def signed_in(request: Request) -> dict[str, str] | None:
    return {"id": "alice"} if request.cookies.get("session") == "s3cret" else None


@dataclass
class Seen:
    """What reached the host: each request's method, path, cookie, origin and status."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    answered: asyncio.Condition = field(default_factory=asyncio.Condition)
    """Notified as each response starts."""

    async def until(self, found: Callable[[list[dict[str, Any]]], bool]) -> None:
        """Wait (at most :data:`WAIT`) until ``found(requests)``."""
        async with asyncio.timeout(WAIT), self.answered:
            await self.answered.wait_for(lambda: found(self.requests))

    def wrap(self, app: Any) -> Any:
        async def recorded(scope: dict[str, Any], receive: Any, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            row = {"method": scope["method"], "path": scope["path"],
                   "cookie": headers.get("cookie"), "origin": headers.get("origin")}
            self.requests.append(row)

            async def sending(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    row["status"] = message["status"]
                    async with self.answered:
                        self.answered.notify_all()
                await send(message)

            await app(scope, receive, sending)

        return recorded


@dataclass
class Parked:
    rt: Runtime
    url: str
    seen: Seen
    turn_id: str

    @property
    def resume(self) -> str:
        return f"{self.url}/agents/ops/sessions/s1/resume"

    def answer(self, **more: Any) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "input_id": "approve", "value": True, **more}

    async def still_parked(self) -> bool:
        return (await self.rt.session("ops", "s1").pending()) is not None


@asynccontextmanager
async def parked(authenticate: Any = None, **app_kw: Any) -> AsyncIterator[Parked]:
    """A host whose session ``s1`` of alice's waits for her approval."""
    rt = Runtime([Agent("ops", "You refund.", [refund])], MemoryStore(), scripted(reply))
    seen = Seen()
    async with rt, serving(seen.wrap(create_app(rt, authenticate, **app_kw))) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT,
                                     cookies={"session": "s3cret"}) as c:
            r = await c.post("/agents/ops/sessions/s1/chat",
                             json={"text": "refund 42", "by": "alice"})
            assert r.json()["status"] == "suspended", r.text
        yield Parked(rt, url, seen, r.json()["turn_id"])
        await asyncio.wait_for(rt.idle(), WAIT)


# -- without a browser -------------------------------------------------------------------------


@pytest.mark.parametrize("authenticate", [None, signed_in], ids=["development", "cookie"])
async def test_what_a_form_or_another_page_could_send_is_refused(authenticate: Any) -> None:
    async with parked(authenticate, origins=["https://console.example"]) as p, \
            httpx.AsyncClient(timeout=WAIT, cookies={"session": "s3cret"}) as c:
        body = json.dumps(p.answer(by="alice"))
        own = p.url
        refused: list[tuple[dict[str, str], str, int]] = [
            # The report's curl: JSON as text/plain, from another origin.
            ({"Content-Type": "text/plain", "Origin": "http://evil"}, body, 403),
            ({"Content-Type": "text/plain", "Origin": own}, body, 415),
            ({"Content-Type": "text/plain"}, body, 415),
            # A form's name=value with the "=" inside a JSON string.
            ({"Content-Type": "application/x-www-form-urlencoded"},
             body[:-1] + ', "x": "=1"}', 415),
            ({"Content-Type": "multipart/form-data; boundary=x"}, body, 415),
            ({}, body, 415),  # a body with no Content-Type at all
            ({"Content-Type": "application/json", "Origin": "http://evil"}, body, 403),
            ({"Content-Type": "application/json", "Origin": "null"}, body, 403),
            # Another port of the same host is another origin (a cookie's SameSite is not).
            ({"Content-Type": "application/json",
              "Origin": own.rsplit(":", 1)[0] + ":1"}, body, 403),
            ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, body, 403),
            ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, body, 403),
        ]
        for headers, content, status in refused:
            r = await c.post(p.resume, content=content, headers=headers)
            assert r.status_code == status, (headers, r.text)
            assert r.json()["error"]["type"] in ("CrossOrigin", "UnsupportedMediaType")
        assert await p.still_parked()
        # What is allowed: the app's own pages, the allowed origins, clients that are no
        # browser (no Origin, no Sec-Fetch-Site).
        for headers in ({"Origin": "https://console.example"}, {"Origin": own + "/"},
                        {"Sec-Fetch-Site": "same-origin"}):
            r = await c.post(p.resume, json=p.answer(by="alice", value=False), headers=headers)
            assert r.status_code == 200, (headers, r.text)


async def test_reads_a_page_of_another_site_makes_are_refused_but_links_work() -> None:
    async with parked(signed_in) as p, \
            httpx.AsyncClient(base_url=p.url, timeout=WAIT, cookies={"session": "s3cret"}) as c:
        cors = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}
        for path in ("/agents/ops/sessions/s1", "/agents/ops/pending", "/",
                     "/agents/ops/sessions/s1/events"):
            r = await c.get(path, headers=cors)
            assert r.status_code == 403, path
        link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
        assert (await c.get("/", headers=link)).status_code == 200
        assert (await c.get("/agents/ops/sessions/s1",
                            headers={"Sec-Fetch-Site": "same-origin"})).status_code == 200


# -- DNS rebinding: development mode answers this machine's names only --------------------------


async def test_development_mode_refuses_other_host_names() -> None:
    async with parked() as p, httpx.AsyncClient(base_url=p.url, timeout=WAIT) as c:
        for host in ("attacker.example", "attacker.example:80", "127.0.0.1.nip.io",
                     "localhost.attacker.example", "[::2]", "",
                     # (issue 38: a userinfo or an unclosed bracket is no loopback name)
                     "127.0.0.1:8702@evil.com", "[::1", "localhost:80@evil.com", "[::1]x"):
            r = await c.post("/agents/ops/sessions/s1/resume", json=p.answer(by="alice"),
                             headers={"Host": host})
            assert r.status_code == 403, host
            assert r.json()["error"]["type"] == "DevelopmentMode"
            assert "DNS rebinding" in r.json()["error"]["message"]
            r = await c.get("/agents/ops/sessions/s1", headers={"Host": host})
            assert r.status_code == 403
        assert await p.still_parked()
        port = p.url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.2", "[::1]:8000"):
            r = await c.get("/agents/ops/sessions/s1", headers={"Host": host})
            assert r.status_code == 200, host


async def test_a_scope_without_a_server_is_not_loopback() -> None:
    rt = Runtime([Agent("ops", "You refund.")], MemoryStore(), scripted([]))
    app = create_app(rt)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope: dict[str, Any] = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": "/agents/ops/sessions",
             "raw_path": b"/agents/ops/sessions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 5000)}
    async with rt:
        await app(scope, receive, send)
    assert sent[0]["status"] == 403
    assert b"DevelopmentMode" in sent[1]["body"]


# -- in a browser: pages of another origin, another port ---------------------------------------


def attacker(target: str, body: dict[str, Any]) -> Starlette:
    """Pages of another origin that try to answer the parked request: a form that sends
    JSON as text/plain, a script's no-cors fetch."""
    text = json.dumps(body)
    # A form sends name=value: a duplicate key takes the "=" into a string JSON then drops
    # (the last of two keys wins), so the body parses as exactly what the attacker means.
    name, value = '{"by": "', '", ' + text[1:]

    async def form(request: Request) -> HTMLResponse:
        return HTMLResponse(
            f"<form id=f method=POST enctype=text/plain action='{target}'>"
            f"<input type=hidden name='{name}' value='{value}'></form>"
            "<script>document.getElementById('f').submit()</script>")

    async def script(request: Request) -> HTMLResponse:
        return HTMLResponse(
            f"<script>fetch('{target}', {{method: 'POST', mode: 'no-cors', "
            f"credentials: 'include', headers: {{'Content-Type': 'text/plain'}}, "
            f"body: {json.dumps(text)}}})</script>")

    return Starlette(routes=[Route("/form", form), Route("/script", script)])


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (.ci/run installs it)")
@pytest.mark.parametrize(("mode", "same_site", "page_host"), [
    ("development", None, "localhost"),     # another site: by comes from the body
    ("cookie", "Lax", "127.0.0.1"),         # another port of the same site: cookie sent
    ("cookie", "Strict", "127.0.0.1"),      # even Strict: SameSite does not look at ports
])
async def test_pages_of_another_origin_cannot_answer_in_chromium(
        mode: str, same_site: Literal["Lax", "Strict"] | None, page_host: str) -> None:
    from playwright.async_api import async_playwright

    authenticate = signed_in if mode == "cookie" else None
    async with parked(authenticate) as p, async_playwright() as pw:
        evil = attacker(p.resume, p.answer(by="alice"))
        async with serving(evil) as evil_url:
            browser = await pw.chromium.launch(executable_path=str(CHROMIUM))
            try:
                ctx = await browser.new_context()
                if same_site is not None:
                    await ctx.add_cookies([{"name": "session", "value": "s3cret",
                                            "url": p.url, "sameSite": same_site}])
                page = await ctx.new_page()
                pages = evil_url.replace("127.0.0.1", page_host)
                for attack in ("form", "script"):
                    before = len(p.seen.requests)

                    def hits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
                        return [r for r in rows[before:]  # noqa: B023 - used at once
                                if r["path"].endswith("/resume") and "status" in r]

                    await page.goto(f"{pages}/{attack}")
                    await p.seen.until(lambda rows: bool(hits(rows)))
                    (hit,) = hits(p.seen.requests)
                    # It reached the host, from the page's origin, with the victim's cookie
                    # where there is one, and was refused.
                    assert hit["origin"] == pages and hit["status"] == 403, (attack, hit)
                    if same_site is not None:
                        assert hit["cookie"] == "session=s3cret"
                assert await p.still_parked()
            finally:
                await browser.close()
