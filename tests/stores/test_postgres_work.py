"""F14: PostgresStore for many workers: SKIP LOCKED claims, the notifications and their listener,
migrations of an older schema, and a worker whose step connection is killed mid-step.

Real PostgreSQL (``DURABLE_TURNS_TEST_PG``; skipped without it), real processes.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgkit
from durable_turns import Message, SessionKey, ToolContext
from durable_turns.events import TurnStarted
from durable_turns.messages import encode_message
from durable_turns.records import NewEntry
from durable_turns.scheduling import ClaimingScheduler, NoDriveScheduler
from durable_turns.stores import Lease
from durable_turns.stores.postgres import CHANNEL, LISTENER_NAME, PostgresStore
from durable_turns.stores.sql import SCHEMA_VERSION
from durable_turns.testing import get_turn
from old_schemas import PG_HISTORY

KEY = SessionKey("ops", "s1")


def _opening(turn_id: str = "t1") -> Message:
    return Message("user", "hi", turn_id=turn_id)


def _started(key: SessionKey, turn_id: str = "t1") -> TurnStarted:
    return TurnStarted(agent=key.agent, session=key.session, turn_id=turn_id)


async def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + pgkit.CHILD_TIMEOUT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


# -- claims ------------------------------------------------------------------------------


async def test_workers_claiming_together_share_fifty_sessions_out(pg_dsn: str) -> None:
    stores = [PostgresStore(pg_dsn) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        keys = [SessionKey("ops", f"s{i:02}") for i in range(50)]
        for key in keys:
            await stores[0].enqueue(key, NewEntry("t1", _opening()))
        # Four workers, each claiming up to 20 at a time, all at once: SKIP LOCKED hands each
        # session to one of them and nobody waits on another's rows.
        got = await asyncio.gather(*(s.claim_ready(["ops"], 20) for s in stores for _ in (1, 2)))
        claimed = [lease.key for leases in got for lease in leases]
        assert sorted(claimed) == keys
        for leases in got:
            for lease in leases:
                await lease.release()
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_an_expired_lease_is_claimed_by_any_worker(pg_dsn: str) -> None:
    a, b = PostgresStore(pg_dsn, lease_ttl=0.5), PostgresStore(pg_dsn, lease_ttl=0.5)
    await a.open()
    await b.open()
    try:
        await a.enqueue(KEY, NewEntry("t1", _opening()))
        [held] = await a.claim_ready(["ops"])
        assert await b.claim_ready(["ops"]) == []  # held and beating
        owner = b.unwrap().execute("SELECT lease_owner FROM sessions").fetchone()
        assert owner == (a.owner,)
        await a.stop_heartbeat(held)  # as if a's process were paused: the lease expires
        taken: list[Lease] = []
        deadline = time.monotonic() + pgkit.CHILD_TIMEOUT
        while not taken:
            assert time.monotonic() < deadline, "the expired lease was never claimed"
            taken = list(await b.claim_ready(["ops"]))
            await asyncio.sleep(0.05)
        [lease] = taken
        assert lease.key == KEY and lease.epoch > held.epoch
        await lease.release()
    finally:
        await a.close()
        await b.close()


# -- notifications -----------------------------------------------------------------------


async def test_a_notification_names_its_sessions_and_seqs(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn)
    await store.open()
    listener = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    try:
        await listener.execute(f"LISTEN {CHANNEL}")
        await store.enqueue(KEY, NewEntry("t1", _opening()))
        lease = await store.claim(KEY)
        async with lease.transaction() as tx:
            tx.add_event(_started(KEY))
            tx.add_event(TurnStarted(agent="ops", session="s1", turn_id="t1", text="again"))
        await lease.release()
        payloads: list[object] = []
        async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
            async for n in listener.notifies():
                payloads.append(json.loads(n.payload))
                if len(payloads) == 2:
                    break
        # The enqueue (a chain change: no seq), then one for the whole step: its newest seq.
        assert payloads == [{"from": store.origin, "changes": [["ops", "s1", None]]},
                            {"from": store.origin, "changes": [["ops", "s1", 2]]}]
    finally:
        await listener.close()
        await store.close()


async def test_a_session_id_too_long_for_a_payload_still_commits_and_streams(
        pg_dsn: str) -> None:
    key = SessionKey("ops", "x" * 9000)  # over PostgreSQL's 8000-byte payload limit
    reader, writer = PostgresStore(pg_dsn), PostgresStore(pg_dsn, poll_interval=3600)
    await reader.open()
    await writer.open()
    try:
        async with reader.subscribe(key, after_seq=0) as sub:
            await writer.enqueue(key, NewEntry("t1", _opening()))
            lease = await writer.claim(key)
            async with lease.transaction() as tx:
                tx.add_event(_started(key))
            await lease.release()
            async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
                got = await anext(sub)  # told "anything may have changed"
        assert (got.session, got.seq) == (key.session, 1)
    finally:
        await reader.close()
        await writer.close()


def _listener_pid(c: psycopg.Connection[Any]) -> int | None:
    row = c.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                    "AND datname = current_database() AND query LIKE 'LISTEN%%'",
                    (LISTENER_NAME,)).fetchone()
    return None if row is None else int(row[0])


async def test_a_listener_whose_backend_is_killed_reconnects_and_reads_what_it_missed(
        pg_dsn: str) -> None:
    # Neither store re-reads on a timer in this test's lifetime: only a notification, or the
    # listener's re-read after it reconnects, can bring an event.
    reader = PostgresStore(pg_dsn, poll_interval=3600)
    writer = PostgresStore(pg_dsn, poll_interval=3600)
    await reader.open()
    await writer.open()
    admin = psycopg.connect(pg_dsn, autocommit=True)
    try:
        async with reader.subscribe(KEY, after_seq=0) as sub:
            await _until(lambda: _listener_pid(admin) is not None, "the listener")
            lease = await writer.claim(KEY)
            async with lease.transaction() as tx:
                tx.add_event(_started(KEY))
            async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
                assert (await anext(sub)).seq == 1  # through NOTIFY

            # An event whose notification is lost: written without one, as if it had been
            # sent while the listener was down.
            sid = admin.execute("SELECT sid FROM sessions WHERE session = 's1'").fetchone()
            assert sid is not None
            lost = _started(KEY)
            stored = json.dumps([["turn.started", {**lost.payload(), "at": lost.at}]])
            admin.execute("INSERT INTO log (sid, seq, sub, gen, n, turn_id, events) "
                          "VALUES (%s, 2, 0, 0, 0, 't1', %s)", (sid[0], stored))
            await lease.release()
            old = _listener_pid(admin)
            admin.execute("SELECT pg_terminate_backend(%s)", (old,))
            async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
                assert (await anext(sub)).seq == 2  # the re-read after the reconnect
            assert _listener_pid(admin) not in (None, old)

            lease = await writer.claim(KEY)
            async with lease.transaction() as tx:  # and live again
                tx.add_event(_started(KEY))
            await lease.release()
            async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
                assert (await anext(sub)).seq == 3
    finally:
        admin.close()
        await reader.close()
        await writer.close()


# -- migrations --------------------------------------------------------------------------


async def test_a_database_of_the_first_schema_is_migrated_and_keeps_its_turns(
        pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as c:  # what durable_turns 0.1 made
        c.execute(PG_HISTORY[0].encode())
        c.execute("CREATE TABLE durable_turns_schema (version INTEGER NOT NULL)")
        c.execute("INSERT INTO durable_turns_schema VALUES (1)")
        c.execute("INSERT INTO sessions (agent, session) VALUES ('ops', 's1')")
        c.execute("INSERT INTO turns (sid, turn_id, status, opening) SELECT sid, 't1', "
                  "'queued', %s FROM sessions", (encode_message(_opening()),))
    from durable_turns import Agent, ModelReply, Runtime, scripted

    store = PostgresStore(pg_dsn, lease_ttl=2.0)
    rt = Runtime([Agent("ops", "You run ops.", [])], store,
                 scripted(lambda _request: ModelReply("done")))
    try:
        assert await rt.recover() == [KEY]
        async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
            res = await rt.session("ops", "s1").result("t1")
        assert (res.status, res.text) == ("completed", "done")
        version = store.unwrap().execute("SELECT version FROM durable_turns_schema").fetchall()
        assert version == [(SCHEMA_VERSION,)]
        assert (await get_turn(store, KEY, "t1")) is not None
    finally:
        await rt.close()


async def test_a_schema_newer_than_this_version_is_refused_untouched(pg_dsn: str) -> None:
    from durable_turns.errors import StoreError

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE durable_turns_schema (version INTEGER NOT NULL)")
        c.execute("INSERT INTO durable_turns_schema VALUES (%s)", (SCHEMA_VERSION + 1,))
    store = PostgresStore(pg_dsn)
    with pytest.raises(StoreError, match="newer than this durable_turns knows"):
        await store.open()
    with psycopg.connect(pg_dsn) as c:
        tables = c.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'sessions' "
                           "AND schemaname = current_schema()").fetchone()
    assert tables == (0,)


# -- a worker's step connection killed mid-step ------------------------------------------


async def test_a_worker_whose_step_connection_is_killed_mid_step_completes_the_turn(
        pg_dsn: str, tmp_path: Path) -> None:
    with (tmp_path / "stderr-a").open("wb") as err:  # the child keeps its own descriptor
        a = subprocess.Popen(pgkit.command(pg_dsn, tmp_path, "a", "--start", "--hold"),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        held = tmp_path / "held-a"
        await _until(lambda: held.exists() or a.poll() is not None, "held-a")
        assert a.poll() is None, (tmp_path / "stderr-a").read_text()
        backend = int(held.read_text())
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            # Inside the local tool, its order row written, the step not committed.
            c.execute("SELECT pg_terminate_backend(%s)", (backend,))
        (tmp_path / "go-a").touch()
        a.wait(timeout=pgkit.CHILD_TIMEOUT)
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGKILL)
            a.wait()
    assert a.returncode == 0, (tmp_path / "stderr-a").read_text()
    report = json.loads((tmp_path / "report-a.json").read_text())
    assert report["status"] == "completed"
    with psycopg.connect(pg_dsn) as c:
        rows = c.execute("SELECT call_id, pid FROM orders ORDER BY call_id").fetchall()
    # The killed step left nothing; A drove the turn again on a new connection: each once.
    assert rows == [("c1", a.pid), ("c2", a.pid)]


async def test_a_worker_whose_connections_are_all_killed_goes_on_working(pg_dsn: str) -> None:
    import uuid

    from durable_turns import Agent, ModelReply, Runtime, scripted

    name = f"worker-{uuid.uuid4().hex[:8]}"
    claims = ClaimingScheduler(poll_interval=0.1)
    worker = Runtime([Agent("ops", "You run ops.", [])],
                     PostgresStore(psycopg.conninfo.make_conninfo(pg_dsn, application_name=name),
                                   poll_interval=0.2),
                     scripted(lambda _request: ModelReply("done")), scheduler=claims)
    front = Runtime([Agent("ops")], PostgresStore(pg_dsn), scheduler=NoDriveScheduler())
    working = asyncio.ensure_future(claims.run())
    admin = psycopg.connect(pg_dsn, autocommit=True)
    try:
        async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
            first = await front.session("ops", "s1").start("hi", turn_id="t1")
            assert (await front.session("ops", "s1").result(first.turn_id)).text == "done"
        await _until(lambda: admin.execute("SELECT lease_owner FROM sessions").fetchall()
                     == [(None,)], "the lease's release")
        # Every connection of the worker's pools (and its unwrap() one) dies at once, as in a
        # server restart: its next claim fails, the pool replaces them, and the worker claims
        # and drives again.
        killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE application_name = %s", (name,)).fetchone()
        assert killed is not None and killed[0] >= 2
        async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
            second = await front.session("ops", "s2").start("hi", turn_id="t2")
            assert (await front.session("ops", "s2").result(second.turn_id)).text == "done"
        assert not working.done()
    finally:
        admin.close()
        working.cancel()
        await asyncio.gather(working, return_exceptions=True)
        await worker.close()
        await front.close()


# -- a backend killed while a tool waits on request_input's read -------------------------


async def test_a_backend_killed_inside_request_input_abandons_the_step(pg_dsn: str) -> None:
    """The crash sweep's finding: a backend terminated while a remote tool was inside
    ``ctx.request_input`` made the store's error the tool's result. Now the step is
    abandoned, the turn is driven again, the request is stored once and the approval
    completes."""
    import uuid

    from durable_turns import Agent, ModelReply, Runtime, ToolCall, scripted, tool
    from durable_turns.events import ActionCompleted, InputRequested
    from durable_turns.models import ModelRequest
    from durable_turns.models.scripted import calls_this_turn

    name = f"hitl-{uuid.uuid4().hex[:8]}"
    inside, go = asyncio.Event(), asyncio.Event()
    met: list[str] = []

    @tool
    async def refund(order: str, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order once a person approves."""
        if not inside.is_set():
            inside.set()
            async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
                await go.wait()
        try:
            ok = await ctx.request_input("approve", f"Refund order {order}?",
                                         schema={"type": "boolean"})
        except Exception as e:
            met.append(type(e).__name__)
            raise
        return {"refunded": ok}

    def reply(request: ModelRequest) -> ModelReply:
        if calls_this_turn(request) == 0:
            return ModelReply("Asking.", [ToolCall("c1", "refund", {"order": "42"})])
        return ModelReply(f"Done: {request.messages[-1].result}")

    store = PostgresStore(psycopg.conninfo.make_conninfo(pg_dsn, application_name=name))
    rt = Runtime([Agent("ops", tools=[refund])], store, scripted(reply))
    admin = psycopg.connect(pg_dsn, autocommit=True)
    locker = psycopg.connect(pg_dsn)
    try:
        session = rt.session("ops", "s1")
        await session.start("refund 42", turn_id="t1")
        async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
            await inside.wait()
        # The test holds the step log's lock: request_input's read of its answer waits on
        # it, and is then killed, as often as it is tried, until the tool has met the error.
        locker.execute("LOCK TABLE log IN ACCESS EXCLUSIVE MODE")
        go.set()
        killed = 0
        deadline = time.monotonic() + pgkit.CHILD_TIMEOUT
        while not met:
            assert time.monotonic() < deadline, "request_input's read never failed"
            row = admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                                "AND wait_event_type = 'Lock'", (name,)).fetchone()
            if row is not None:
                admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                killed += 1
            await asyncio.sleep(0.01)
        locker.rollback()
        assert met == ["StoreError"] and killed >= 1
        async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
            parked = await session.result("t1")
            assert parked.status == "suspended", parked
            await session.resume("t1", "approve", True)
            done = await session.result("t1")
        events = await session.events()
    finally:
        locker.close()
        admin.close()
        await rt.close()
    assert [e.request.id for e in events if isinstance(e, InputRequested)] == ["approve"]
    assert [e.result for e in events if isinstance(e, ActionCompleted)] == [{"refunded": True}]
    assert (done.status, done.text) == ("completed", "Done: {'refunded': True}")
