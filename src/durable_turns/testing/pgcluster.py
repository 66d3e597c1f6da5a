"""A throwaway PostgreSQL cluster of one's own, to stop and start under a running system: what
a test of a database outage needs (``tests/stores/test_outage.py``, ``bench/outage.py``), and what
nobody may do to a cluster others use.

It is made with the server's own tools (``initdb``, ``pg_ctl``, from ``PGBIN`` or the
newest ``/usr/lib/postgresql/*/bin``), in a new directory under the system's temporary
directory, on a free port of 127.0.0.1, with durability off (``fsync``: a throwaway cluster
needs none). As root it runs as the user ``postgres`` (PostgreSQL refuses root)::

    cluster = Cluster.create()          # initdb, start; raises Unavailable without binaries
    dsn = cluster.dsn
    cluster.stop()                      # fast shutdown: sessions are ended, clients see it
    cluster.start()                     # the same data, the same port
    cluster.destroy()                   # stop and remove the directory
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["Cluster", "Unavailable", "find_bindir"]

RUN_AS = "postgres"
"""The user a root process runs the server as."""
WAIT = 30
"""Seconds ``pg_ctl`` waits for the server to start or stop."""


class Unavailable(Exception):
    """This machine cannot make a cluster (no PostgreSQL binaries, no user to run it as)."""


def find_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: ``$PGBIN``, else the newest
    ``/usr/lib/postgresql/*/bin``, else ``pg_ctl`` on ``PATH``; ``None`` when nowhere."""
    for candidate in (os.environ.get("PGBIN"),
                      *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)):
        if candidate and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One throwaway cluster (see the module docstring).

    Args:
        bindir: the server's binaries.
        root: its directory (data, log, socket).
        port: its port on 127.0.0.1.
        max_connections: the server's ``max_connections``.
    """

    def __init__(self, bindir: Path, root: Path, port: int, max_connections: int = 300) -> None:
        self.bindir = bindir
        self.root = root
        self.port = port
        self.max_connections = max_connections
        self._as_user = os.getuid() == 0

    @property
    def dsn(self) -> str:
        """A DSN of its database ``postgres``, as the superuser ``test``."""
        return f"postgresql://test@127.0.0.1:{self.port}/postgres"

    @classmethod
    def create(cls, *, max_connections: int = 300) -> Cluster:
        """Make a cluster and start it.

        Raises:
            Unavailable: no PostgreSQL binaries, or no user ``postgres`` to run them as root.
            subprocess.CalledProcessError: ``initdb`` or ``pg_ctl`` failed.
        """
        bindir = find_bindir()
        if bindir is None:
            raise Unavailable("no PostgreSQL server binaries (set PGBIN to their directory)")
        root = Path(tempfile.mkdtemp(prefix="durable-turns-pg-"))
        cluster = cls(bindir, root, _free_port(), max_connections)
        try:
            if cluster._as_user:
                try:
                    user = pwd.getpwnam(RUN_AS)
                except KeyError:
                    raise Unavailable(f"running as root, and no user {RUN_AS!r} to run "
                                      "PostgreSQL as (.ci/pg makes one)") from None
                os.chown(root, user.pw_uid, user.pw_gid)
            root.chmod(0o700)
            cluster._run("initdb", "-D", str(root / "data"), "-U", "test", "--auth=trust",
                         "-E", "UTF8", "--no-locale", "--no-sync")
            cluster.start()
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return cluster

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bindir / tool), *args]
        if self._as_user:
            command = ["runuser", "-u", RUN_AS, "--", *command]
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=WAIT * 2)

    def start(self) -> None:
        """Start the server on its port (again, after :meth:`stop`), and wait until it takes
        connections."""
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} "
                   f"-c max_connections={self.max_connections} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "server.log"),
                  "-w", "-t", str(WAIT), "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every session is ended at once; ``immediate``: as a
        crash) and wait until it is down."""
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", mode, "-w", "-t", str(WAIT),
                  "stop")

    def destroy(self) -> None:
        """Stop the server (if it runs) and remove the cluster's directory."""
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
