"""The chat's terminal: a line at a prompt, Ctrl-C and Ctrl-D, and typed keys kept out of a
reply while it streams.

:class:`StdioTerminal` makes a prompt an ``await`` that a signal can end, and leaves the line
editing to the terminal's own line discipline (erase, kill, Ctrl-D at the start of a line
for the end of the input), as ``input()`` does without readline: no escape sequences to
parse, nothing that breaks on a dumb terminal.

- **Ctrl-D** on an empty line ends the input: the prompt raises ``EOFError``.
- **Ctrl-C** is the chat's to decide (:meth:`StdioTerminal.on_interrupt`): while a reply
  streams it cancels the turn; at a prompt it ends the input (the terminal discards the
  half-typed line itself), so nothing typed afterwards is lost to a process that is dying.
- **While a reply streams** (:meth:`StdioTerminal.quiet`) the terminal's echo is off, so
  keys typed meanwhile do not land inside the reply's line. Nothing reads the terminal then:
  a line finished meanwhile waits in the terminal's buffer, and the next prompt takes it
  and shows it after itself (it was never on the screen).

A terminal is read only while a prompt waits (the event loop watches it), so what is typed
between two prompts is the next prompt's. A stdin that is not a terminal (a pipe, a file) is
read line by line on a thread of its own (a daemon: the chat may end while it waits, and
the process never waits for it), and each line is written after its prompt, so the output
reads as a typed session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
import sys
import termios
import threading
from collections.abc import Callable, Iterator
from fcntl import ioctl
from typing import Any, Protocol


class Terminal(Protocol):
    """Where a chat reads its lines and writes its text."""

    async def prompt(self, text: str) -> str:
        """Show ``text`` and return the line typed after it (without its newline).

        Raises:
            EOFError: the input ended (Ctrl-D, Ctrl-C at the prompt, the end of a pipe).
        """
        ...

    def write(self, text: str) -> None:
        """Write ``text`` as it is (no newline of its own)."""
        ...

    def quiet(self) -> contextlib.AbstractContextManager[None]:
        """While inside, what is typed is not echoed (it waits for the next prompt)."""
        ...

    def on_interrupt(self, handler: Callable[[], None] | None) -> None:
        """Ctrl-C (SIGINT) calls ``handler`` instead of ending the prompt; ``None``: back to
        ending it."""
        ...


class StdioTerminal:
    """This process's stdin and stdout as a :class:`Terminal` (see the module docstring).

    Use it inside a running event loop, as a context manager: leaving it gives SIGINT back.
    """

    def __init__(self) -> None:
        self._fd = sys.stdin.fileno()
        self._tty = os.isatty(self._fd)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handler: Callable[[], None] | None = None
        self._waiting: asyncio.Future[None] | None = None
        self._text = ""
        """What was read of the terminal and not yet returned (a line, or more)."""
        self._ended = False
        self._lines: asyncio.Queue[str | None] | None = None
        """A piped stdin's lines, as its thread reads them (``None``: its end)."""

    def __enter__(self) -> StdioTerminal:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)
            self._loop = None

    def _started(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_signal_handler(signal.SIGINT, self._interrupted)
            if not self._tty:
                self._lines = self._read_pipe(self._loop)
        return self._loop

    def _interrupted(self) -> None:
        if self._handler is not None:
            self._handler()
        elif self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    async def prompt(self, text: str) -> str:
        """:meth:`Terminal.prompt`."""
        loop = self._started()
        # A line already in the terminal's buffer was typed while nothing read it: echo was
        # off (a reply streamed), so it was never shown.
        ahead = self._tty and ("\n" in self._text or _unread(self._fd) > 0)
        _write(text)
        self._waiting = loop.create_future()
        try:
            line = await (self._tty_line(loop) if self._tty else self._pipe_line())
        finally:
            self._waiting.cancel()
        if line is None:
            _write("\n")
            raise EOFError
        if ahead or not self._tty:
            _write(line + "\n")
        return line

    async def _tty_line(self, loop: asyncio.AbstractEventLoop) -> str | None:
        """The next line typed (``None``: Ctrl-D, or Ctrl-C at the prompt)."""
        while "\n" not in self._text and not self._ended:
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self._fd, _settle, readable)
            try:
                await self._either(readable)
            finally:
                loop.remove_reader(self._fd)
            if not readable.done():  # Ctrl-C
                return None
            # Canonical mode: readable means a whole line, or the end of the input (b"").
            data = os.read(self._fd, 65536)
            if not data:
                self._ended = True
            self._text += data.decode("utf-8", errors="replace")
        if "\n" not in self._text:
            if not self._text:
                return None
            self._text += "\n"  # Ctrl-D after some text ends that line, then the input
        line, self._text = self._text.split("\n", 1)
        return line

    async def _pipe_line(self) -> str | None:
        assert self._lines is not None
        got = asyncio.ensure_future(self._lines.get())
        await self._either(got)
        if not got.done():  # Ctrl-C
            got.cancel()
            return None
        line = got.result()
        if line is None:
            self._lines.put_nowait(None)  # every later prompt ends too
        return line

    async def _either(self, future: asyncio.Future[Any]) -> None:
        """Wait for ``future``, or for Ctrl-C at the prompt."""
        assert self._waiting is not None
        await asyncio.wait([future, self._waiting], return_when=asyncio.FIRST_COMPLETED)

    @staticmethod
    def _read_pipe(loop: asyncio.AbstractEventLoop) -> asyncio.Queue[str | None]:
        lines: asyncio.Queue[str | None] = asyncio.Queue()

        def read() -> None:
            for line in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, line.rstrip("\r\n"))
            loop.call_soon_threadsafe(lines.put_nowait, None)

        threading.Thread(target=read, name="durable-turns-chat-stdin", daemon=True).start()
        return lines

    def write(self, text: str) -> None:
        """:meth:`Terminal.write`."""
        _write(text)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """:meth:`Terminal.quiet`: the terminal's echo off (a no-op on a pipe)."""
        saved = None
        if self._tty:
            with contextlib.suppress(termios.error):
                saved = termios.tcgetattr(self._fd)
                mode = list(saved)
                mode[3] &= ~termios.ECHO  # line editing and Ctrl-C stay as they are
                termios.tcsetattr(self._fd, termios.TCSANOW, mode)
        try:
            yield
        finally:
            if saved is not None:
                with contextlib.suppress(termios.error):
                    termios.tcsetattr(self._fd, termios.TCSANOW, saved)

    def on_interrupt(self, handler: Callable[[], None] | None) -> None:
        """:meth:`Terminal.on_interrupt`."""
        self._started()
        self._handler = handler


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _unread(fd: int) -> int:
    """How many bytes of finished lines wait in the terminal's buffer."""
    try:
        return int(struct.unpack("i", ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


__all__ = ["StdioTerminal", "Terminal"]
