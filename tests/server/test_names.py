"""Issue 38 (F13, F18, F19): names and identities over HTTP. A subagent's child session has
an id nobody can predict, is its parent's owner's, and no HTTP caller makes one; an identity
is ``source:id``; numbers that are not finite and names that are not plain text are refused
with a 400 that says why; a protocol body is read as its published schema says."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.requests import Request

from durable_turns import (
    Agent,
    InboundEvent,
    MemoryStore,
    ModelReply,
    Runtime,
    ToolCall,
    ToolContext,
    scripted,
    subagent,
    tool,
)
from durable_turns.inbound import answers_as, identity, source_of
from durable_turns.models import ModelRequest
from durable_turns.models.scripted import calls_this_turn
from durable_turns.server import create_app, mount_ag_ui
from durable_turns.subagents import find_child
from fakes.serving import serving

WAIT = 30.0
"""The bound on every wait of these tests."""

TOKENS: dict[str, dict[str, Any]] = {
    "t-alice": {"id": "alice"}, "t-bob": {"id": "bob"}, "t-root": {"id": "root", "admin": True},
    # An HTTP principal that calls itself what a Slack user is called.
    "t-slacky": {"id": "U024BE7LH"}}


def authenticate(request: Request) -> dict[str, Any] | None:
    return TOKENS.get(request.headers.get("authorization", "").removeprefix("Bearer "))


taken: list[float] = []


@tool
async def approve(amount: float, ctx: ToolContext) -> str:
    """Ask a person to approve a payment of ``amount``."""
    taken.append(amount)
    ok = await ctx.request_input("approve", f"Pay {amount}?", schema={"type": "number"})
    return f"approved {ok}"


def lead_model(request: ModelRequest) -> ModelReply:
    if calls_this_turn(request) == 0:
        return ModelReply("", [ToolCall("c1", "helper", {"task": "What is six times seven?"})])
    return ModelReply(f"The helper says: {request.messages[-1].result}")


def pay_model(request: ModelRequest) -> ModelReply:
    """``pay N`` calls approve with N (``inf``: a number JSON has not)."""
    text = next(m.text for m in reversed(request.messages) if m.is_opening)
    if calls_this_turn(request) == 0 and text.startswith("pay "):
        return ModelReply("", [ToolCall("p1", "approve", {"amount": float(text[4:])})])
    return ModelReply(f"done: {request.messages[-1].result}" if calls_this_turn(request)
                      else "ok")


@dataclass
class Api:
    rt: Runtime
    client: httpx.AsyncClient

    async def call(self, who: str | None, method: str, path: str,
                   **kw: Any) -> httpx.Response:
        headers = kw.pop("headers", {})
        if who is not None:
            headers["Authorization"] = f"Bearer t-{who}"
        return await self.client.request(method, path, headers=headers, **kw)


@asynccontextmanager
async def api(*, authorized: bool = True, **app_kw: Any) -> AsyncIterator[Api]:
    lead = Agent("lead", "You delegate.", [subagent("helper", description="Does sums.")],
                 model=scripted(lead_model))
    helper = Agent("helper", "You do sums.", model=scripted([ModelReply("42")] * 4))
    pay = Agent("pay", "You pay.", [approve], model=scripted(pay_model))
    rt = Runtime([lead, helper, pay], MemoryStore())
    async with rt:
        app = create_app(rt, authenticate if authorized else None, **app_kw)
        mount_ag_ui(app)
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
            yield Api(rt, c)
        await asyncio.wait_for(rt.idle(), WAIT)


# -- Deliver 1: a subagent's child session (finding 2) ---------------------------------------


async def test_a_child_session_is_unpredictable_and_its_parents_owners() -> None:
    async with api() as a:
        children = []
        for parent in ("p1", "p2"):
            r = await a.call("alice", "POST", f"/agents/lead/sessions/{parent}/chat",
                             json={"text": "ask", "turn_id": "t1"})
            assert r.json()["text"] == "The helper says: {'answer': '42'}", r.text
            found = await find_child(a.rt.session("lead", parent), "t1", "c1")
            assert found is not None
            children.append(found[0])
        # Nothing in them comes from the parent's names: two parents' first calls differ.
        assert all(re.fullmatch(r"subagent:[0-9a-f]{32}", c) for c in children), children
        assert children[0] != children[1]
        child = children[0]
        assert (await a.rt.session("helper", child).summary()).owner == "http:alice"
        # The parent's owner (and an administrator) reads it; anyone else: no such session.
        for who, status in (("alice", 200), ("root", 200), ("bob", 404)):
            r = await a.call(who, "GET", f"/agents/helper/sessions/{child}")
            assert r.status_code == status, (who, r.text)
        r = await a.call("alice", "GET", f"/agents/helper/sessions/{child}")
        assert [m["text"] for m in r.json()["transcript"]] == ["What is six times seven?", "42"]


async def test_no_http_caller_makes_or_takes_a_child_session() -> None:
    async with api() as a:
        await a.call("alice", "POST", "/agents/lead/sessions/p1/chat",
                     json={"text": "ask", "turn_id": "t1"})
        found = await find_child(a.rt.session("lead", "p1"), "t1", "c1")
        assert found is not None
        for who, name in (("bob", "subagent:0123456789abcdef0123456789abcdef"),
                          ("alice", found[0]), ("bob", found[0])):
            for route, body in (("chat", {"text": "mine"}), ("reset", {})):
                r = await a.call(who, "POST", f"/agents/helper/sessions/{name}/{route}",
                                 json=body)
                assert r.status_code == 403, (who, name, route, r.text)
                assert r.json()["error"]["type"] == "ReservedSessionName"
        assert not (await a.rt.session(
            "helper", "subagent:0123456789abcdef0123456789abcdef").summary()).exists
        # Development mode makes none either.
    async with api(authorized=False) as a:
        r = await a.client.post("/agents/helper/sessions/subagent:x/chat", json={"text": "x"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "ReservedSessionName"


# -- Deliver 2: principals by source (item 7's first observation) ---------------------------


def test_an_identity_is_its_source_and_its_id() -> None:
    assert identity("slack", "U024BE7LH") == "slack:U024BE7LH"
    assert identity("http", "http:alice") == "http:alice"
    assert source_of("teams:29:1abc") == "teams" and source_of("U1") is None
    assert source_of("29:1abc") is None  # a bare Teams id
    assert answers_as("slack:U1", "slack:U1")
    assert not answers_as("slack:U1", "http:U1")
    # A bare rule (stored before identities were qualified) is read in its turn's source.
    assert answers_as("U1", "slack:U1", "slack") and not answers_as("U1", "http:U1", "slack")
    assert not answers_as("U1", "http:U1")  # no source known: ambiguous, refused
    # A bare by is the app's own code (the CLI, a test): hosts never pass one.
    assert answers_as("slack:U1", "U1") and not answers_as("slack:U1", "U2")


async def test_an_http_principal_named_as_a_slack_user_does_not_answer_for_them() -> None:
    async with api(authorize=lambda principal, action, session: True) as a:
        s = a.rt.session("pay", "from-slack")
        slack_user = InboundEvent("slack", {"id": "U024BE7LH", "attested": True}, "pay 5")
        t = await s.start(event=slack_user, turn_id="t1")
        parked = await s.result(t.turn_id, timeout=WAIT)
        assert parked.request is not None
        assert parked.request.answerers == {"user": "slack:U024BE7LH"}
        answer = {"turn_id": "t1", "input_id": "approve", "value": 1}
        r = await a.call("slacky", "POST", "/agents/pay/sessions/from-slack/resume", json=answer)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "ResumeAuthorizationError"
        assert "'http:U024BE7LH' may not" in r.json()["error"]["message"]
        assert await s.pending() is not None
        await s.resume("t1", "approve", 1, by="slack:U024BE7LH")  # the Slack user does
        assert (await s.result("t1", timeout=WAIT)).status == "completed"


# -- item 5: numbers that are not finite ------------------------------------------------------


async def test_a_non_finite_number_is_a_400_and_reaches_no_tool() -> None:
    taken.clear()
    async with api() as a:
        r = await a.call("alice", "POST", "/agents/pay/sessions/n1/chat", json={"text": "pay 5"})
        assert r.json()["status"] == "suspended", r.text
        turn = r.json()["turn_id"]
        for raw in ("1e400", "-1e400", "NaN", "Infinity"):
            r = await a.call("alice", "POST", "/agents/pay/sessions/n1/resume",
                             content=f'{{"turn_id": "{turn}", "input_id": "approve", '
                                     f'"value": {raw}}}',
                             headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (raw, r.text)
            assert r.json()["error"]["type"] == "MalformedBody"
            assert "not finite" in r.json()["error"]["message"]
        assert await a.rt.session("pay", "n1").pending() is not None  # nothing was stored
        # Tool input alike: a model's call with an infinite number is an error result.
        r = await a.call("alice", "POST", "/agents/pay/sessions/n2/chat",
                         json={"text": "pay inf"})
        assert r.json()["status"] == "completed", r.text
        assert "not a finite number" in r.json()["text"]
        assert taken == [5.0]  # the tool ran for the finite call only


# -- item 6: what the OpenAPI document publishes is what the server takes ---------------------


def _run(messages: list[dict[str, Any]], thread: str = "th1") -> dict[str, Any]:
    return {"threadId": thread, "runId": "r1", "state": {}, "messages": messages,
            "tools": [], "context": [], "forwardedProps": {}}


async def test_ag_ui_tool_calls_carry_their_type_and_reset_takes_no_white_space() -> None:
    async with api() as a:
        untyped = _run([{"id": "m0", "role": "user", "content": "hi"},
                        {"id": "m1", "role": "assistant", "toolCalls": [
                            {"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
                        {"id": "m2", "role": "user", "content": "again"}])
        r = await a.call("alice", "POST", "/agents/pay/ag-ui", json=untyped)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith("messages.1.toolCalls.0.type:")
        assert not (await a.rt.session("pay", "th1").summary()).exists
        typed = _run(untyped["messages"])
        typed["messages"][1]["toolCalls"][0]["type"] = "function"
        r = await a.call("alice", "POST", "/agents/pay/ag-ui", json=typed)
        assert r.status_code == 200 and "RUN_FINISHED" in r.text, r.text
        for body in ("\n", " ", "\r\n\t"):
            r = await a.call("alice", "POST", "/agents/pay/sessions/th1/reset", content=body,
                             headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (body, r.text)
            assert "white space" in r.json()["error"]["message"]
        r = await a.call("alice", "POST", "/agents/pay/sessions/th1/reset", content=b"",
                         headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text  # no body at all: nothing to say


# -- item 7: names that are plain text; a run refused before it claims -------------------------


async def test_session_names_are_plain_text() -> None:
    async with api() as a:
        for raw in ("a%00b", "a%0Ab", "a%E2%80%AEb", "a%C2%85b", "a%1Bb"):
            for method, path, kw in (("GET", "", {}), ("POST", "/chat", {"json": {"text": "x"}})):
                r = await a.call("alice", method, f"/agents/pay/sessions/{raw}{path}", **kw)
                assert r.status_code == 400, (raw, r.text)
                assert r.json()["error"]["type"] == "InvalidSessionName"
        # Two bytes that are no UTF-8 would both read as U+FFFD, and name one session.
        for raw in ("%ff", "%fe", "a%C0%80"):
            r = await a.call("alice", "POST", f"/agents/pay/sessions/{raw}/chat",
                             json={"text": "x"})
            assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidPath", raw
        assert await a.rt.queries.sessions("pay") == []
        # A name in any script is still a name.
        r = await a.call("alice", "POST", "/agents/pay/sessions/%E6%97%A5%E6%9C%AC/chat",
                         json={"text": "hi"})
        assert r.status_code == 200, r.text


async def test_a_run_with_a_lone_surrogate_is_refused_before_it_claims_the_thread() -> None:
    async with api() as a:
        body = ('{"threadId": "th9", "runId": "r1", "state": {}, "tools": [], "context": [], '
                '"forwardedProps": {}, "messages": [{"id": "m0", "role": "user", '
                '"content": "hi \\ud800"}]}')
        r = await a.call("alice", "POST", "/agents/pay/ag-ui", content=body,
                         headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert "lone surrogate" in r.json()["error"]["message"]
        assert "Error" not in r.json()["error"]["message"]  # no Python exception named
        assert not (await a.rt.session("pay", "th9").summary()).exists
        # bob may still start th9: nobody took it.
        ok = _run([{"id": "m0", "role": "user", "content": "hi"}], "th9")
        r = await a.call("bob", "POST", "/agents/pay/ag-ui", json=ok)
        assert r.status_code == 200 and "RUN_FINISHED" in r.text, r.text
