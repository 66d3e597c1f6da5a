"""The chat's terminal: a line at a prompt, Ctrl-C and Ctrl-D, and typed keys kept out of a
reply while it streams.

:class:`StdioTerminal` reads stdin a line at a time on a thread of its own (a daemon: the
chat may end while it waits, and the process never waits for it), so a prompt is an
``await`` that a signal can end. It leaves the line editing to the terminal's own line
discipline (erase, kill, Ctrl-D at the start of a line for the end of the input), as
``input()`` does without readline: no escape sequences to parse, nothing that breaks on a
pipe or a dumb terminal.

- **Ctrl-D** on an empty line ends the input: the prompt raises ``EOFError``.
- **Ctrl-C** is the chat's to decide (:meth:`StdioTerminal.on_interrupt`): while a reply
  streams it cancels the turn; at a prompt it ends the input (the terminal discards the
  half-typed line itself), so nothing typed afterwards is lost to a process that is dying.
- **While a reply streams** (:meth:`StdioTerminal.quiet`) the terminal's echo is off, so
  keys typed meanwhile do not land inside the reply's line; a line finished then is kept,
  and shown after the next prompt, which takes it.

On a stdin that is not a terminal (a pipe, a file) the same class reads line by line, and
writes each line after its prompt, so the output reads as a typed session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import threading
from collections.abc import Callable, Iterator
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

    Use it inside a running event loop; :meth:`close` (or ``with``) gives SIGINT back.
    """

    def __init__(self) -> None:
        self._fd = sys.stdin.fileno()
        self._tty = os.isatty(self._fd)
        self._lines: asyncio.Queue[tuple[str, bool] | None] | None = None
        self._quiet = False
        self._waiting: asyncio.Future[None] | None = None
        self._handler: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _start(self) -> asyncio.Queue[tuple[str, bool] | None]:
        lines: asyncio.Queue[tuple[str, bool] | None] = asyncio.Queue()
        loop = self._loop = asyncio.get_running_loop()

        def arrived(line: str | None) -> None:
            # Whether it was typed while echo was off: then nobody saw it on the screen.
            lines.put_nowait(None if line is None else (line, self._quiet))

        def read() -> None:
            for line in sys.stdin:
                loop.call_soon_threadsafe(arrived, line.rstrip("\r\n"))
            loop.call_soon_threadsafe(arrived, None)

        threading.Thread(target=read, name="durable-turns-chat-stdin", daemon=True).start()
        loop.add_signal_handler(signal.SIGINT, self._interrupted)
        return lines

    def _interrupted(self) -> None:
        if self._handler is not None:
            self._handler()
        elif self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    async def prompt(self, text: str) -> str:
        """:meth:`Terminal.prompt`."""
        if self._lines is None:
            self._lines = self._start()
        _write(text)
        assert self._loop is not None
        self._waiting = self._loop.create_future()
        got = asyncio.ensure_future(self._lines.get())
        either: list[asyncio.Future[Any]] = [got, self._waiting]
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiting.cancel()
            if not got.done():
                got.cancel()
        if not got.done() or got.cancelled():  # Ctrl-C
            _write("\n")
            raise EOFError
        item = got.result()
        if item is None:
            self._lines.put_nowait(None)  # every later prompt ends too
            _write("\n")
            raise EOFError
        line, unseen = item
        if unseen or not self._tty:
            _write(line + "\n")
        return line

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
        self._quiet = True
        try:
            yield
        finally:
            self._quiet = False
            if saved is not None:
                with contextlib.suppress(termios.error):
                    termios.tcsetattr(self._fd, termios.TCSANOW, saved)

    def on_interrupt(self, handler: Callable[[], None] | None) -> None:
        """:meth:`Terminal.on_interrupt`."""
        if self._lines is None:
            self._lines = self._start()
        self._handler = handler

    def close(self) -> None:
        """Give SIGINT back to Python's own handling."""
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)
            self._loop = None

    def __enter__(self) -> StdioTerminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


__all__ = ["StdioTerminal", "Terminal"]
