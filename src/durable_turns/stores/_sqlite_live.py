"""The SQLite store's live events between the processes of one machine: datagrams.

SQLite has no channel of its own (its feed polls ``PRAGMA data_version``), and live text must
never be written to the file. So a process whose feed has listeners binds a Unix datagram
socket and leaves a marker in the directory ``<path>-live`` beside the database, naming it;
a process that streams text sends each frame to every socket the markers name. The kernel
keeps each sender's datagrams in order, a full receiver drops what it cannot take (the
sender never waits), and a marker whose socket is gone (its process died) is removed by the
first sender that finds it so.

Sockets live in Linux's abstract namespace where there is one (nothing on disk to clean up
after a crash), else as files in the temporary directory (a socket's path must be short).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("durable_turns")

LIMIT = 60_000
"""The largest frame, in bytes (a Unix datagram's limit is about 200 KB)."""
_LOOK_EVERY = 0.02  # seconds between looks at the markers' directory (its mtime)


class SocketWire:
    """SQLite's ``LiveWire`` (see the module docstring).

    Args:
        path: the database file (the markers go in ``<path>-live``).
    """

    limit = LIMIT
    transactional = False  # a step sends its frames itself, before it commits

    def __init__(self, path: Path) -> None:
        self.origin = uuid.uuid4().hex[:16]
        self.markers = Path(f"{path}-live")
        """The directory of the markers (one per listening process)."""
        self._rx: socket.socket | None = None
        self._tx: socket.socket | None = None
        self._marker: Path | None = None
        self._file: str | None = None  # the socket's file, where there is no abstract name
        self._receive: Callable[[str], None] | None = None
        self._peers: dict[str, str | bytes] = {}
        self._mtime: int | None = None
        self._looked = -1.0

    # -- sending ---------------------------------------------------------------------------

    def peers(self) -> bool:
        """``LiveWire.peers``: whether another process's marker is in the directory."""
        now = time.monotonic()
        if now - self._looked >= _LOOK_EVERY:
            self._looked = now
            self._look()
        return bool(self._peers)

    def _look(self) -> None:
        try:
            mtime = os.stat(self.markers).st_mtime_ns
        except OSError:
            self._peers, self._mtime = {}, None
            return
        if mtime == self._mtime:
            return
        self._mtime = mtime
        found: dict[str, str | bytes] = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.markers):
                if entry.name == self.origin or entry.name.endswith(".tmp"):
                    continue
                known = self._peers.get(entry.name)
                if known is None:
                    with contextlib.suppress(OSError):
                        known = _address(Path(entry.path).read_text())
                if known is not None:
                    found[entry.name] = known
        self._peers = found

    async def send(self, frames: list[str]) -> None:
        """``LiveWire.send``: each frame to each listening process, without waiting."""
        self.peers()
        if self._tx is None:
            self._tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._tx.setblocking(False)
        data = [f.encode() for f in frames]
        for name, address in list(self._peers.items()):
            for d in data:
                try:
                    self._tx.sendto(d, address)
                except (ConnectionRefusedError, FileNotFoundError):
                    self._forget(name)  # its process is gone
                    break
                except OSError:
                    break  # its queue is full (or it is going): the rest is dropped for it

    def _forget(self, name: str) -> None:
        self._peers.pop(name, None)
        with contextlib.suppress(OSError):
            (self.markers / name).unlink()

    # -- receiving -------------------------------------------------------------------------

    def on_frame(self, receive: Callable[[str], None]) -> None:
        """``LiveWire.on_frame``."""
        self._receive = receive

    def start(self) -> None:
        """Bind this process's socket and leave its marker (on the loop; while the store's
        feed has listeners)."""
        if self._rx is not None:
            return
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            if sys.platform.startswith("linux"):
                address = f"\0durable_turns/{self.origin}"
            else:
                self._file = address = os.path.join(tempfile.gettempdir(),
                                                    f"dt-{self.origin}.sock")
            rx.bind(address)
            rx.setblocking(False)
            self.markers.mkdir(exist_ok=True)
            tmp = self.markers / f"{self.origin}.tmp"
            tmp.write_text(address.replace("\0", "@", 1))
            tmp.rename(self.markers / self.origin)
        except OSError as e:
            rx.close()
            log.warning("live text from other processes is off (%s): %s", self.markers, e)
            return
        self._rx, self._marker = rx, self.markers / self.origin
        asyncio.get_running_loop().add_reader(rx.fileno(), self._read)

    def _read(self) -> None:
        rx = self._rx
        while rx is not None:
            try:
                data = rx.recv(LIMIT + 1024)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if self._receive is not None:
                self._receive(data.decode(errors="replace"))

    def stop(self) -> None:
        """Remove the marker and close the socket (the feed has no listener any more)."""
        rx, self._rx = self._rx, None
        if rx is None:
            return
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(rx.fileno())
        rx.close()
        for leftover in (self._marker, Path(self._file) if self._file else None):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    leftover.unlink()
        self._marker = self._file = None

    def close(self) -> None:
        """Stop receiving and sending."""
        self.stop()
        tx, self._tx = self._tx, None
        if tx is not None:
            tx.close()


def _address(text: str) -> str | None:
    """A marker's socket address (``@`` stands for the abstract namespace's NUL)."""
    if text.startswith("@"):
        return "\0" + text[1:]
    return text or None
