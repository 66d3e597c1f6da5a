"""F20: On Temporal from the command line: ``serve --temporal`` accepts turns and streams them,
``durable-turns temporal-worker`` processes drive them; live text crosses processes as in a
split deployment. Real processes, the CLI as users run it, a real dev server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from deploykit import deployment, write_app
from livekit import (
    AGENT_PY,
    check_stream,
    store_option,
    stream_turn,
    warm_up,
    watch,
)
from temporalkit import queue

WAIT = 30.0


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_serve_streams_turns_that_temporal_workers_drive(
        kind: str, temporal_target: str, tmp_path: Path) -> None:
    store = store_option(kind, tmp_path)
    app = write_app(tmp_path, "You run ops.", AGENT_PY)
    async with deployment(app, store, tmp_path, workers=2 if kind == "postgres" else 1,
                          temporal=(temporal_target, queue())) as d, \
            httpx.AsyncClient(base_url=d.url, timeout=WAIT) as client:
        await warm_up(client)
        async with asyncio.timeout(WAIT):
            watcher = asyncio.create_task(watch(client, "s1"))
            frames = await stream_turn(client, "s1", "when?")
            watched = await watcher
    check_stream(frames, [p.pid for p in d.workers])
    assert [k for _s, k, _d in watched][-1] == "turn.completed", d.log()


def test_temporal_worker_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    app = write_app(tmp_path, "You run ops.", AGENT_PY)
    cli = [sys.executable, "-m", "durable_turns.cli", "temporal-worker", str(app),
           "--db", str(tmp_path / "db")]
    missing = subprocess.run(cli, capture_output=True, text=True, timeout=WAIT, check=False)
    assert missing.returncode == 2 and "--temporal" in missing.stderr
    bad = subprocess.run([*cli, "--temporal", "127.0.0.1:9", "--max-steps", "0"],
                         capture_output=True, text=True, timeout=WAIT, check=False)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "durable-turns temporal-worker: error: --max-steps must be at least 1"]
    nobody = subprocess.run([*cli, "--temporal", "127.0.0.1:9"], capture_output=True,
                            text=True, timeout=WAIT, check=False)
    assert nobody.returncode != 0
    assert len(nobody.stderr.strip().splitlines()) == 1, nobody.stderr
    assert "cannot reach Temporal at 127.0.0.1:9" in nobody.stderr


def test_temporal_connection_options_are_checked_before_connecting(tmp_path: Path) -> None:
    app = write_app(tmp_path, "You run ops.", AGENT_PY)
    cert = tmp_path / "client.pem"
    cert.write_text("not a certificate")
    cli = [sys.executable, "-m", "durable_turns.cli", "temporal-worker", str(app),
           "--db", str(tmp_path / "db"), "--temporal", "127.0.0.1:9"]
    alone = subprocess.run([*cli, "--tls-cert", str(cert)], capture_output=True, text=True,
                           timeout=WAIT, check=False)
    assert alone.returncode == 2
    assert alone.stderr.strip().splitlines() == [
        "durable-turns temporal-worker: error: a client certificate needs its key "
        "(--tls-cert with --tls-key)"]
    missing = subprocess.run([*cli, "--tls-cert", str(cert), "--tls-key",
                              str(tmp_path / "nope.pem")],
                             capture_output=True, text=True, timeout=WAIT, check=False)
    assert missing.returncode == 2
    assert len(missing.stderr.strip().splitlines()) == 1
    assert "cannot read a TLS file" in missing.stderr and "nope.pem" in missing.stderr
