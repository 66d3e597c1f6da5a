"""F12: The README's first commands on a fresh clone, with no API key: the demo, then ``serve
examples/ops`` answering turns over HTTP and serving its console.

The clone is ``git clone`` of this checkout's committed history (so a file the commands need
but git does not track fails here); its code runs on this interpreter with the clone's
``src`` first on the path, which is what ``pip install -e .`` in a new virtualenv gives (the
install itself is what ``.ci/run`` does, from nothing).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
WAIT = 120.0
"""The bound on every wait, in seconds."""


def first_commands() -> list[list[str]]:
    """The ``durable-turns`` commands of the README's first code block, as argv lists."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert block, "README.md starts with no bash block"
    found = []
    for line in block.group(1).splitlines():
        for part in line.split("#", 1)[0].split("&&"):
            argv = shlex.split(part)
            if argv and argv[0].endswith("/durable-turns"):
                found.append(argv[1:])
    return found


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout")
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True,
                   capture_output=True, timeout=WAIT)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def clean_env(clone: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "OPENAI_", "SLACK_"))}
    return {**env, "PYTHONPATH": str(clone / "src"), "USER": "ann", "LOGNAME": "ann"}


def test_the_readme_starts_with_the_demo_then_serving_the_example() -> None:
    assert first_commands() == [["demo"], ["serve", "examples/ops", "--db", "ops.db"]]


async def test_a_fresh_clone_runs_the_demo_and_serves_examples_ops(clone: Path) -> None:
    env = clean_env(clone)
    demo, serve = first_commands()
    ran = subprocess.run([sys.executable, "-m", "durable_turns.cli", *demo], cwd=clone,
                         env=env, capture_output=True, text=True, timeout=WAIT)
    assert ran.returncode == 0 and "VERDICT: PASS" in ran.stdout, ran.stdout + ran.stderr
    assert "scripted (offline, deterministic)" in ran.stdout

    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_turns.cli", *serve, "--port", str(port), cwd=clone,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        url = f"http://127.0.0.1:{port}"
        banner = [(await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode()
                  for _ in range(3)]
        assert banner[0].startswith(f"serving agent 'ops' at {url}/agents/ops/sessions "
                                    "(store ops.db)"), banner
        assert banner[1] == f"console: {url}/  (open it in a browser)\n"
        assert banner[2].startswith("development mode:")
        async with httpx.AsyncClient(base_url=url, timeout=WAIT) as web:
            page = await web.get("/")
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            ordered = await web.post("/agents/ops/sessions/s1/chat",
                                     json={"text": "order a keyboard and a mouse", "by": "ann"})
            assert ordered.json()["text"] == ("Ordered keyboard (order #1), mouse (order #2).")
            parked = (await web.post("/agents/ops/sessions/s1/chat",
                                     json={"text": "refund order 42, $30", "by": "ann"})).json()
            assert parked["status"] == "suspended"
            assert parked["request"]["prompt"] == "Refund $30.00 on order 42?"
            inbox = (await web.get("/agents/ops/pending")).json()["pending"]
            assert [p["session"] for p in inbox] == ["s1"]
            done = await web.post("/agents/ops/sessions/s1/resume", json={
                "turn_id": parked["turn_id"], "input_id": "approve-refund", "value": True,
                "by": "ann"})
            assert done.json()["status"] == "completed"
            assert done.json()["text"].startswith("Refunded $30.00 on order 42 (refund ")
            listed = (await web.post("/agents/ops/sessions/s1/chat",
                                     json={"text": "list orders", "by": "ann"})).json()
            assert listed["text"] == "2 order(s): #1 keyboard, #2 mouse."
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), WAIT)
    assert (clone / "ops.db").exists()
