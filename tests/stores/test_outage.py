"""F22: A database outage under a split deployment, with real processes: a server that drives
nothing, two workers, PostgreSQL stopped mid-turn and mid-request and started again, the
server's connections killed with ``pg_terminate_backend`` too.

It runs on a throwaway cluster of its own (``durable_turns.testing.pgcluster``): the shared
test cluster is never stopped. Checked:

- every request made while the database is away is answered while it is still away (a 503
  with ``Retry-After`` naming the cause, or the answer when it needs no database), never left
  hanging until it returns, and nothing it asked for is written late;
- requests repeated with their ``Idempotency-Key`` after it returns start each turn once, and
  every turn finishes, none twice, no step twice;
- the SSE clients following the sessions through the outage get every durable event once,
  in order, with no gap, and a client that reconnects with ``Last-Event-ID`` after it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from deploykit import Deployment, Frame, deployment, read_sse, write_app
from durable_turns.stores.postgres import PgConnection
from durable_turns.testing.pgcluster import Cluster, Unavailable

WAIT = 60.0
"""The bound on every wait of the test (the outage's requests must be answered within it
while the database is still down, else the test fails: none waits for the restart)."""
SESSIONS = [f"s{i}" for i in range(4)]
SERVER_NAME = "outage-server"
"""The server's connections' application_name (pg_terminate_backend finds them by it)."""

AGENT_PY = """
from durable_turns import ModelReply, ToolCall, scripted
from durable_turns.models.scripted import calls_this_turn

def reply(request):
    if calls_this_turn(request) == 0:
        order = request.messages[-1].text
        return ModelReply("Shipping it.", [ToolCall("c1", "ship", {"order": order})])
    return ModelReply("Shipped: " + str(request.messages[-1].result))

model = scripted(reply, chunks=4, delay=0.005)
"""
SHIP_PY = """
import asyncio, os, pathlib, time
from durable_turns import ToolContext, tool

WORK = pathlib.Path(os.environ["OUTAGE_WORK"])

@tool
async def ship(order: str, ctx: ToolContext) -> dict:
    \"\"\"Ship an order (the test holds it until it says go).\"\"\"
    (WORK / f"inside-{ctx.session}-{os.getpid()}-{time.monotonic_ns()}").touch()
    deadline = time.monotonic() + 60
    while not (WORK / "go").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    with open(WORK / "effects", "a") as f:  # at least once: a line per run
        f.write(ctx.idempotency_key + "\\n")
    return {"shipped": order}
"""


@pytest.fixture
def cluster() -> AsyncIterator[Cluster] | Any:
    try:
        made = Cluster.create()
    except Unavailable as e:
        pytest.skip(f"a database outage needs a throwaway PostgreSQL cluster: {e}")
    try:
        yield made
    finally:
        made.destroy()


async def _until(what: str, cond: Any) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _follow(client: httpx.AsyncClient, session: str, into: list[Frame],
                  after: int = 0) -> None:
    """An SSE client of a session from ``after``, to its turn's end."""
    async with client.stream("GET", f"/agents/ops/sessions/{session}/events",
                             params={"after": str(after), "until": "turn"}) as r:
        assert r.status_code == 200, await r.aread()
        await read_sse(r, into)


async def _chat(client: httpx.AsyncClient, session: str, key: str) -> httpx.Response:
    return await client.post(f"/agents/ops/sessions/{session}/chat",
                             json={"text": f"order {session}"},
                             headers={"Idempotency-Key": key})


async def _chat_until_done(client: httpx.AsyncClient, session: str, key: str) -> Any:
    """Ask again with the same key until the turn's answer comes (honouring Retry-After)."""
    deadline = time.monotonic() + WAIT
    while True:
        r = await _chat(client, session, key)
        if r.status_code == 200 and r.json()["status"] == "completed":
            return r.json()
        assert r.status_code == 503, r.text
        assert time.monotonic() < deadline, f"{session} never finished: {r.text}"
        await asyncio.sleep(float(r.headers["retry-after"]) / 10)  # a client's backoff


def _check_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"].isdigit()
    assert r.json()["error"]["type"] == "StoreUnavailable"


async def test_a_database_outage_fails_fast_duplicates_nothing_and_every_turn_finishes(
        cluster: Cluster, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    store = f"{cluster.dsn}?application_name={SERVER_NAME}"
    admin = psycopg.connect(cluster.dsn, autocommit=True)
    app = write_app(tmp_path, "You ship orders.", AGENT_PY, {"ship": SHIP_PY})
    async with deployment(app, store, tmp_path, workers=2,
                          env={"OUTAGE_WORK": str(work)}) as d, \
            httpx.AsyncClient(base_url=d.url, timeout=WAIT) as client:
        try:
            await _run(d, client, cluster, admin, work)
        finally:
            (work / "go").touch()
            admin.close()


async def _run(d: Deployment, client: httpx.AsyncClient, cluster: Cluster,
               admin: psycopg.Connection[Any], work: Path) -> None:
    # -- before: subscribers on every session, a turn started on each, held in its tool --
    followed: dict[str, list[Frame]] = {s: [] for s in SESSIONS}
    followers = {s: asyncio.create_task(_follow(client, s, followed[s])) for s in SESSIONS}
    keys = {s: f"key-{s}" for s in SESSIONS}
    asked = {s: asyncio.create_task(_chat(client, s, keys[s])) for s in SESSIONS}
    await _until("every turn inside its tool",
                 lambda: len({p.name.split("-")[1] for p in work.glob("inside-*")}) == 4)

    # -- the server's connections killed mid-request: it goes on on new ones --
    killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE application_name = %s", (SERVER_NAME,)).fetchone()
    assert killed is not None and killed[0] >= 2
    r = await client.get("/agents/ops/sessions")
    assert r.status_code == 200, r.text
    assert {s["session"] for s in r.json()["sessions"]} == set(SESSIONS)

    # -- the database stops, mid-turn (every tool runs) and mid-request (every chat waits) --
    admin.close()
    cluster.stop()
    (work / "go").touch()  # the tools return; their steps cannot commit
    during = {f"n{i}": f"key-n{i}" for i in range(2)}
    refused = await asyncio.gather(*(_chat(client, s, k) for s, k in during.items()))
    for r in refused:
        _check_unavailable(r)
    for path in ("/agents/ops/sessions", "/agents/ops/sessions/s0",
                 "/agents/ops/sessions/s0/timeline", "/agents/ops/pending",
                 "/agents/ops/sessions/s0/events"):
        _check_unavailable(await client.get(path))
    # Every request made before the outage is answered while it lasts (none completed: the
    # tools' steps could not commit).
    for task in asked.values():
        _check_unavailable(await asyncio.wait_for(task, WAIT))
    # A subscriber that left during the outage comes back later with its cursor.
    followers["s3"].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await followers["s3"]
    cursor = max((int(i) for i, _k, _d in followed["s3"] if i is not None), default=0)
    assert cluster_down(cluster)

    # -- the database comes back: every request is asked again with its key --
    cluster.start()
    answers = await asyncio.gather(*(_chat_until_done(client, s, k)
                                     for s, k in {**keys, **during}.items()))
    assert all(a["text"].startswith("Shipped:") for a in answers)
    followed["s3-again"] = []
    await asyncio.wait_for(_follow(client, "s3", followed["s3-again"], after=cursor), WAIT)
    await asyncio.wait_for(asyncio.gather(*(followers[s] for s in SESSIONS[:3])), WAIT)

    # -- nothing twice, nothing lost --
    with PgConnection.connect(cluster.dsn) as c:  # the kit's Connection, for _events
        turns = c.execute("SELECT s.session, t.turn_id, t.status FROM turns t "
                          "JOIN sessions s USING (sid) ORDER BY s.session").fetchall()
        twice = c.execute("SELECT sid, gen, step, count(*) FROM log WHERE step IS NOT NULL "
                          "GROUP BY sid, gen, step HAVING count(*) > 1").fetchall()
        stored = {s: [json.loads(e) for e in _events(c, s)] for s in [*SESSIONS, *during]}
    sessions = [*SESSIONS, *during]
    assert [row[0] for row in turns] == sorted(sessions), turns  # one turn per key
    assert all(row[2] == "completed" for row in turns), turns
    assert twice == []
    for s in sessions:
        kinds = [k for k, _n in stored[s]]
        assert kinds.count("turn.completed") == 1 and kinds.count("action.completed") == 1
    for s in SESSIONS[:3]:
        got = [int(i) for i, _k, _d in followed[s] if i is not None]
        assert got == list(range(1, len(stored[s]) + 1)), (s, got)  # no gap, no duplicate
    again = [int(i) for i, _k, _d in followed["s3-again"] if i is not None]
    before = [int(i) for i, _k, _d in followed["s3"] if i is not None]
    assert before + again == list(range(1, len(stored["s3"]) + 1))


def cluster_down(cluster: Cluster) -> bool:
    """Whether the cluster refuses connections (it is still down)."""
    try:
        psycopg.connect(cluster.dsn, connect_timeout=2).close()
    except psycopg.OperationalError:
        return True
    return False


def _events(c: PgConnection, session: str) -> list[str]:
    """A session's stored events, as ``[type, seq]`` JSON lists, in order (read through the
    store's own reader, so the log's encoding stays the store's business)."""
    from durable_turns.records import SessionKey
    from durable_turns.stores.postgres import SYNTAX
    from durable_turns.stores.sql import Statements

    events = Statements(SYNTAX).read_events(c, SessionKey("ops", session), 0, None)
    return [json.dumps([e.type, e.seq]) for e in events]
