"""F18: Who may do what to a session over HTTP: every route for the session's owner, another
principal, an administrator and the answerer of its parked request (``access``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from durable_turns import (
    Agent,
    MemoryStore,
    ModelReply,
    Runtime,
    SessionKey,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.access import Action, principal_id
from durable_turns.errors import ConfigurationError
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.records import SessionSummary, Visibility
from durable_turns.server import create_app
from fakes.serving import serving

WAIT = 30.0
"""The bound on every wait of these tests."""

TOKENS: dict[str, dict[str, Any]] = {
    "t-alice": {"id": "alice"}, "t-bob": {"id": "bob"}, "t-carol": {"id": "carol"},
    "t-root": {"id": "root", "admin": True}, "t-fake-admin": {"id": "eve", "admin": "yes"}}


def authenticate(request: Request) -> dict[str, Any] | None:
    return TOKENS.get(request.headers.get("authorization", "").removeprefix("Bearer "))


@tool
async def refund(order: str, approver: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once the approver says yes."""
    ok = await ctx.request_input("approve", f"Refund {order}?", schema={"type": "boolean"},
                                 answerers={"user": approver})
    return {"refunded": ok}


def reply(request: ModelRequest) -> ModelReply:
    """``refund X by Y`` asks Y; anything else is answered."""
    text = next(m.text for m in reversed(request.messages) if m.is_opening)
    if calls_this_turn(request) == 0 and text.startswith("refund"):
        _, order, _, approver = text.split()
        return ModelReply("", [ToolCall("c1", "refund", {"order": order, "approver": approver})])
    return ModelReply("done" if calls_this_turn(request) else f"You said: {text}")


@dataclass
class Api:
    rt: Runtime
    client: httpx.AsyncClient

    async def call(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer t-{who}", **kw.pop("headers", {})}
        return await self.client.request(method, f"/agents/desk/sessions{path}",
                                         headers=headers, **kw)


@asynccontextmanager
async def api(**app_kw: Any) -> AsyncIterator[Api]:
    rt = Runtime([Agent("desk", "You help.", [refund])], MemoryStore(), scripted(reply))
    async with rt:
        app = create_app(rt, authenticate, **app_kw)
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            yield Api(rt, c)
        await asyncio.wait_for(rt.idle(), WAIT)


async def _alices_sessions(a: Api) -> str:
    """alice-s: a finished turn; alice-p: parked on a request carol answers. Returns the
    parked turn's id."""
    r = await a.call("alice", "POST", "/alice-s/chat", json={"text": "hello"})
    assert r.json()["status"] == "completed", r.text
    r = await a.call("alice", "POST", "/alice-p/chat", json={"text": "refund 42 by carol"})
    assert r.json()["status"] == "suspended", r.text
    return str(r.json()["turn_id"])


PRINCIPALS = ("alice", "bob", "root", "carol")
"""The owner, another principal, an administrator, the answerer of alice-p's request."""


async def test_every_route_for_the_owner_another_an_admin_and_the_answerer() -> None:
    async with api() as a:
        parked = await _alices_sessions(a)
        answer = {"turn_id": parked, "input_id": "approve", "value": True}
        # (method, path, keywords, expected status for alice, bob, root, carol)
        matrix: list[tuple[str, str, dict[str, Any], tuple[int | None, ...]]] = [
            ("GET", "/alice-s", {}, (200, 404, 200, 404)),
            ("GET", "/alice-p", {}, (200, 404, 200, 404)),
            ("GET", "/alice-s/timeline", {}, (200, 404, 200, 404)),
            ("GET", "/alice-s/events", {"params": {"after": "0", "until": "turn"}},
             (200, 404, 200, 404)),
            ("HEAD", "/alice-p/events", {"params": {"after": "0"}}, (200, 404, 200, 404)),
            ("POST", "/alice-s/chat", {"json": {"text": "more"}}, (200, 404, 200, 404)),
            ("POST", "/alice-s/turn", {"json": {"text": "more"}}, (200, 404, 200, 404)),
            ("POST", "/alice-s/cancel", {"json": {}}, (200, 404, 200, 404)),
            # Parked: a new turn is refused (409) to those who may write at all.
            ("POST", "/alice-p/chat", {"json": {"text": "x"}}, (409, 404, 409, 404)),
            # The session may be answered by its answerer only: alice and root pass the
            # session's rule, and the request's answerers refuse them.
            ("POST", "/alice-p/resume", {"json": {**answer, "value": False}},
             (403, 404, 403, None)),
        ]
        for method, path, kw, statuses in matrix:
            for who, status in zip(PRINCIPALS, statuses, strict=True):
                if status is None:
                    continue
                r = await a.call(who, method, path, **kw)  # a stream: read to its end
                assert r.status_code == status, (who, method, path, r.text[:300])
                if status in (403, 404) and method != "HEAD":
                    assert r.json()["error"]["type"] in ("SessionAccessError", "UnknownSession",
                                                         "ResumeAuthorizationError")
        # Nothing a refusal touched changed: alice's park stands, her history is whole.
        s = a.rt.session("desk", "alice-p")
        assert (await s.pending()) is not None and await s.status() == "suspended"
        for who in ("bob", "carol"):
            r = await a.call(who, "POST", "/alice-p/reset", json={})
            assert r.status_code == 404
            r = await a.call(who, "POST", "/alice-p/cancel", json={})
            assert r.status_code == 404
        assert (await s.pending()) is not None and await s.status() == "suspended"
        assert len(await s.transcript()) == 2
        # The answerer answers; the owner and the admin may reset and cancel.
        r = await a.call("carol", "POST", "/alice-p/resume", json=answer)
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text
        # Her double click: the same response as the first, not a refusal; another answer
        # is a conflict; bob, who never answered, still may not.
        again = await a.call("carol", "POST", "/alice-p/resume", json=answer)
        assert (again.status_code, again.json()) == (r.status_code, r.json()), again.text
        other = await a.call("carol", "POST", "/alice-p/resume", json={**answer, "value": False})
        assert other.status_code == 409, other.text
        assert (await a.call("bob", "POST", "/alice-p/resume", json=answer)).status_code == 404
        for who in ("alice", "root"):
            r = await a.call(who, "POST", "/alice-s/reset", json={})
            assert r.status_code == 200, r.text


async def test_lists_and_the_inbox_show_what_each_may_see() -> None:
    async with api() as a:
        await _alices_sessions(a)
        r = await a.call("bob", "POST", "/bob-s/chat", json={"text": "refund 7 by carol"})
        assert r.json()["status"] == "suspended"
        await a.rt.session("desk", "cli-made").turn("made by the CLI")  # no owner

        async def listed(who: str, what: str) -> list[str]:
            r = await a.client.get(f"/agents/desk/{what}",
                                   headers={"Authorization": f"Bearer t-{who}"})
            assert r.status_code == 200, r.text
            key = "sessions" if what == "sessions" else "pending"
            return sorted(row["session"] for row in r.json()[key])

        assert await listed("alice", "sessions") == ["alice-p", "alice-s"]
        assert await listed("bob", "sessions") == ["bob-s"]
        assert await listed("carol", "sessions") == []
        assert await listed("root", "sessions") == ["alice-p", "alice-s", "bob-s", "cli-made"]
        assert await listed("fake-admin", "sessions") == []  # "admin": "yes" is not True
        assert await listed("alice", "pending") == ["alice-p"]
        assert await listed("bob", "pending") == ["bob-s"]
        assert await listed("carol", "pending") == ["alice-p", "bob-s"]  # she answers both
        assert await listed("root", "pending") == ["alice-p", "bob-s"]
        r = await a.call("alice", "GET", "/cli-made")
        assert r.status_code == 404  # a session with no owner is the administrators'
        assert (await a.call("root", "GET", "/cli-made")).status_code == 200


async def test_a_new_session_is_owned_by_whoever_starts_it_and_only_one_of_two() -> None:
    async with api() as a:
        r = await a.call("bob", "POST", "/fresh/chat", json={"text": "mine"})
        assert r.status_code == 200
        assert (await a.rt.session("desk", "fresh").summary()).owner == "http:bob"
        assert (await a.call("alice", "GET", "/fresh")).status_code == 404
        # Two principals start one new session at once: one owns it, the other is refused.
        for n in range(5):
            got = await asyncio.gather(*(
                a.call(who, "POST", f"/race-{n}/chat", json={"text": f"from {who}"})
                for who in ("alice", "bob")))
            assert sorted(r.status_code for r in got) == [200, 404], [r.text for r in got]
            owner = (await a.rt.session("desk", f"race-{n}").summary()).owner
            winner = "http:alice" if got[0].status_code == 200 else "http:bob"
            assert owner == winner
            users = {m.by for m in await a.rt.session("desk", f"race-{n}").transcript()
                     if m.role == "user"}
            assert users == {winner}  # the loser's turn was never accepted


async def test_no_get_takes_a_session_not_even_a_cross_site_navigation() -> None:
    async with api() as a:
        url = "/agents/desk/sessions/NEW/events"
        # A link another site's page follows (a top-level navigation) to a new session's
        # events: nothing is made, nobody owns it, and anyone may then start it.
        nav = {"Authorization": "Bearer t-bob", "Sec-Fetch-Site": "cross-site",
               "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
        for method in ("GET", "HEAD"):
            r = await a.client.request(method, url, params={"after": "0"}, headers=nav)
            assert r.status_code in (200, 404), r.text
        assert (await a.call("bob", "GET", "/NEW")).status_code == 404
        found = await a.rt.session("desk", "NEW").summary()
        assert not found.exists and found.owner is None
        assert (await a.rt.queries.sessions("desk")) == []
        r = await a.call("alice", "POST", "/NEW/chat", json={"text": "mine"})
        assert r.status_code == 200, r.text
        assert (await a.rt.session("desk", "NEW").summary()).owner == "http:alice"


async def test_a_stream_of_a_session_someone_else_starts_is_not_theirs() -> None:
    async with api() as a:
        async with a.client.stream("GET", "/agents/desk/sessions/watched/events",
                                   params={"after": "0"},
                                   headers={"Authorization": "Bearer t-bob"}) as r:
            assert r.status_code == 404  # no stream opens (on main it did, and took it)
            await asyncio.wait_for(r.aread(), WAIT)
        assert (await a.call("alice", "POST", "/watched/chat",
                             json={"text": "secret"})).status_code == 200
        r = await a.call("bob", "GET", "/watched/events", params={"after": "0", "until": "turn"})
        assert r.status_code == 404 and b"secret" not in r.content


async def test_a_session_one_may_not_read_answers_as_if_it_did_not_exist() -> None:
    async with api() as a:
        await _alices_sessions(a)
        cases: list[tuple[str, str, dict[str, Any]]] = [
            ("GET", "/alice-s", {}), ("GET", "/alice-s/timeline", {}),
            ("GET", "/alice-s/events", {"params": {"after": "0"}}),
            ("POST", "/alice-s/chat", {"json": {"text": "x"}}),
            ("POST", "/alice-s/reset", {"json": {}})]
        for method, path, kw in cases:
            mine = await a.call("bob", method, path.replace("alice-s", "nobody"), **kw)
            hers = await a.call("bob", method, path, **kw)
            assert hers.status_code == 404, (method, path, hers.text)
            assert hers.json()["error"]["type"] == "UnknownSession"
            if method == "GET" and "timeline" not in path:  # as for a session nobody made
                assert mine.status_code == 404
                assert hers.json()["error"]["type"] == mine.json()["error"]["type"]


async def test_an_apps_authorize_decides_every_route_in_one_place() -> None:
    asked: list[tuple[str, Action, str | None]] = []

    def authorize(principal: Any, action: Action, session: SessionSummary | None) -> Any:
        asked.append((principal["id"], action, None if session is None else
                      session.key.session))
        if action in ("list", "inbox"):  # support reads every session; bob his own
            return True if principal["id"] == "carol" else Visibility(
                owner=principal_id(principal))
        if principal["id"] == "carol":
            return action == "read"
        # An owner is an identity (http:bob): compared with the principal's, not its bare id.
        return session is not None and session.owner in (None, principal_id(principal))

    async with api(authorize=authorize) as a:
        assert (await a.call("bob", "POST", "/b1/chat", json={"text": "hi"})).status_code == 200
        assert (await a.call("carol", "GET", "/b1")).status_code == 200
        assert (await a.call("carol", "GET", "/b1/timeline")).status_code == 200
        assert (await a.call("carol", "POST", "/b1/reset", json={})).status_code == 403
        r = await a.client.get("/agents/desk/sessions", headers={"Authorization": "Bearer t-carol"})
        assert [s["session"] for s in r.json()["sessions"]] == ["b1"]
        await a.call("bob", "POST", "/b1/cancel", json={})
        await a.client.get("/agents/desk/pending", headers={"Authorization": "Bearer t-bob"})
    assert [(who, action) for who, action, _ in asked] == [
        ("bob", "turn"), ("carol", "read"), ("carol", "read"), ("carol", "reset"),
        # refused: may carol read it? (a 403 if so, a 404 if not)
        ("carol", "read"), ("carol", "list"), ("bob", "cancel"), ("bob", "inbox")]
    assert asked[0][2] == "b1" and asked[5][2] is None


async def test_an_authorize_that_answers_nonsense_is_a_500_that_says_nothing() -> None:
    async with api(authorize=lambda principal, action, session: "yes") as a:
        r = await a.call("bob", "GET", "/b1")
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalError"


async def test_authorize_needs_authenticate() -> None:
    rt = Runtime([Agent("desk", "You help.")], MemoryStore(), scripted([]))
    with pytest.raises(ConfigurationError, match="authenticate"):
        create_app(rt, authorize=lambda principal, action, session: True)


async def test_the_store_is_asked_for_what_a_listing_shows_not_for_everything() -> None:
    seen: list[Visibility | None] = []

    class Watching(MemoryStore):
        async def session_summaries(self, agent: str, *, parked_only: bool = False,
                                    visible: Visibility | None = None) -> list[SessionSummary]:
            seen.append(visible)
            return await super().session_summaries(agent, parked_only=parked_only,
                                                   visible=visible)

    rt = Runtime([Agent("desk", "You help.", [refund])], Watching(), scripted(reply))
    async with rt:
        await rt.queries.own(SessionKey("desk", "x"), "http:alice")
        app = create_app(rt, authenticate)
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            for who in ("alice", "root"):
                for what in ("sessions", "pending"):
                    r = await c.get(f"/agents/desk/{what}",
                                    headers={"Authorization": f"Bearer t-{who}"})
                    assert r.status_code == 200
    assert seen == [Visibility(owner="http:alice"),
                    Visibility(owner="http:alice", answerer="http:alice"), None, None]
