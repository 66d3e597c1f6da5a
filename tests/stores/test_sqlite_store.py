"""F1: SqliteStore: opening, refusing foreign files, persistence across reopen."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_turns import (
    Agent,
    ModelReply,
    Runtime,
    SqliteStore,
    ToolCall,
    ToolContext,
    scripted,
    tool,
)
from durable_turns.errors import StoreError
from durable_turns.messages import Message
from durable_turns.records import NewEntry, SessionKey


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


async def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    before = digest(db)
    with pytest.raises(StoreError, match="another application"):
        await SqliteStore(db).open()
    assert digest(db) == before
    assert not (tmp_path / "app.db-wal").exists()


async def test_a_corrupt_file_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "notes.txt"
    db.write_bytes(b"this is not a database at all\n" * 200)
    before = digest(db)
    with pytest.raises(StoreError, match="not a SQLite database or is corrupt"):
        await SqliteStore(db).open()
    assert digest(db) == before


def _foreign(path: Path, *, wal: bool = False, app_id: int = 0) -> None:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    if app_id:
        conn.execute(f"PRAGMA application_id = {app_id}")
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.execute("INSERT INTO customers VALUES (1)")
    conn.commit()
    conn.close()  # the last connection: SQLite removes the -wal and -shm files


def _cut_short(path: Path) -> None:
    _foreign(path)
    path.write_bytes(path.read_bytes()[:1500])


BAD_FILES: dict[str, Callable[[Path], object]] = {
    "corrupt": lambda p: p.write_bytes(b"this is not a database at all\n" * 200),
    "a header only": lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 84),
    "cut short": _cut_short,
    "foreign": _foreign,
    "foreign in WAL mode": lambda p: _foreign(p, wal=True),
    "another application's id": lambda p: _foreign(p, app_id=0x12345678),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
async def test_a_refused_file_is_left_as_it_was_with_nothing_beside_it(
        tmp_path: Path, kind: str) -> None:
    db = tmp_path / "store.db"
    BAD_FILES[kind](db)
    before = digest(db)
    for _ in range(2):  # the second open finds what the first left, if anything
        with pytest.raises(StoreError) as refused:
            await SqliteStore(db).open()
        assert str(db) in str(refused.value)
    assert digest(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.db"]  # no -wal, -shm, -lease


async def test_an_empty_file_becomes_a_store_only_when_asked(tmp_path: Path) -> None:
    db = tmp_path / "made-by-mktemp.db"
    db.touch()
    with pytest.raises(StoreError, match=r"empty file.*create=True"):
        await SqliteStore(db).open()
    store = SqliteStore(db, create=True)
    await store.open()
    await store.enqueue(SessionKey("a", "s"), NewEntry("t1", Message("user", "hi")))
    await store.close()
    reopened = SqliteStore(db)  # a store now: opened without create
    await reopened.open()
    assert [t.turn_id for t in await reopened.entries(SessionKey("a", "s"))] == ["t1"]
    await reopened.close()


def test_stores_opening_one_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """Openers racing to create the same file: the one that looks while another is half-way
    through making it waits for it instead of taking it for an empty file not ours. (Threads,
    each with its own descriptions and locks, interleave like processes and cost less; the
    race lost about one round in six before it was fixed.)"""
    def open_at_once(path: Path, n: int) -> list[str]:
        barrier = threading.Barrier(n)
        failures: list[str] = []

        async def open_close() -> None:
            store = SqliteStore(path)
            await store.open()
            await store.close()

        def opener() -> None:
            barrier.wait(timeout=30)
            try:
                asyncio.run(open_close())
            except StoreError as e:
                failures.append(str(e))

        threads = [threading.Thread(target=opener) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        return failures

    for i in range(50):
        assert open_at_once(tmp_path / f"new-{i}.sqlite", 8) == []


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    store = SqliteStore(db)
    await store.open()
    store.unwrap().execute("PRAGMA user_version = 99")
    await store.close()
    with pytest.raises(StoreError, match="newer than this durable_turns knows"):
        await SqliteStore(db).open()


async def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="needs a file"):
        SqliteStore(":memory:")
    with pytest.raises(ValueError, match="synchronous"):
        SqliteStore(tmp_path / "x", synchronous="sometimes")
    with pytest.raises(StoreError, match="not open"):
        SqliteStore(tmp_path / "x").unwrap()


async def test_sessions_survive_a_reopen_in_wal_mode(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    agent = Agent("ops", "")
    rt = Runtime([agent], SqliteStore(db), scripted([ModelReply("first")]))
    await rt.open()
    await rt.session("ops", "s1").turn("hello")
    assert rt.store.unwrap().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    await rt.close()
    rt2 = Runtime([agent], SqliteStore(db), scripted([ModelReply("second")]))
    await rt2.open()
    s = rt2.session("ops", "s1")
    await s.turn("again")
    assert [m.text for m in await s.transcript()] == ["hello", "first", "again", "second"]
    assert [e.seq for e in await s.events()] == list(range(1, 7))
    await rt2.close()


async def test_a_slow_local_tool_leaves_the_loop_running(tmp_path: Path) -> None:
    """A local tool runs on the store's thread: one that outlasts the loop's short wait for it
    ends only once the loop has run other work meanwhile, and its step commits as usual."""
    loop_ran = threading.Event()

    @tool
    def slow(ctx: ToolContext) -> dict[str, bool]:
        """Wait for the loop to run other work."""
        ran = loop_ran.wait(timeout=30)
        ctx.store.unwrap().execute("INSERT INTO effects VALUES (?)", (ctx.call_id,))
        return {"loop_ran": ran}

    model = scripted([ModelReply(tool_calls=[ToolCall("c1", "slow", {})]), ModelReply("done")])
    store = SqliteStore(tmp_path / "db.sqlite")
    async with Runtime([Agent("a", "", [slow])], store, model) as rt:
        store.unwrap().execute("CREATE TABLE effects (call_id TEXT)")

        async def other_work() -> None:
            await asyncio.sleep(0.01)
            loop_ran.set()

        other = asyncio.create_task(other_work())
        result = await rt.session("a", "s").turn("go", turn_id="t1")
        await asyncio.wait_for(other, 30)
        transcript = await rt.session("a", "s").transcript()
        rows = store.unwrap().execute("SELECT call_id FROM effects").fetchall()
    assert result.status == "completed"
    assert [m.result for m in transcript if m.role == "tool"] == [{"loop_ran": True}]
    assert rows == [("c1",)]


async def test_a_claim_after_another_store_wrote_counts_from_its_rows(tmp_path: Path) -> None:
    # A store keeps the counters of the leases it released, and trusts them only when its
    # next claim's epoch follows directly; here another store (another process, as far as
    # the file knows) held the session in between and wrote two steps.
    from durable_turns.events import TurnStarted
    from durable_turns.messages import Message
    from durable_turns.records import SessionKey

    key = SessionKey("ops", "s1")
    a, b = SqliteStore(tmp_path / "db.sqlite"), SqliteStore(tmp_path / "db.sqlite")
    await a.open()
    await b.open()
    try:
        for store, text in ((a, "one"), (b, "two"), (b, "three"), (a, "four"), (a, "five")):
            lease = await store.claim(key, timeout=10)
            async with lease.transaction() as tx:
                tx.add_message(Message("user", text, turn_id="t1"))
                tx.add_event(TurnStarted(agent="ops", session="s1", turn_id="t1", text=text))
            await lease.release()
        assert [m.text for m in await a.read_messages(key)] == ["one", "two", "three", "four",
                                                                 "five"]
        assert [e.seq for e in await b.read_events(key)] == [1, 2, 3, 4, 5]
    finally:
        await a.close()
        await b.close()


async def test_a_long_session_keeps_its_messages_in_transcript_rows(tmp_path: Path) -> None:
    # The commits that start and end turns copy the messages into few ``log_transcript`` rows
    # once TRANSCRIPT_CHUNK of them are not copied yet; a runtime that starts afresh reads
    # the transcript from them (and the log rows after them), the same messages.
    from durable_turns.stores.sqlite import TRANSCRIPT_CHUNK

    @tool
    def step(k: int) -> dict[str, int]:
        """One step."""
        return {"k": k}

    def reply(request: object) -> ModelReply:
        msgs = request.messages  # type: ignore[attr-defined]
        k = sum(1 for m in msgs if m.role == "tool" and m.turn_id == msgs[-1].turn_id)
        if k < 4:
            return ModelReply(f"step {k}", [ToolCall(f"{msgs[-1].turn_id}-{k}", "step",
                                                     {"k": k})])
        return ModelReply("done")

    db = tmp_path / "db.sqlite"
    agent = Agent("ops", "", [step])
    async with Runtime([agent], SqliteStore(db), scripted(reply)) as rt:
        s = rt.session("ops", "s1")
        for t in range(12):  # 10 messages a turn
            await s.turn(f"turn {t}", turn_id=f"t{t}")
        before = await s.transcript()
    assert len(before) == 120
    c = sqlite3.connect(db)
    try:
        rows = c.execute("SELECT n, body FROM log_transcript ORDER BY n").fetchall()
    finally:
        c.close()
    assert len(rows) >= 2 and rows[-1][0] > 120 - TRANSCRIPT_CHUNK
    assert sum(len(body.split("\n")) for _, body in rows) == rows[-1][0]
    async with Runtime([agent], SqliteStore(db), scripted(reply)) as rt:
        s = rt.session("ops", "s1")
        assert await s.transcript() == before
        assert [m.text for m in (await s.transcript())[-3:]] == ["step 3", "", "done"]
        r = await s.turn("one more", turn_id="t12")
        assert r.text == "done" and len(await s.transcript()) == 130


async def test_a_long_history_not_yet_copied_is_copied_a_bounded_piece_per_commit(
        tmp_path: Path) -> None:
    # A database of schema version 3 has long logs and no transcript rows: a commit copies
    # at most TRANSCRIPT_COPY_ROWS log rows, and the reads stay whole meanwhile.
    from durable_turns.events import TurnStarted
    from durable_turns.messages import Message
    from durable_turns.records import SessionKey, TurnResult, TurnStatus
    from durable_turns.stores.sqlite import TRANSCRIPT_COPY_ROWS

    key, db = SessionKey("ops", "s1"), tmp_path / "db.sqlite"
    store = SqliteStore(db)
    await store.open()

    def copied() -> list[tuple[int, int]]:
        c = sqlite3.connect(db)
        try:
            return c.execute("SELECT gen, n FROM log_transcript ORDER BY n").fetchall()
        finally:
            c.close()

    try:
        written: list[Message] = []
        for t in ("t1", "t2"):
            await store.enqueue(key, NewEntry(t, Message("user", t, turn_id=t)))
            lease = await store.claim(key)
            async with lease.transaction() as tx:
                written.append(Message("user", t, turn_id=t))
                tx.add_message(written[-1])
                tx.add_event(TurnStarted(agent="ops", session="s1", turn_id=t, text=t))
                tx.set_turn(TurnResult(t, TurnStatus.RUNNING))
            if t == "t2":  # the turn's start copied the rest
                assert copied() == [(0, TRANSCRIPT_COPY_ROWS), (0, len(written))]
                break
            for k in range(TRANSCRIPT_COPY_ROWS + 100):
                async with lease.transaction() as tx:
                    written.append(Message("assistant", f"{t} {k}", turn_id=t))
                    tx.add_message(written[-1])
            async with lease.transaction() as tx:
                tx.set_turn(TurnResult(t, TurnStatus.COMPLETED, text="done"))
            await lease.release()
            assert copied() == [(0, TRANSCRIPT_COPY_ROWS)]  # of 1,101 messages
            assert await store.read_messages(key) == written
            assert await store.read_messages(key, after=999) == written[999:]
        await lease.release()
        assert await store.read_messages(key) == written
        assert await store.read_messages(key, after=1050) == written[1050:]
    finally:
        await store.close()


def wal_position(wal: Path) -> tuple[int, int]:
    """The WAL's checkpoint sequence number (it goes up each time the WAL starts over) and the
    frames it holds now: those from its start whose salt is the header's (SQLite's WAL file
    format; frames left from before a restart carry an older salt)."""
    data = wal.read_bytes()
    if len(data) < 32:
        return 0, 0
    page = int.from_bytes(data[8:12], "big")
    sequence, salt = int.from_bytes(data[12:16], "big"), data[16:24]
    frames, at = 0, 32
    while at + 24 + page <= len(data) and data[at + 8:at + 16] == salt:
        frames, at = frames + 1, at + 24 + page
    return sequence, frames


async def test_the_wal_starts_over_while_commits_never_pause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Checkpoints run on the writer thread while the loop goes on committing, so the WAL
    # would never find a moment to start over. Once it holds WAL_RESTART_FRAMES frames, a
    # checkpoint runs with the writes held back, and the next commit starts the WAL again.
    # The mechanism is checked, not a bound: how far the WAL grows between two restarts
    # depends on the machine's speed (bench/steps.py reports what a step costs).
    from durable_turns.events import TurnStarted
    from durable_turns.messages import Message
    from durable_turns.records import SessionKey
    from durable_turns.stores import sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "CHECKPOINT_EVERY", 32)
    monkeypatch.setattr(sqlite_store, "WAL_RESTART_FRAMES", 256)
    key, db = SessionKey("ops", "s1"), tmp_path / "db.sqlite"
    wal = tmp_path / "db.sqlite-wal"
    store = SqliteStore(db)
    await store.open()
    restarts: list[tuple[int, int]] = []  # (frames before, frames after) each restart
    try:
        await store.enqueue(key, NewEntry("t1", Message("user", "go", turn_id="t1")))
        lease = await store.claim(key)
        sequence, frames = wal_position(wal)
        for k in range(3000):
            async with lease.transaction() as tx:
                tx.add_message(Message("assistant", f"step {k}", turn_id="t1"))
                tx.add_event(TurnStarted(agent="ops", session="s1", turn_id="t1", text="x"))
            now, held = wal_position(wal)
            if now != sequence:
                restarts.append((frames, held))
            sequence, frames = now, held
            await asyncio.sleep(0)  # the loop's other work between steps (a model call)
        await lease.release()
        assert len(await store.read_messages(key)) == 3000
    finally:
        await store.close()
    # 3,000 commits write several thousand frames: the WAL started over while they went on,
    # and each time it held fewer frames than before.
    assert len(restarts) >= 2, f"the WAL started over {len(restarts)} times"
    assert all(after < before for before, after in restarts), restarts
