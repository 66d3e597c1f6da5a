"""The host's lifespan: what an ASGI server runs as the app starts and as it stops.

Starting, it opens the runtime, has its unfinished turns replayed (``Runtime.recover()``
tells the runtime's scheduler), starts each channel and lets it recover what a stopped
process left undelivered; a schedule's fire (F24) whose channel it serves is delivered by
that channel (it takes up what it owes, as at start). Stopping, it ends the open event
streams, gives running turns ``grace`` seconds, stops the channels and closes the runtime.
So ``uvicorn module:app`` (or any ASGI server that runs lifespans) serves as
``durable-turns serve`` does. The lifespan is what opens the runtime: an app driven without
one (directly, in a test) serves a runtime its caller opened (``async with runtime:``), and
answers 500 naming that otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from ..channels import Channel
from ..runtime import Runtime
from ..schedule_fires import Fired
from ..schedules import Schedule

log = logging.getLogger("durable_turns.server")

GRACE = 10.0
"""Seconds a shutdown waits for running turns to end (and then for channels to stop)."""

Lifespan = Callable[[Any], contextlib.AbstractAsyncContextManager[None]]


def host_lifespan(runtime: Runtime, channels: Sequence[Channel], end_streams: Callable[[], None],
                  *, grace: float = GRACE) -> Lifespan:
    """The lifespan of a host of ``runtime`` with ``channels`` (``create_app`` makes it).

    Args:
        end_streams: ends every open ``GET …/events`` stream.
        grace: seconds the shutdown waits for running turns, and then for each channel.

    Returns:
        A Starlette lifespan: ``lifespan(app)`` is an async context manager. A failure as it
        starts is also kept as ``app.state.lifespan_error`` (an ASGI server logs it and
        exits; ``serve`` raises it).
    """

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        started: list[Channel] = []
        try:
            await runtime.open()
            recovered = await runtime.recover()
            if recovered and runtime.steps_here:
                log.warning("recovering %d session(s) with unfinished turns", len(recovered))
            for ch in channels:
                await ch.start()
                started.append(ch)
            for ch in channels:
                taken = await ch.recover()
                if taken:
                    log.warning("channel %s: taking up %d undelivered turn(s)", ch.name, taken)
            by_name = {ch.name: ch for ch in started}

            async def deliver_fire(schedule: Schedule, fired: Fired) -> None:
                ch = by_name.get(schedule.channel or "")
                if ch is not None:
                    await ch.recover()  # its fire's turn is owed: taken up in the background

            undo = runtime.fires.on_fire(deliver_fire)
        except BaseException as e:
            app.state.lifespan_error = e
            await _stop(runtime, started, grace)
            raise
        try:
            yield
        finally:
            end_streams()
            try:
                # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that
                # comes as the wait ends.
                async with asyncio.timeout(grace):
                    await runtime.idle()
            except TimeoutError:
                log.warning("turns still running after %ss; they replay on the next start",
                            grace)
            undo()
            await _stop(runtime, started, grace)

    return lifespan


async def _stop(runtime: Runtime, channels: Sequence[Channel], grace: float) -> None:
    for ch in reversed(channels):
        try:
            async with asyncio.timeout(grace):
                await ch.stop()
        except Exception:  # one channel failing to stop must not keep the store open
            log.exception("channel %s did not stop cleanly", ch.name)
    await runtime.close()


__all__ = ["GRACE", "Lifespan", "host_lifespan"]
