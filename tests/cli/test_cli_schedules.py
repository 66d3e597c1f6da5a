"""F24: ``durable-turns schedules APP_DIR list|add|remove``, and ``schedules = [...]`` in an
app folder's agent.py (checked at load, stored by ``worker``/``serve``)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest

from durable_turns import SqliteStore
from durable_turns._loader import load_app
from durable_turns.cli import main
from durable_turns.errors import ConfigurationError
from durable_turns.records import SessionKey
from durable_turns.schedules import fire_turn_id

WAIT = 60.0
T = TypeVar("T")


async def read(db: Path, what: Callable[[SqliteStore], Awaitable[T]]) -> T:
    store = SqliteStore(db)
    await store.open()
    try:
        return await what(store)
    finally:
        await store.close()


def app(tmp_path: Path, agent_py: str = "") -> Path:
    folder = tmp_path / "ops"
    folder.mkdir()
    (folder / "instructions.md").write_text("Report.")
    (folder / "agent.py").write_text(agent_py)
    return folder


def test_add_list_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, db = app(tmp_path), str(tmp_path / "store.db")
    assert main(["schedules", str(folder), "add", "standup", "--db", db, "--seed",
                 "Post the standup", "--cron", "0 9 * * 1-5", "--tz", "Europe/Paris",
                 "--overlap", "queue"]) == 0
    assert "standup\tcron '0 9 * * 1-5' Europe/Paris\tnext " in capsys.readouterr().out
    assert main(["schedules", str(folder), "add", "hourly", "--db", db, "--seed", "Check",
                 "--every", "3600"]) == 0
    capsys.readouterr()
    assert main(["schedules", str(folder), "list", "--db", db, "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(s["name"], s["agent"], s["overlap"]) for s in listed] == [
        ("hourly", "ops", "skip"), ("standup", "ops", "queue")]
    assert listed[1]["next_fire"].endswith(("T08:00:00+00:00", "T07:00:00+00:00"))
    assert main(["schedules", str(folder), "remove", "hourly", "--db", db]) == 0
    assert main(["schedules", str(folder), "list", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "hourly" not in out.replace("removed schedule 'hourly'", "") and "standup" in out


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    folder, db = app(tmp_path), str(tmp_path / "store.db")
    assert main(["schedules", str(folder), "add", "x", "--db", db, "--seed", "Go",
                 "--cron", "every day"]) == 2
    err = capsys.readouterr().err
    assert "cron 'every day' does not parse" in err and "Traceback" not in err
    assert main(["schedules", str(folder), "add", "x", "--db", db, "--seed", "Go",
                 "--every", "60", "--tz", "Nowhere/Land"]) == 2
    assert "unknown time zone 'Nowhere/Land'" in capsys.readouterr().err
    assert main(["schedules", str(folder), "remove", "x", "--db", db]) == 2
    assert "no schedule named 'x'" in capsys.readouterr().err
    assert main(["schedules", str(folder), "list", "--db", db]) == 0
    assert "no schedules of agent 'ops'" in capsys.readouterr().out


def test_agent_py_declares_schedules(tmp_path: Path) -> None:
    folder = app(tmp_path, 'schedules = [{"name": "daily", "seed": "Digest", '
                           '"cron": "0 7 * * *", "tz": "UTC", "missed": "run_once"}]\n')
    (daily,) = load_app(folder).schedules
    assert daily == {"name": "daily", "seed": "Digest", "cron": "0 7 * * *", "tz": "UTC",
                     "missed": "run_once", "agent": "ops"}


@pytest.mark.parametrize(("agent_py", "message"), [
    ('schedules = {"name": "x"}\n', "schedules must be a list"),
    ('schedules = [{"seed": "x", "every": 60}]\n', "must be a mapping with a name"),
    ('schedules = [{"name": "x", "seed": "x", "every": 60, "at": "2026-01-01T00:00:00Z"}]\n',
     "exactly one of cron=, every= or at="),
    ('schedules = [{"name": "x", "seed": "x", "every": 60, "overlap": "no"}]\n',
     "overlap must be one of"),
])
def test_agent_py_schedules_are_checked_at_load(tmp_path: Path, agent_py: str,
                                                message: str) -> None:
    folder = app(tmp_path, agent_py)
    with pytest.raises(ConfigurationError, match=message) as caught:
        load_app(folder)
    assert "agent.py" in str(caught.value)


async def test_worker_stores_and_fires_the_app_folder_s_schedules(tmp_path: Path) -> None:
    """``durable-turns worker`` (a real process) stores agent.py's schedules as it starts and
    its clock fires them: an ``at`` already past fires at once, once."""
    folder = app(tmp_path, (
        "from durable_turns import ModelReply, scripted\n"
        "model = scripted(lambda _request: ModelReply('digest posted'))\n"
        'schedules = [{"name": "digest", "seed": "Post the digest", '
        '"at": "2026-01-01T09:00:00+00:00"}]\n'))
    db = tmp_path / "store.db"
    key = SessionKey("ops", "schedule:digest")
    turn = fire_turn_id("digest", datetime(2026, 1, 1, 9, tzinfo=UTC))
    with (tmp_path / "stderr").open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "durable_turns.cli", "worker",
                                 str(folder), "--store", str(db), "--poll-interval", "0.05"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err)
    try:
        deadline = time.monotonic() + WAIT
        while True:  # the worker's writes, read from the same file
            assert proc.poll() is None, (tmp_path / "stderr").read_text()
            assert time.monotonic() < deadline, "timed out waiting for the worker's fire"
            if db.exists():
                found = await read(db, lambda store: store.entries(key, turn_id=turn))
                if found and found[0].status.final:
                    break
            await asyncio.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=WAIT)
    assert proc.returncode == 130, (tmp_path / "stderr").read_text()
    (entry,) = await read(db, lambda store: store.entries(key))
    (stored,) = await read(db, lambda store: store.schedules.all())
    assert (entry.turn_id, entry.status.value, entry.text) == (turn, "completed",
                                                               "digest posted")
    assert stored.next_fire is None and stored.last_turn == turn
