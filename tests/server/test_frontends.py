"""F19: The frontend protocols with their real JavaScript clients: the AI SDK's Chat (the class
behind ``useChat``) over ``DefaultChatTransport``, and AG-UI's ``HttpAgent``, run by Node
against the app of ``frontends_app.py`` (``tests/js``; ``.ci/run`` installs its packages with
``npm ci``). The server side of the refusals is checked here too: what a refused request
leaves in the store (nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_turns.errors import ConfigurationError
from frontends_app import build, served

JS = Path(__file__).parents[1] / "js"
NODE_WAIT = 60.0
"""The bound on one Node scenario."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    if shutil.which("node") is None or not (JS / "node_modules" / "ai").is_dir():
        pytest.fail("the frontend tests need Node and tests/js's packages: "
                    "cd tests/js && npm ci")
    gate = tmp_path_factory.mktemp("gate") / "go"
    with served(gate) as (url, _rt):
        yield url, gate


def node(script: str, scenario: str, url: str, chat: str, *more: str) -> dict[str, Any]:
    """Run a scenario of ``tests/js/<script>`` and return what it printed."""
    run = subprocess.run(["node", script, scenario, url, chat, *more], cwd=JS,
                         capture_output=True, text=True, timeout=NODE_WAIT)
    assert run.returncode == 0, run.stderr[-4000:]
    out: dict[str, Any] = json.loads(run.stdout)
    return out


def session(url: str, chat: str, who: str = "ann", agent: str = "desk") -> dict[str, Any]:
    """What the server has of a session (``GET …/sessions/{chat}``, as ``who``)."""
    r = httpx.get(f"{url}/agents/{agent}/sessions/{chat}",
                  headers={"authorization": f"Bearer {who}"})
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


def frames(r: httpx.Response) -> list[dict[str, Any]]:
    """The JSON of each event of a protocol's stream (a 200)."""
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def assistant(shape: dict[str, Any]) -> dict[str, Any]:
    last: dict[str, Any] = shape["messages"][-1]
    assert last["role"] == "assistant"
    return last


def kinds(message: dict[str, Any]) -> list[str]:
    return [p["type"] for p in message["parts"]]


# -- the AI SDK -------------------------------------------------------------------------------


def test_ai_sdk_chat_builds_text_reasoning_and_a_tool_call_with_its_output(
        server: tuple[str, Path]) -> None:
    url, _gate = server
    out = node("ai_sdk.mjs", "weather", url, "chat-weather")["after"]
    assert out["status"] == "ready" and out["error"] is None
    message = assistant(out)
    assert kinds(message) == ["step-start", "reasoning", "text", "tool-lookup", "step-start",
                              "text"]
    reasoning, first, call, _step, answer = message["parts"][1:]
    assert reasoning["text"] == "The user wants the weather; I will look it up."
    assert first["text"] == "Let me check."
    assert call["state"] == "output-available"
    assert call["input"] == {"city": "Paris"} and call["output"] == {"city": "Paris",
                                                                     "celsius": 21}
    assert answer["text"] == "It is 21 degrees in Paris."
    # The message is the turn: its id is the turn's, and the store has what the client shows.
    stored = session(url, "chat-weather")
    assert stored["turns"][0]["turn_id"] == message["id"]
    assert stored["turns"][0]["text"] == "It is 21 degrees in Paris."


def test_ai_sdk_approval_refused_for_the_wrong_answerer_then_given_by_the_right_one(
        server: tuple[str, Path]) -> None:
    url, _gate = server
    out = node("ai_sdk.mjs", "approval", url, "chat-approval")
    parked = assistant(out["parked"])
    tool = next(p for p in parked["parts"] if p["type"] == "tool-refund")
    assert tool["state"] == "approval-requested"
    assert tool["approval"]["requestReason"] == "Refund order A-12?"
    assert out["reloaded"]["messages"] == [parked]  # what the store has: the same message
    # Ann started the chat but only the boss may approve: an error part, nothing stored.
    assert out["refused"]["status"] == "error"
    assert out["refused"]["error"].startswith("ResumeAuthorizationError: only user 'http:boss'")
    # The boss's answer runs the tool, and the answer arrives in the same message.
    approved = assistant(out["approved"])
    assert approved["id"] == parked["id"]
    tool = next(p for p in approved["parts"] if p["type"] == "tool-refund")
    assert tool["state"] == "output-available" and tool["output"] == "refunded A-12"
    assert approved["parts"][-1] == {"type": "text", "text": "Done: refunded A-12.",
                                     "state": "done"}
    stored = session(url, "chat-approval")
    assert stored["pending"] is None and stored["turns"][0]["status"] == "completed"
    answers = [m for m in stored["transcript"] if m["role"] == "tool"]
    assert [a["result"] for a in answers] == ["refunded A-12"]  # one answer, the boss's


def test_ai_sdk_a_limits_ask_is_an_approval_part_granted_or_denied(
        server: tuple[str, Path]) -> None:
    """F25: a turn parked at its limit shows in the AI SDK's message as a tool part awaiting
    approval (a dynamic tool ``limit``), not a data part; approving it runs the turn on in
    the same message, denying it fails the turn naming the limit."""
    url, _gate = server
    out = node("ai_sdk.mjs", "limit", url, "chat-limit")
    parked = assistant(out["parked"])
    limit = next(p for p in parked["parts"] if p["type"] == "dynamic-tool")
    assert limit["toolName"] == "limit" and limit["state"] == "approval-requested"
    assert limit["approval"]["id"] == limit["toolCallId"] == (
        f"resume:{parked['id']}:limit:1")
    assert limit["approval"]["requestReason"].startswith(
        "The turn reached its model_calls limit (1)")
    assert not any(p["type"].startswith("data-") for p in parked["parts"])
    # A reload shows the same approval, from the store (without the live-only reasoning).
    reloaded = assistant(out["reloaded"])
    assert reloaded["id"] == parked["id"]
    assert [p for p in reloaded["parts"] if p["type"] == "dynamic-tool"] == [limit]
    approved = assistant(out["approved"])
    assert approved["id"] == parked["id"] and out["approved"]["status"] == "ready"
    limit = next(p for p in approved["parts"] if p["type"] == "dynamic-tool")
    assert limit["state"] == "output-available" and limit["output"] == {"approved": True}
    assert approved["parts"][-1] == {"type": "text", "text": "It is 21 degrees in Paris.",
                                     "state": "done"}
    stored = session(url, "chat-limit", agent="capped")
    assert stored["turns"][0]["status"] == "completed"
    denied = out["denied"]
    limit = next(p for p in assistant(denied)["parts"] if p["type"] == "dynamic-tool")
    assert limit["state"] == "output-denied"
    assert denied["status"] == "error" and "LimitExceeded" in (denied["error"] or "")
    assert session(url, "chat-limit-no", agent="capped")["turns"][0]["status"] == "failed"


def test_ai_sdk_in_development_mode_the_body_s_by_speaks_and_answers(tmp_path: Path) -> None:
    """Issue 37: ``DefaultChatTransport({body: {by}})`` (docs/guides/frontends.md) attests the
    turn's speaker, so only they may answer its approval; another ``by`` is refused."""
    with served(tmp_path / "gate", development=True) as (url, _rt):
        out = node("ai_sdk.mjs", "by", url, "chat-by")
        stored = session(url, "chat-by")
    tool = next(p for p in assistant(out["parked"])["parts"] if p["type"] == "tool-refund")
    assert tool["state"] == "approval-requested"
    assert out["refused"]["status"] == "error"
    assert out["refused"]["error"].startswith("ResumeAuthorizationError: only user 'http:ann'"), \
        out["refused"]["error"]
    approved = assistant(out["approved"])
    assert approved["parts"][-1]["text"] == "Done: refunded A-12."
    assert [m["result"] for m in stored["transcript"] if m["role"] == "tool"] == \
        ["refunded A-12"]  # one answer, Ann's


def test_ai_sdk_forged_approval_is_an_error_part_and_stores_nothing(
        server: tuple[str, Path]) -> None:
    url, _gate = server
    out = node("ai_sdk.mjs", "forged", url, "chat-forged")["forged"]
    assert out["status"] == "error"
    assert out["error"].startswith("NoSuchRequest: nothing waits for "
                                   "'resume:no-such-turn:approve'")
    stored = session(url, "chat-forged")
    assert stored["status"] == "suspended" and stored["pending"]["id"] == "approve"
    assert [m["role"] for m in stored["transcript"]] == ["user", "assistant"]


def test_ai_sdk_stream_cut_mid_turn_resumes_whole_without_duplicated_text(
        server: tuple[str, Path]) -> None:
    url, gate = server
    out = node("ai_sdk.mjs", "resume", url, "chat-resume", str(gate))
    cut = assistant(out["cut"])
    assert cut["parts"][-1]["text"].startswith("One, ")
    assert not cut["parts"][-1]["text"].endswith("four.")  # cut before the end
    resumed = assistant(out["resumed"])
    assert resumed["id"] == cut["id"]
    assert kinds(resumed) == ["step-start", "text"]
    assert resumed["parts"][1] == {"type": "text", "text": "One, two, three, four.",
                                   "state": "done"}
    # Once the turn ended nothing runs: the resume request is answered 204, nothing changes.
    assert out["ended"]["status"] == "ready"
    assert out["ended"]["messages"] == out["stopped"]["messages"]


def test_ai_sdk_resume_of_a_chat_where_nothing_runs_is_204(server: tuple[str, Path]) -> None:
    url, _gate = server
    assert node("ai_sdk.mjs", "idle", url, "chat-idle")["idle"] == {
        "status": "ready", "error": None, "messages": []}
    r = httpx.get(f"{url}/agents/desk/ai-sdk/chat/chat-idle/stream",
                  headers={"authorization": "Bearer ann"})
    assert r.status_code == 204


# -- AG-UI ------------------------------------------------------------------------------------


def test_ag_ui_run_events_in_order_and_a_redelivered_run_replays_it(
        server: tuple[str, Path]) -> None:
    url, _gate = server
    out = node("ag_ui.mjs", "weather", url, "thread-weather")
    first = out["first"]
    assert first["error"] is None
    text = ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
    call = ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
    assert first["types"] == [
        "RUN_STARTED", "REASONING_START", "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_END",
        "REASONING_END", *text, *call, "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert first["finished"] == {"outcome": "success", "result": "It is 21 degrees in Paris.",
                                 "interrupts": None}
    said = [m for m in first["messages"] if m["role"] == "assistant" and m.get("content")]
    assert [m["content"] for m in said] == ["Let me check.", "It is 21 degrees in Paris."]
    # The same runId again is the same turn: its stored events (the live reasoning is not
    # stored), the same messages, one turn in the store.
    again = out["again"]
    assert again["error"] is None and again["types"] == ["RUN_STARTED", *text, *call, *text,
                                                         "RUN_FINISHED"]
    assert [m for m in again["messages"] if m["role"] != "reasoning"] == \
        [m for m in first["messages"] if m["role"] != "reasoning"]
    assert [t["turn_id"] for t in session(url, "thread-weather")["turns"]] == ["run-1"]


def test_ag_ui_interrupt_then_a_wrong_answerer_then_the_resume_that_answers_it(
        server: tuple[str, Path]) -> None:
    url, _gate = server
    out = node("ag_ui.mjs", "interrupt", url, "thread-interrupt")
    parked = out["parked"]
    assert parked["types"] == ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS",
                               "TOOL_CALL_END", "RUN_FINISHED"]
    assert parked["finished"]["outcome"] == "interrupt"
    assert parked["finished"]["interrupts"] == [{
        "id": "resume:run-1:approve", "reason": "approval", "message": "Refund order A-12?",
        "toolCallId": "call-1", "responseSchema": {"type": "boolean"}}]
    refused = out["refused"]
    assert refused["types"] == ["RUN_STARTED", "RUN_ERROR"]
    assert refused["error"].startswith("RUN_ERROR ResumeAuthorizationError: only user 'http:boss'")
    approved = out["approved"]
    assert approved["error"] is None
    assert approved["types"] == ["RUN_STARTED", "TOOL_CALL_RESULT", "TEXT_MESSAGE_START",
                                 "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert approved["finished"]["result"] == "Done: refunded A-12."
    results = [m for m in approved["messages"] if m["role"] == "tool"]
    assert [(m["toolCallId"], json.loads(m["content"])) for m in results] == \
        [("call-1", "refunded A-12")]
    stored = session(url, "thread-interrupt")
    assert stored["pending"] is None
    assert [m["result"] for m in stored["transcript"] if m["role"] == "tool"] == \
        ["refunded A-12"]


def test_ag_ui_bad_requests_are_run_errors_and_store_nothing(server: tuple[str, Path]) -> None:
    url, _gate = server
    out = node("ag_ui.mjs", "bad", url, "thread-bad")
    assert out["malformed"]["types"] == ["RUN_STARTED", "RUN_ERROR"]
    assert out["malformed"]["error"] == \
        "RUN_ERROR MalformedBody: messages has no user message to run"
    assert out["forged"]["types"] == ["RUN_STARTED", "RUN_ERROR"]
    assert out["forged"]["error"].startswith(
        "RUN_ERROR NoSuchRequest: nothing waits for 'resume:run-2:not-asked'")
    stored = session(url, "thread-bad")
    assert stored["status"] == "suspended" and stored["pending"]["id"] == "approve"
    assert [t["turn_id"] for t in stored["turns"]] == ["run-2"]


# -- the HTTP side: authorization, refusals, OpenAPI -------------------------------------------


def test_the_routes_go_through_the_guard_and_refuse_with_json(
        server: tuple[str, Path]) -> None:
    url, _gate = server
    chat = {"id": "chat-guard", "messages": [
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hello"}]}]}
    run = {"threadId": "chat-guard", "runId": "r1",
           "messages": [{"id": "u1", "role": "user", "content": "hello"}]}
    with httpx.Client(base_url=url) as c:
        # Nobody: 401 on each route; nothing was started.
        assert c.post("/agents/desk/ai-sdk/chat", json=chat).status_code == 401
        assert c.post("/agents/desk/ag-ui", json=run).status_code == 401
        assert c.get("/agents/desk/ai-sdk/chat/chat-guard/stream").status_code == 401
        ann = {"authorization": "Bearer ann"}
        r = c.post("/agents/desk/ai-sdk/chat", json=chat, headers=ann)
        assert r.status_code == 200
        assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert '"finishReason": "stop"' in r.text and r.text.rstrip().endswith("data: [DONE]")
        # Carol may not read or answer Ann's chat (authorize): 404, as for none, in both.
        carol = {"authorization": "Bearer carol"}
        assert c.post("/agents/desk/ai-sdk/chat", json=chat, headers=carol).status_code == 404
        assert c.post("/agents/desk/ag-ui", json=run, headers=carol).status_code == 404
        assert c.get("/agents/desk/ai-sdk/chat/chat-guard/stream",
                     headers=carol).status_code == 404
        # A page of another site may not start a turn (CSRF), malformed bodies are 400, an
        # unknown agent 404, and the session is as the one good request left it.
        assert c.post("/agents/desk/ai-sdk/chat", json=chat,
                      headers={**ann, "origin": "https://evil.example"}).status_code == 403
        malformed: list[dict[str, Any]] = [
            {"id": "chat-guard", "messages": []},
            {"id": "chat-guard", "messages": [{"role": "user", "parts": "hi"}]},
            {"messages": chat["messages"]}]
        for bad in malformed:
            r = c.post("/agents/desk/ai-sdk/chat", json=bad, headers=ann)
            assert r.status_code == 400 and r.json()["error"]["type"] == "MalformedBody", bad
        # Messages that say nothing, or answer nothing: the protocol's error part.
        nothing: list[tuple[str, dict[str, Any]]] = [
            ("has no text", {"id": "u2", "role": "user",
                             "parts": [{"type": "text", "text": " "}]}),
            ("neither", {"id": "a1", "role": "assistant",
                         "parts": [{"type": "text", "text": "hm"}]})]
        for said, message in nothing:
            r = c.post("/agents/desk/ai-sdk/chat",
                       json={"id": "chat-guard", "messages": [message]}, headers=ann)
            assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
            found = frames(r)
            assert len(found) == 1 and found[0]["type"] == "error", found
            assert found[0]["errorText"].startswith("MalformedBody: ") and \
                said in found[0]["errorText"]
        r = c.post("/agents/desk/ag-ui", json={"threadId": "chat-guard"}, headers=ann)
        assert r.status_code == 400 and r.json()["error"]["type"] == "MalformedBody"
        r = c.post("/agents/desk/ag-ui", json={**run, "runId": "has space"}, headers=ann)
        assert r.status_code == 400 and "runId" in r.json()["error"]["message"]
        assert c.post("/agents/nobody/ai-sdk/chat", json=chat,
                      headers=ann).status_code == 404
    stored = session(url, "chat-guard")
    assert [t["text"] for t in stored["turns"]] == ["You said: hello"]


def test_openapi_shows_the_mounted_routes(server: tuple[str, Path]) -> None:
    url, _gate = server
    doc = httpx.get(f"{url}/openapi.json").json()
    assert {"/agents/{agent}/ai-sdk/chat", "/agents/{agent}/ai-sdk/chat/{session}/stream",
            "/agents/{agent}/ag-ui"} <= set(doc["paths"])
    assert "AiSdkChatRequest" in doc["components"]["schemas"]


def test_a_protocol_mounts_once_and_only_on_an_app_that_serves_the_api(tmp_path: Path) -> None:
    from durable_turns.server import create_app, mount_ai_sdk

    rt, app = build(tmp_path / "gate")
    with pytest.raises(ConfigurationError, match="mounted on this app already"):
        mount_ai_sdk(app)
    with pytest.raises(ConfigurationError, match="serves the API"):
        mount_ai_sdk(create_app(rt, api=False))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def serving_examples_ops(tmp_path: Path) -> Iterator[str]:
    """``durable-turns serve examples/ops --db …`` (a copy of the folder), as the guide says
    to run it: development mode, on a free port; its URL once it listens."""
    app = tmp_path / "ops"
    shutil.copytree(Path(__file__).parents[2] / "examples" / "ops", app)
    port, log = free_port(), tmp_path / "serve.log"
    with log.open("w") as stderr, subprocess.Popen(
            [sys.executable, "-m", "durable_turns.cli", "serve", str(app), "--db",
             str(tmp_path / "ops.db"), "--port", str(port)],
            stdout=subprocess.PIPE, stderr=stderr, text=True) as proc:
        try:
            assert proc.stdout is not None
            lines: list[str] = []
            while not lines or not lines[-1].startswith(("authentication: ",
                                                         "development mode: ")):
                # readline returns at a line or at the end (a failed start); the test's
                # timeout (pyproject's) bounds a server that says nothing
                lines.append(proc.stdout.readline())
                assert lines[-1], f"serve stopped: {lines} {log.read_text()}"
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.kill()
            proc.wait(NODE_WAIT)


def test_the_docs_ag_ui_client_runs_against_serve_examples_ops(tmp_path: Path) -> None:
    """Issue 37: the guide's client, against the app the guide names, asks to approve what
    it said ($30 on order 42), as the ``by`` it sends, and the approval completes it."""
    page = (Path(__file__).parents[2] / "docs" / "guides" / "frontends.md").read_text()
    section = page[page.index("## AG-UI"):]
    snippet = section[section.index("```js\n") + 6:section.index("\n```", section.index("```js"))]
    if shutil.which("node") is None or not (JS / "node_modules" / "@ag-ui").is_dir():
        pytest.fail("the frontend tests need Node and tests/js's packages: "
                    "cd tests/js && npm ci")
    with serving_examples_ops(tmp_path) as url:
        run = subprocess.run(["node", "--input-type=module", "-e", snippet], cwd=JS,
                             env={**os.environ, "BASE": url}, capture_output=True, text=True,
                             timeout=NODE_WAIT)
        assert run.returncode == 0, run.stderr[-4000:]
        stored = httpx.get(f"{url}/agents/ops/sessions/t-1", timeout=NODE_WAIT).json()
    # The first run parks on the approval (the interrupt's prompt printed), the second one
    # answers it and streams the rest; what the comment in the guide says it prints.
    printed = [line.strip() for line in run.stdout.splitlines() if line.strip()]
    assert printed[:2] == ["A person has to approve a $30.00 refund on order 42 first.",
                           "interrupt Refund $30.00 on order 42?"], run.stdout
    assert printed[2].startswith("Refunded $30.00 on order 42 (refund ") and \
        printed[2].endswith("), as approved.") and printed[3:] == ["success"], run.stdout
    said = section[section.index("it prints:\n"):section.index("\n```", section.index("```js"))]
    assert [line.removeprefix("// ") for line in said.splitlines()[1:]] == \
        [printed[0], printed[1], "Refunded $30.00 on order 42 (refund …), as approved.",
         "success"]
    assert stored["transcript"][0] == {"role": "user", "text": "Refund $30 on order 42.",
                                       "turn_id": "run-1", "by": "ann"}  # forwardedProps.by


def test_an_answer_delivered_again_is_one_answer_in_both_protocols(tmp_path: Path) -> None:
    with served(tmp_path / "gate", development=True) as (url, _rt), \
            httpx.Client(base_url=url) as c:
        run = {"threadId": "t-again", "runId": "r1",
               "messages": [{"id": "u1", "role": "user", "content": "refund order A-12"}]}
        parked = frames(c.post("/agents/desk/ag-ui", json=run))
        interrupt = parked[-1]["outcome"]["interrupts"][0]["id"]
        answer = {**run, "runId": "r2", "resume": [
            {"interruptId": interrupt, "status": "resolved", "payload": True}]}
        first = frames(c.post("/agents/desk/ag-ui", json=answer))
        again = frames(c.post("/agents/desk/ag-ui", json=answer))  # a retry: the same answer
        other = frames(c.post("/agents/desk/ag-ui", json={**answer, "resume": [
            {"interruptId": interrupt, "status": "resolved", "payload": False}]}))
        # The AI SDK's approval response for the same request, sent again: the same answer.
        approval = {"id": "t-again", "messages": [{"id": "a1", "role": "assistant", "parts": [
            {"type": "tool-refund", "toolCallId": "call-1", "state": "approval-responded",
             "approval": {"id": interrupt, "approved": True}}]}]}
        ui = frames(c.post("/agents/desk/ai-sdk/chat", json=approval))
        stored = session(url, "t-again")
    assert first[-1]["result"] == again[-1]["result"] == "Done: refunded A-12."
    assert [f["type"] for f in again] == ["RUN_STARTED", "RUN_FINISHED"]
    assert [f["type"] for f in other] == ["RUN_STARTED", "RUN_ERROR"]
    assert other[-1]["code"] == "ResumeConflictError"
    assert ui == [{"type": "start", "messageId": "r1"},
                  {"type": "finish", "finishReason": "stop"}]  # where the turn stands: ended
    assert [m["result"] for m in stored["transcript"] if m["role"] == "tool"] == \
        ["refunded A-12"]


def test_other_requests_are_a_data_part_and_a_cancelled_interrupt_cancels_the_turn(
        tmp_path: Path) -> None:
    with served(tmp_path / "gate", development=True) as (url, _rt), \
            httpx.Client(base_url=url) as c:
        chat = {"id": "c-color", "messages": [{"id": "u1", "role": "user", "parts": [
            {"type": "text", "text": "pick a color"}]}]}
        asked = frames(c.post("/agents/desk/ai-sdk/chat", json=chat))
        part = next(f for f in asked if f["type"] == "data-input-request")
        # Answered as any request is (POST …/resume), with the ids the part carries.
        data = part["data"]
        r = c.post("/agents/desk/sessions/c-color/resume",
                   json={"turn_id": data["turn_id"], "input_id": data["input_id"],
                         "value": "teal"})
        assert r.status_code == 200 and r.json()["text"] == "Done: painted teal."

        run = {"threadId": "t-cancel", "runId": "r1",
               "messages": [{"id": "u1", "role": "user", "content": "refund order A-12"}]}
        parked = frames(c.post("/agents/desk/ag-ui", json=run))
        interrupt = parked[-1]["outcome"]["interrupts"][0]["id"]
        cancelled = frames(c.post("/agents/desk/ag-ui", json={**run, "runId": "r2", "resume": [
            {"interruptId": interrupt, "status": "cancelled"}]}))
        stored = session(url, "t-cancel")
        # An approval for a chat the store does not have: an error part, and still no chat.
        nowhere = frames(c.post("/agents/desk/ai-sdk/chat", json={
            "id": "c-nowhere", "messages": [{"id": "a1", "role": "assistant", "parts": [
                {"type": "tool-refund", "toolCallId": "call-1", "state": "approval-responded",
                 "approval": {"id": "resume:r1:approve", "approved": True}}]}]}))
        assert c.get("/agents/desk/sessions/c-nowhere").status_code == 404
    assert nowhere == [{"type": "error", "errorText": "NoSuchRequest: nothing waits for "
                        "'resume:r1:approve' in session 'c-nowhere'"}]
    assert part == {"type": "data-input-request", "id": f"resume:{data['turn_id']}:color",
                    "data": {**data, "prompt": "Which color?", "schema": {"type": "string"}}}
    assert cancelled == [{"type": "RUN_STARTED", "threadId": "t-cancel", "runId": "r2"},
                         {"type": "RUN_FINISHED", "threadId": "t-cancel", "runId": "r2",
                          "outcome": {"type": "cancelled"}}]
    assert stored["pending"] is None and stored["turns"][0]["status"] == "cancelled"


def test_an_answerer_may_not_cancel_through_an_interrupt(server: tuple[str, Path]) -> None:
    url, _gate = server
    run = {"threadId": "t-boss", "runId": "r1",
           "messages": [{"id": "u1", "role": "user", "content": "refund order A-12"}]}
    with httpx.Client(base_url=url) as c:
        r = c.post("/agents/desk/ag-ui", json=run, headers={"authorization": "Bearer ann"})
        assert r.status_code == 200 and '"interrupt"' in r.text
        cancel = {**run, "runId": "r2", "resume": [
            {"interruptId": "resume:r1:approve", "status": "cancelled"}]}
        # The boss may answer Ann's request, not cancel her turn (the cancel action); nor
        # read it, so the refusal is a 404, as for none.
        r = c.post("/agents/desk/ag-ui", json=cancel, headers={"authorization": "Bearer boss"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "UnknownSession"
    assert session(url, "t-boss")["status"] == "suspended"
