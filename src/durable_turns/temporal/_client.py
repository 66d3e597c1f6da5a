"""The client side: connect to Temporal, and tell a session's workflow it has work.

:class:`TemporalScheduler` is a runtime's :class:`~durable_turns.scheduling.Scheduler`: every
host that accepts turns (``session.start``, the HTTP server, Slack) goes through
``Runtime.accept``, which stores the entry and then calls :meth:`TemporalScheduler.wake` —
a signal-with-start of the session's workflow. The store holds the entry before the signal
is sent, so a lost signal loses no turn: a redelivery of the same turn id signals again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client, TLSConfig
from temporalio.service import RPCError

from ..errors import ConfigurationError, StoreError
from ..records import SessionKey
from ..scheduling import Stepped
from ._workflow import STEPS_PER_RUN, WAKE, SessionStart, SessionWorkflow, StepOptions, workflow_id

TASK_QUEUE = "durable-turns"
"""The task queue sessions' workflows and steps run on, unless told otherwise."""


@dataclass(frozen=True, slots=True)
class Connection:
    """Where Temporal is and how to reach it (what ``Client.connect`` gets).

    For a local dev server only ``target`` matters; Temporal Cloud takes a namespace, TLS
    and an API key (or a client certificate and key, mTLS).
    """

    target: str = "127.0.0.1:7233"
    """``host:port`` of the frontend."""
    namespace: str = "default"
    api_key: str | None = None
    """Temporal Cloud's API key (sent as a bearer token; TLS is then on)."""
    tls: bool = False
    """Use TLS with the system's roots (Temporal Cloud), without a client certificate."""
    tls_cert: Path | None = None
    """A client certificate (PEM) for mTLS."""
    tls_key: Path | None = None
    """Its private key (PEM)."""
    server_ca: Path | None = None
    """A CA (PEM) to check the server's certificate against, instead of the system's."""

    def tls_config(self) -> bool | TLSConfig:
        """What ``Client.connect(tls=…)`` gets.

        Raises:
            ConfigurationError: a certificate without its key (or the reverse), or a file
                that cannot be read.
        """
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigurationError("a client certificate needs its key (--tls-cert with "
                                     "--tls-key)")
        if self.tls_cert is None and self.server_ca is None:
            return self.tls or self.api_key is not None
        try:
            return TLSConfig(
                client_cert=self.tls_cert.read_bytes() if self.tls_cert else None,
                client_private_key=self.tls_key.read_bytes() if self.tls_key else None,
                server_root_ca_cert=self.server_ca.read_bytes() if self.server_ca else None,
            )
        except OSError as e:
            raise ConfigurationError(f"cannot read a TLS file: {e}") from e


async def connect(conn: Connection, *, identity: str | None = None) -> Client:
    """A Temporal client for ``conn``.

    Args:
        conn: where Temporal is.
        identity: how this process names itself in Temporal's UI (default: the SDK's).

    Returns:
        The connected client.

    Raises:
        ConfigurationError: bad TLS settings.
        StoreError: Temporal cannot be reached.
    """
    try:
        return await Client.connect(conn.target, namespace=conn.namespace,
                                    api_key=conn.api_key, tls=conn.tls_config(),
                                    identity=identity)
    except RuntimeError as e:  # the SDK's core raises RuntimeError for a failed connect
        raise StoreError(f"cannot reach Temporal at {conn.target}: {e}") from e


class TemporalScheduler:
    """Tells sessions' workflows they have work (signal-with-start); see the module docstring.

    Args:
        client: a connected Temporal client, or where to connect on the first wake (a host
            whose runtime is made before its event loop runs: ``serve --temporal``).
        task_queue: where the sessions' workflows and steps run (the workers' queue).
        idle: seconds a session's workflow waits with nothing to do before it ends.
        heartbeat: the heartbeat timeout of a run's first step (the workers set the next
            ones' from their own ``WorkerSettings.heartbeat``).
        task_timeout: seconds a workflow task may take on a worker before another worker
            gets it. A session's workflow task takes milliseconds; Temporal's default of 10 s
            is how long a session whose worker died in the middle of one would stall.
        steps_per_run: steps before a session's workflow continues as new (its history
            stays small).
    """

    def __init__(self, client: Client | Connection, task_queue: str = TASK_QUEUE, *,
                 idle: float = 60.0, heartbeat: float = 2.0,
                 task_timeout: float = 2.0, steps_per_run: int = STEPS_PER_RUN) -> None:
        self._client = client if isinstance(client, Client) else None
        self._connection = client if isinstance(client, Connection) else None
        self._connecting: asyncio.Lock | None = None
        self.task_queue = task_queue
        self.idle = idle
        self.heartbeat = heartbeat
        self.task_timeout = task_timeout
        self.steps_per_run = steps_per_run

    steps_here = False
    """Temporal's workers step the sessions (``temporal_worker``), not the runtime that
    accepts."""

    def attach(self, runtime: Stepped) -> None:
        """``Scheduler.attach``: nothing to keep (the workers have their own runtime)."""

    async def wait_idle(self) -> None:
        """``Scheduler.wait_idle``: no step of Temporal's runs in the accepting runtime."""

    async def close(self) -> None:
        """``Scheduler.close``: the workflows go on with the workers."""

    async def client(self) -> Client:
        """The Temporal client (connected on the first call, when given a ``Connection``).

        Raises:
            StoreError: Temporal cannot be reached.
        """
        if self._client is not None:
            return self._client
        assert self._connection is not None
        self._connecting = self._connecting or asyncio.Lock()
        async with self._connecting:
            if self._client is None:
                self._client = await connect(self._connection)
        return self._client

    async def wake(self, key: SessionKey, *, interrupt: bool = False) -> None:
        """Signal the session's workflow, starting it if it does not run.

        ``interrupt`` (a turn was asked to stop) goes with the signal: a step waiting out a
        retry's backoff then runs at once, so the cancel does not wait for the backoff.

        Raises:
            StoreError: Temporal refused or could not be reached (the entry stays durable;
                deliver it again to wake the session).
        """
        client = await self.client()
        try:
            await client.start_workflow(
                SessionWorkflow.run,
                SessionStart(key.agent, key.session, self.idle, True,
                             StepOptions(heartbeat=self.heartbeat), self.steps_per_run),
                id=workflow_id(self.task_queue, key.agent, key.session),
                task_queue=self.task_queue,
                start_signal=WAKE,
                start_signal_args=[interrupt],
                task_timeout=timedelta(seconds=self.task_timeout),
                static_summary=f"session {key}",
            )
        except RPCError as e:
            raise StoreError(f"Temporal did not take the wake of {key}: {e}") from e


__all__ = ["TASK_QUEUE", "Connection", "TemporalScheduler", "connect"]
