"""Serve a runtime's agents over HTTP with uvicorn, and shut down without losing a step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

import uvicorn

from ..channels import Channel
from ..errors import ConfigurationError
from ..runtime import Runtime
from ._app import create_app
from ._frontends import mount_frontends
from ._http import Authenticate, is_loopback
from ._lifespan import GRACE
from .deadlines import HttpProtocol

log = logging.getLogger("durable_turns.server")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop uvicorn would pick to serve: uvloop's when it is installed (the
    ``server`` extra brings it, with httptools, through ``uvicorn[standard]``), else
    ``None`` (asyncio's own). ``serve`` runs in a loop its caller made, so the caller picks:
    ``asyncio.Runner(loop_factory=loop_factory())``. ``bench/sse.py`` measures both.
    """
    try:
        import uvloop
    except ImportError:
        return None
    new_event_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return new_event_loop


class _Server(uvicorn.Server):
    """uvicorn's server, ending the app's event streams as it starts to shut down (uvicorn
    would otherwise wait for their clients to leave)."""

    def __init__(self, config: uvicorn.Config, end_streams: Callable[[], None],
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(config)
        self._end_streams = end_streams
        self._loop = loop

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: hand the ending to the loop rather than run it in between.
        self._loop.call_soon_threadsafe(self._end_streams)
        super().handle_exit(sig, frame)


@dataclass(frozen=True, slots=True)
class Listening:
    """Where a server listens, once it does (what ``serve``'s ``on_listening`` is told)."""

    url: str
    """The base URL, with the port bound (``http://127.0.0.1:8000``)."""
    channel_routes: dict[str, list[str]]
    """Each channel's routes by its name: ``{"slack": ["POST /slack/events", …]}``."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: one the system picks).

    Raises:
        ConfigurationError: the address cannot be bound (in use, not this machine's, a port
            out of range), said with the address.
    """
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"port {port} is not a TCP port (1 to 65535)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn binds: a restarted server takes its port back at once (TIME_WAIT).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: "
                                 f"{(e.strerror or str(e)).lower()}") from None
    sock.setblocking(False)
    return sock


async def serve(runtime: Runtime, *, host: str = "127.0.0.1", port: int = 8000,
                authenticate: Authenticate | None = None, grace: float = GRACE,
                on_ready: Callable[[str], None] | None = None,
                channels: Sequence[Channel] = (), api: bool = True,
                on_listening: Callable[[Listening], None] | None = None) -> None:
    """Serve ``create_app(runtime, authenticate, channels)`` with uvicorn until SIGTERM or
    SIGINT; with the API, the frontend protocols too (``_frontends.mount_frontends``: the AI
    SDK's, and AG-UI with its extra).

    The app's lifespan does the rest: at start it recovers the store's unfinished turns and
    each channel's undelivered ones; on the signal the server stops accepting, its event
    streams are closed, running turns get ``grace`` seconds to end (each step commits or,
    cut short, is replayed by the next ``recover()``), the channels stop and the runtime
    closes.

    Args:
        port: the TCP port; 0 lets the system pick one (``on_ready`` is told which).
        on_ready: called with the base URL once the server listens.
        channels: the channels to serve (``create_app(channels=…)``).
        api: serve the API and the console too (``create_app(api=…)``).
        on_listening: called with :class:`Listening` once the server listens (the URL and
            the channels' routes).

    Raises:
        ConfigurationError: no ``authenticate`` (development mode), the API served and
            ``host`` not loopback; the address cannot be bound (a port in use); a channel
            that cannot serve this runtime.
        StoreError: the store cannot be opened (after the port is bound, before it is
            served).
        Exception: whatever the lifespan's start raised (a channel's ``start``).
    """
    if authenticate is None and api and not is_loopback(host):
        raise ConfigurationError(
            f"development mode (no authenticate) serves loopback only, not {host!r}: "
            "bind 127.0.0.1, or pass authenticate=… to create_app")
    app = create_app(runtime, authenticate, channels, grace=grace, api=api)
    if api:  # useChat and AG-UI clients: the same sessions, behind the same guard
        mount_frontends(app)
    # Bound here rather than by uvicorn, which logs a failed bind and exits the process: a
    # port in use is this call's error, found before the store is touched, and the port the
    # system picked is known.
    sock = bind(host, port)
    try:
        # Opened here, so that a store that cannot be opened is this call's error rather
        # than a line in uvicorn's log (the lifespan's open is then a no-op).
        await runtime.open()
    except BaseException:
        sock.close()
        raise
    stopped: list[int] = []
    # uvicorn re-raises the signal it caught once it has shut down; these handlers take it,
    # so the runtime closes in order instead of the process dying with the signal.
    previous = {sig: signal.signal(sig, lambda s, _f: stopped.append(s))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        bound = sock.getsockname()[1]
        # HttpProtocol: uvicorn's, with a deadline for a request's headers (deadlines.py).
        config = uvicorn.Config(app, host=host, port=bound, lifespan="on", http=HttpProtocol,
                                timeout_graceful_shutdown=int(grace) or 1, log_level="info")
        server = _Server(config, app.state.end_streams, asyncio.get_running_loop())
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():  # uvicorn has no event for it
            await asyncio.sleep(0.01)
        if server.started:
            url = f"http://{_url_host(host)}:{bound}"
            if on_ready is not None:
                on_ready(url)
            if on_listening is not None:
                on_listening(Listening(url, dict(app.state.channel_routes)))
        with contextlib.suppress(SystemExit):  # uvicorn's exit when the lifespan's start failed
            await task
        failed = getattr(app.state, "lifespan_error", None)
        if failed is not None:
            raise failed
        if not server.started:
            raise ConfigurationError("the server did not start (see the log above)")
    finally:
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        await runtime.close()  # a no-op once the lifespan closed it


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


__all__ = ["Listening", "bind", "loop_factory", "serve"]
