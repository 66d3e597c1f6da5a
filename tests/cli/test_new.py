"""F29: ``durable-turns new`` writes an app folder whose own test passes offline, and
``serve --reload`` restarts on a change to the folder with its store, and so its sessions,
kept.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from deploykit import free_port
from durable_turns.cli import main

WAIT = 120.0
"""The bound on every wait, in seconds."""


@pytest.mark.parametrize("template", ["minimal", "ops"])
def test_a_new_app_s_own_test_passes_offline(template: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    app = tmp_path / "my app"
    assert main(["new", str(app), "--template", template]) == 0
    out = capsys.readouterr().out
    assert "tests/test_app.py" in out and "serve" in out and "--model test" in out
    assert {p.name for p in (app / "tools").iterdir()} == (
        {"save_note.py", "send_message.py"} if template == "minimal" else
        {"create_order.py", "refund.py"})
    assert 'name = "my-app"' in (app / "agent.py").read_text()
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist"], cwd=app, capture_output=True, text=True,
                         timeout=WAIT)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout


def test_new_refuses_a_folder_that_is_not_empty(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["new", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not empty" in err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


async def _line_starting(stream: asyncio.StreamReader, prefix: str) -> str:
    while True:
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError(f"the server's output ended before {prefix!r}")
        if line.startswith(prefix):
            return line


async def test_serve_reload_restarts_on_a_change_and_keeps_the_sessions(
        tmp_path: Path) -> None:
    app = tmp_path / "notes"
    assert main(["new", str(app)]) == 0
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_turns.cli", "serve", str(app), "--reload", "--model",
        "test", "--db", str(tmp_path / "notes.db"), "--port", str(port), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    url = f"http://127.0.0.1:{port}/agents/notes/sessions/s1"
    try:
        await asyncio.wait_for(_line_starting(proc.stdout, "serving agent 'notes'"), WAIT)
        async with httpx.AsyncClient(timeout=WAIT) as web:
            parked = (await web.post(f"{url}/chat", json={"text": "hi", "by": "ann"})).json()
            assert parked["status"] == "suspended", parked
            (app / "instructions.md").write_text("You keep notes. Be brief.\n")
            said = await asyncio.wait_for(
                _line_starting(proc.stdout, "durable-turns serve --reload:"), WAIT)
            assert "instructions.md changed; restarting" in said
            await asyncio.wait_for(_line_starting(proc.stdout, "serving agent 'notes'"), WAIT)
            shown = (await web.get(url)).json()
            assert shown["status"] == "suspended", shown
            done = (await web.post(f"{url}/resume", json={
                "turn_id": parked["turn_id"], "input_id": "approve-message", "value": True,
                "by": "ann"})).json()
            assert done["status"] == "completed", done
            assert "save_note returned" in done["text"]
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), WAIT)


def test_the_first_app_guide_serves_parks_crashes_and_approves(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs/getting-started/first-app.md")
    block = page.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.startswith("durable-turns new myapp") and "kill -9" in block
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                 f"{os.environ.get('PATH', '')}"}
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=WAIT,
                         stdin=subprocess.DEVNULL)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert '"status":"suspended"' in ran.stdout  # curl: the served turn parked
    assert "only http:ann may answer" in ran.stdout  # pending, after the crash
    # approve replayed it in a new process: the local tool's step was not run again.
    assert 'save_note returned {"saved": "text", "notes": 1}' in ran.stdout
    assert ran.stdout.rstrip().endswith("the turn completed")
