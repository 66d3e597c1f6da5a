"""F29 (with F12, F24): the small inconsistencies a new user met, each as it is now: the
commands a mistyped one lists, ``pending``'s help, ``replay``'s app folder, the docs site's
port, what Ctrl-C and ``demo | head`` exit with, and which commands take ``--temporal``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from deploykit import free_port
from durable_turns.cli import main
from durable_turns.cli._args import HIDDEN
from durable_turns.cli._main import build_parser
from durable_turns.cli._new import write_app

ROOT = Path(__file__).resolve().parents[2]
WAIT = 120.0


def test_a_mistyped_command_lists_only_the_commands_a_person_types(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["nope"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and "new" in err and "serve" in err
    assert not any(hidden in err for hidden in HIDDEN), err


def test_pending_help_says_pending_s_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["pending", "--help"])
    pending = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["approve", "--help"])
    approve = capsys.readouterr().out
    assert "0 listed" in pending and "the turn failed" not in pending
    assert "the turn failed" in approve


def test_replay_takes_the_app_folder_as_pending_and_approve_do(tmp_path: Path) -> None:
    parser = build_parser()
    for argv in (["replay", "ops/s1", "examples/ops", "--db", "x.db"],
                 ["replay", "ops/s1", "--app", "examples/ops", "--db", "x.db"],
                 ["pending", "examples/ops", "--db", "x.db"]):
        args = parser.parse_args(argv)
        assert (args.app or args.app_option) == Path("examples/ops")


def test_the_docs_site_and_serve_default_to_different_ports() -> None:
    site = re.search(r"^dev_addr: [\d.]+:(\d+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert site is not None, "mkdocs.yml names no dev_addr: mkdocs serve takes 8000"
    serve = build_parser().parse_args(["serve", "app"]).port
    assert int(site.group(1)) != serve == 8000


async def _stopped_by_ctrl_c(argv: list[str], ready: str, cwd: Path) -> int:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_turns.cli", *argv, cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    try:
        while not (line := (await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode()
                   ).startswith(ready):
            assert line, f"{argv[0]} ended before {ready!r}"
        proc.send_signal(signal.SIGINT)
        return await asyncio.wait_for(proc.wait(), WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_ctrl_c_stops_serve_with_0_and_worker_with_130(tmp_path: Path) -> None:
    write_app(tmp_path / "app", "minimal", "app")
    common = ["app", "--model", "test"]
    assert await _stopped_by_ctrl_c(
        ["serve", *common, "--db", "a.db", "--port", str(free_port())], "serving agent",
        tmp_path) == 0
    assert await _stopped_by_ctrl_c(["worker", *common, "--store", "a.db"], "worker of",
                                    tmp_path) == 130


def test_the_temporal_guide_names_the_commands_that_take_temporal() -> None:
    takes = {c for c in ("serve", "temporal-worker", "approve", "deny", "chat", "worker")
             if "--temporal" in _help_of(c)}
    assert takes == {"serve", "temporal-worker"}
    guide = " ".join((ROOT / "docs/guides/temporal.md").read_text().split())
    assert ("`serve` and `temporal-worker` of a deployment the same options. `approve`, "
            "`deny` and `chat` take no `--temporal`") in guide


def _help_of(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    return out.getvalue()


def test_the_demo_piped_into_head_ends_quietly_with_141(tmp_path: Path) -> None:
    ran = subprocess.run(
        ["bash", "-o", "pipefail", "-c",
         f"{sys.executable} -m durable_turns.cli demo | head -3 > /dev/null"],
        cwd=tmp_path, capture_output=True, text=True, timeout=WAIT)
    assert ran.returncode == 141, ran.stderr
    assert ran.stderr == ""
