"""F14: PostgresStore beyond the conformance suite: migrations under concurrency, leases that
expire and are fenced, and real worker processes killed or paused on real PostgreSQL.

Every test needs ``DURABLE_TURNS_TEST_PG`` (a DSN; ``.ci/run`` starts a throwaway cluster)
and skips without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import pgkit
from conftest import assert_slotted
from durable_turns import LeaseLostError, Message, SessionKey
from durable_turns.errors import LeaseTimeoutError
from durable_turns.records import NewEntry
from durable_turns.scheduling import ClaimingScheduler, NoDriveScheduler
from durable_turns.testing import get_turn

KEY = SessionKey("ops", "s1")


async def test_many_processes_opening_a_new_database_migrate_it_once(pg_dsn: str) -> None:
    from durable_turns import PostgresStore
    from durable_turns.stores.sql import SCHEMA_VERSION

    stores = [PostgresStore(pg_dsn) for _ in range(6)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        rows = stores[0].unwrap().execute("SELECT version FROM durable_turns_schema").fetchall()
        assert rows == [(SCHEMA_VERSION,)]
        await stores[1].enqueue(KEY, NewEntry("t1", Message("user", "hi", turn_id="t1")))
        assert await stores[2].find_sessions("unfinished") == [KEY]
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_a_heartbeat_keeps_a_lease_and_an_expired_one_is_taken_over(pg_dsn: str) -> None:
    from durable_turns import PostgresStore

    a, b = PostgresStore(pg_dsn, lease_ttl=1.0), PostgresStore(pg_dsn, lease_ttl=1.0)
    await a.open()
    await b.open()
    try:
        await a.enqueue(KEY, NewEntry("t1", Message("user", "hi", turn_id="t1")))
        held = await a.claim(KEY)
        # Renewed every ttl/3: still held well past one ttl.
        with pytest.raises(LeaseTimeoutError):
            await b.claim(KEY, timeout=2.5)
        await a.stop_heartbeat(held)  # as if its process were paused: the lease expires
        async with asyncio.timeout(30):
            taken = await b.claim(KEY)
        assert taken.epoch > held.epoch
        with pytest.raises(LeaseLostError):
            async with held.transaction() as tx:
                tx.add_message(Message("user", "hi", turn_id="t1"))
        async with taken.transaction() as tx:
            tx.add_message(Message("user", "hi", turn_id="t1"))
        await taken.release()
        assert len(await b.read_messages(KEY)) == 1
        # Released: claimed at once by anyone.
        again = await a.claim(KEY, timeout=5)
        await again.release()
    finally:
        await a.close()
        await b.close()


def _spawn(dsn: str, work: Path, tag: str, *args: str) -> subprocess.Popen[bytes]:
    with (work / f"stderr-{tag}").open("wb") as err:  # the child keeps its own descriptor
        return subprocess.Popen(pgkit.command(dsn, work, tag, *args), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)


def _wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + pgkit.CHILD_TIMEOUT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _finish(proc: subprocess.Popen[bytes], work: Path, tag: str) -> str:
    """Wait for a child to end (bounded); returns what it wrote to stderr."""
    try:
        proc.wait(timeout=pgkit.CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return (work / f"stderr-{tag}").read_text()


def _report(work: Path, tag: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((work / f"report-{tag}.json").read_text())
    return data


def _orders(dsn: str) -> list[tuple[str, int]]:
    import psycopg

    with psycopg.connect(dsn) as c:
        rows = c.execute("SELECT call_id, pid FROM orders ORDER BY call_id").fetchall()
    return [(r[0], r[1]) for r in rows]


async def _turn_status(dsn: str) -> str:
    from durable_turns import PostgresStore

    store = PostgresStore(dsn)
    await store.open()
    try:
        rec = await get_turn(store, KEY, pgkit.TURN_ID)
        assert rec is not None
        return str(rec.status)
    finally:
        await store.close()


async def test_a_killed_worker_is_replaced_and_its_local_writes_vanish(
        pg_dsn: str, tmp_path: Path) -> None:
    a = _spawn(pg_dsn, tmp_path, "a", "--start", "--hold")
    try:
        _wait_for(lambda: (tmp_path / "held-a").exists() or a.poll() is not None, "held-a")
        assert a.poll() is None, (tmp_path / "stderr-a").read_text()
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=pgkit.CHILD_TIMEOUT)
    b = _spawn(pg_dsn, tmp_path, "b")
    err = _finish(b, tmp_path, "b")
    assert b.returncode == 0, err
    assert _report(tmp_path, "b")["status"] == "completed"
    assert _orders(pg_dsn) == [("c1", b.pid), ("c2", b.pid)]  # each exactly once
    assert await _turn_status(pg_dsn) == "completed"


async def test_a_paused_worker_neither_blocks_the_takeover_nor_commits(
        pg_dsn: str, tmp_path: Path) -> None:
    """A is SIGSTOPped inside its local tool, its order row written and locked (orders has a
    unique key per call). B takes the session over and writes the same call's row: without
    the step connections' idle-in-transaction timeout it would wait on A's lock for as long
    as A is paused. A, woken, commits nothing."""
    a = _spawn(pg_dsn, tmp_path, "a", "--start", "--hold")
    try:
        _wait_for(lambda: (tmp_path / "held-a").exists() or a.poll() is not None, "held-a")
        assert a.poll() is None
        os.kill(a.pid, signal.SIGSTOP)  # inside its local tool, its row not committed
        b = _spawn(pg_dsn, tmp_path, "b")  # takes the lease over once it expires
        err = _finish(b, tmp_path, "b")
        assert b.returncode == 0, err
        assert _report(tmp_path, "b")["status"] == "completed"
        (tmp_path / "go-a").touch()
    finally:
        os.kill(a.pid, signal.SIGCONT)
    err = _finish(a, tmp_path, "a")
    # A's commit was refused (a newer epoch): nothing of its step, its row included, landed.
    assert _orders(pg_dsn) == [("c1", b.pid), ("c2", b.pid)]
    assert a.returncode == 0, err
    assert _report(tmp_path, "a")["status"] == "completed"  # B's result, read from the store
    assert await _turn_status(pg_dsn) == "completed"


async def test_two_workers_race_over_fifty_sessions(pg_dsn: str, tmp_path: Path) -> None:
    from durable_turns import PostgresStore

    store = PostgresStore(pg_dsn)
    await store.open()
    keys = [SessionKey(pgkit.AGENT, f"s{i}") for i in range(50)]
    try:
        for key in keys:
            for t in ("t1", "t2"):
                await store.enqueue(key, NewEntry(t, Message("user", "order", turn_id=t)))
        workers = {tag: _spawn(pg_dsn, tmp_path, tag, "--work") for tag in ("w1", "w2")}
        try:
            _wait_for(lambda: all((tmp_path / f"ready-{t}").exists() or p.poll() is not None
                                  for t, p in workers.items()), "the workers")
            (tmp_path / "go").touch()  # both start looking for work together
            for tag, proc in workers.items():
                err = _finish(proc, tmp_path, tag)
                assert proc.returncode == 0, err
        finally:
            for proc in workers.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        rows = store.unwrap().execute(
            "SELECT session, turn_id, count(*) FROM orders GROUP BY session, turn_id").fetchall()
        assert sorted(rows) == sorted((k.session, t, 1) for k in keys for t in ("t1", "t2"))
        for key in keys:
            events = await store.read_events(key)
            started = [e.turn_id for e in events if e.type == "turn.started"]
            done = [e.turn_id for e in events if e.type == "turn.completed"]
            assert started == done == ["t1", "t2"], (key, started, done)  # once each, in order
        assert await store.find_sessions("unfinished") == []
    finally:
        await store.close()


async def test_a_subscriber_hears_another_process_commit_through_notify(pg_dsn: str) -> None:
    from durable_turns import PostgresStore, TurnEvent
    from durable_turns.events import TurnStarted

    reader, writer = PostgresStore(pg_dsn), PostgresStore(pg_dsn)
    await reader.open()
    await writer.open()
    try:
        heard: list[list[TurnEvent] | None] = []
        stop = reader.watch(KEY, heard.append)
        async with reader.subscribe(KEY, after_seq=0) as sub:
            lease = await writer.claim(KEY)
            async with lease.transaction() as tx:
                tx.add_event(TurnStarted(agent=KEY.agent, session=KEY.session, turn_id="t1"))
            await lease.release()
            async with asyncio.timeout(10):
                got = await anext(sub)
        stop()
        assert got.seq == 1 and got.turn_id == "t1"
        assert None in heard  # the watcher was told to look again
    finally:
        await reader.close()
        await writer.close()



async def test_listeners_made_before_the_store_opens_hear_another_process(
        pg_dsn: str, tmp_path: Path) -> None:
    """An observer and a subscriber made before the store opens, for a session that does not
    exist yet, hear the whole turn another process then drives (through NOTIFY)."""
    from durable_turns import ModelReply, PostgresStore, Runtime, TurnEvent, scripted

    rt = Runtime([pgkit.build_agent(tmp_path, "observer", False)], PostgresStore(pg_dsn),
                 scripted([ModelReply("never")]))
    seen: list[TurnEvent] = []
    ended = asyncio.Event()

    def observed(e: TurnEvent) -> None:
        seen.append(e)
        if e.type == "turn.completed":
            ended.set()

    unobserve = rt.session(KEY.agent, KEY.session).observe(observed, turn_id=pgkit.TURN_ID)
    sub = rt.subscribe(KEY)
    try:
        await rt.open()
        async with sub:  # ready: the cursor is fixed at 0, before the child starts
            child = _spawn(pg_dsn, tmp_path, "driver", "--start")
            err = await asyncio.to_thread(_finish, child, tmp_path, "driver")
            assert child.returncode == 0, err
            # The turn is stored by now: the feed has a re-poll or two to bring it here.
            got: list[TurnEvent] = []
            async with asyncio.timeout(10):
                async for e in sub:
                    got.append(e)
                    if e.type == "turn.completed":
                        break
                await ended.wait()
        unobserve()
        stored = await rt.store.read_events(KEY)
    finally:
        await rt.close()
    assert stored[0].type == "turn.started" and stored[-1].type == "turn.completed"
    assert_slotted(got, stored)
    assert_slotted(seen, stored)


async def test_the_worker_command_drives_queued_turns(pg_dsn: str, tmp_path: Path) -> None:
    import sys
    from urllib.parse import quote

    import psycopg

    from conftest import PG_DSN
    from durable_turns import PostgresStore

    # The command takes a URL: the test schema goes in its options.
    options = psycopg.conninfo.conninfo_to_dict(pg_dsn)["options"]
    url = f"{PG_DSN}?options={quote(str(options))}"

    app = tmp_path / "ops"
    app.mkdir()
    (app / "instructions.md").write_text("You run ops.")
    (app / "agent.py").write_text(
        "from durable_turns import ModelReply, scripted\n"
        "model = scripted(lambda _request: ModelReply('done'))\n")
    store = PostgresStore(pg_dsn)
    await store.open()
    try:
        for i in range(3):
            await store.enqueue(SessionKey("ops", f"s{i}"),
                                NewEntry("t1", Message("user", "hi", turn_id="t1")))
        with (tmp_path / "stderr").open("wb") as err:
            # faulthandler: a worker that does not stop dumps its threads' stacks on SIGABRT.
            proc = subprocess.Popen(
                [sys.executable, "-m", "durable_turns.cli", "worker", str(app), "--store",
                 url, "--lease-ttl", "1", "--poll-interval", "0.05"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        try:
            deadline = time.monotonic() + pgkit.CHILD_TIMEOUT
            while await store.find_sessions("unfinished"):
                assert proc.poll() is None, (tmp_path / "stderr").read_text()
                assert time.monotonic() < deadline, "timed out waiting for the worker"
                await asyncio.sleep(0.02)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=pgkit.CHILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                proc.wait(timeout=pgkit.CHILD_TIMEOUT)
        assert proc.returncode == 130, (tmp_path / "stderr").read_text()
        for i in range(3):
            rec = await get_turn(store, SessionKey("ops", f"s{i}"), "t1")
            assert rec is not None and (rec.status, rec.text) == ("completed", "done")
    finally:
        await store.close()


async def test_a_connection_lost_mid_step_abandons_the_whole_step(pg_dsn: str) -> None:
    from typing import Any

    from durable_turns import PostgresStore
    from durable_turns.errors import StoreError

    store = PostgresStore(pg_dsn, pool_size=1)
    await store.open()
    try:
        store.unwrap().execute("CREATE TABLE rows (v TEXT)")
        lease = await store.claim(KEY)
        pids: list[int] = []

        def first(h: Any) -> None:
            h.execute("INSERT INTO rows VALUES ('first')")
            pids.append(h.info.backend_pid)

        def second(h: Any) -> None:
            h.execute("INSERT INTO rows VALUES ('second')")  # the connection is gone

        with pytest.raises(StoreError, match="lost mid-step"):
            async with lease.transaction() as tx:
                await tx.run_local(first)
                store.unwrap().execute("SELECT pg_terminate_backend(%s)", (pids[0],))
                with pytest.raises(Exception):  # noqa: B017 - whatever psycopg raises
                    await tx.run_local(second)
                tx.add_message(Message("user", "hi", turn_id="t1"))
        assert store.unwrap().execute("SELECT v FROM rows").fetchall() == []
        assert await store.read_messages(KEY) == []  # a new connection serves the next step
        async with lease.transaction() as tx:
            await tx.run_local(first)
        await lease.release()
        assert store.unwrap().execute("SELECT v FROM rows").fetchall() == [("first",)]
    finally:
        await store.close()


async def test_a_turn_driven_by_a_worker_streams_to_a_server_that_does_not_drive(
    pg_dsn: str, tmp_path: Path,
) -> None:
    """The production shape: `serve --no-drive` accepts, a `worker` process drives, and the
    server's SSE client sees every event of the turn, live, through NOTIFY."""
    import socket
    import sys
    from urllib.parse import quote

    import httpx
    import psycopg

    from conftest import PG_DSN

    options = psycopg.conninfo.conninfo_to_dict(pg_dsn)["options"]
    url = f"{PG_DSN}?options={quote(str(options))}"
    app = tmp_path / "ops"
    app.mkdir()
    (app / "instructions.md").write_text("You run ops.")
    (app / "agent.py").write_text(
        "import os\n"
        "from durable_turns import ModelReply, scripted\n"
        "model = scripted(lambda _request: ModelReply(f'done by pid {os.getpid()}'))\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def spawn(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "durable_turns.cli", *args],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    server = spawn("serve", str(app), "--store", url, "--no-drive", "--port", str(port))
    worker = spawn("worker", str(app), "--store", url, "--lease-ttl", "2",
                   "--poll-interval", "0.05")
    try:
        assert server.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(server.stdout.readline),
                                      pgkit.CHILD_TIMEOUT)
        assert "not driving" in line, line + (server.stderr.read() if server.stderr else "")
        events: list[tuple[str | None, str]] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     timeout=pgkit.CHILD_TIMEOUT) as client, \
                client.stream("POST", "/agents/ops/sessions/s1/turn",
                              json={"text": "hello", "turn_id": "t1"}) as r:
            assert r.status_code == 200
            seq: str | None = None
            async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
                async for line in r.aiter_lines():
                    if line.startswith("id: "):
                        seq = line[4:]
                    elif line.startswith("event: "):
                        events.append((seq, line[7:]))
                        seq = None
                        if line == "event: turn.completed":
                            break
            reply = await client.get("/agents/ops/sessions/s1")
        assert reply.status_code == 200
        text = reply.json()["transcript"][-1]["text"]
    finally:
        for p in (server, worker):
            p.send_signal(signal.SIGINT)
        for p in (server, worker):
            try:
                p.communicate(timeout=pgkit.CHILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
    durable = [(s, t) for s, t in events if t != "message.delta"]
    assert [t for _, t in durable] == ["turn.started", "message.completed", "turn.completed"]
    assert [s for s, _ in durable] == ["1", "2", "3"]
    # The worker drove it (the server drives nothing): its pid is in the reply.
    assert text == f"done by pid {worker.pid}"


def _worker_runtime(store: object, text: str = "done",
                    scheduler: object = None) -> object:
    from durable_turns import Agent, ModelReply, Runtime, scripted

    return Runtime([Agent("ops", "You run ops.", [])], store,  # type: ignore[arg-type]
                   scripted(lambda _request: ModelReply(text)),
                   scheduler=scheduler)  # type: ignore[arg-type]


async def test_a_notification_wakes_a_worker_that_never_polls(pg_dsn: str) -> None:
    from durable_turns import Agent, PostgresStore, Runtime

    # Neither the worker nor its store looks again on a timer in this test's lifetime: only
    # a NOTIFY can tell the worker of the second turn.
    claims = ClaimingScheduler(poll_interval=3600)
    worker = _worker_runtime(PostgresStore(pg_dsn, poll_interval=3600), scheduler=claims)
    assert isinstance(worker, Runtime)
    front = Runtime([Agent("ops")], PostgresStore(pg_dsn), scheduler=NoDriveScheduler())
    working = asyncio.ensure_future(claims.run())
    try:
        async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
            # The first turn may be found by the worker's first look; once it is done, the
            # worker sleeps on its notifications.
            first = await front.session("ops", "s1").start("hi", turn_id="t1")
            assert (await front.session("ops", "s1").result(first.turn_id)).text == "done"
            second = await front.session("ops", "s2").start("hi", turn_id="t2")
            assert (await front.session("ops", "s2").result(second.turn_id)).text == "done"
    finally:
        working.cancel()
        await asyncio.gather(working, return_exceptions=True)
        await worker.close()
        await front.close()


async def test_a_lost_notification_only_delays_a_turn_until_the_re_poll(pg_dsn: str) -> None:
    from durable_turns import PostgresStore, Runtime

    store = PostgresStore(pg_dsn, poll_interval=3600)
    claims = ClaimingScheduler(poll_interval=0.2)
    worker = _worker_runtime(store, scheduler=claims)
    assert isinstance(worker, Runtime)
    working = asyncio.ensure_future(claims.run())
    try:
        await worker.open()
        # Accepted on the worker's own store, below the runtime: its notification is its own
        # connection's, which the listener drops (as it drops every one of its own). Only the
        # worker's re-poll can find the turn.
        await store.enqueue(KEY, NewEntry("t1", Message("user", "hi", turn_id="t1")))
        async with asyncio.timeout(pgkit.CHILD_TIMEOUT):
            while (rec := await get_turn(store, KEY, "t1")) is None or not rec.status.final:
                await asyncio.sleep(0.02)
        assert (rec.status, rec.text) == ("completed", "done")
    finally:
        working.cancel()
        await asyncio.gather(working, return_exceptions=True)
        await worker.close()
