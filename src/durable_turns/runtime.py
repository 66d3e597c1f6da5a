"""``Runtime``: drives agents' sessions on a store (F2, F5).

A runtime drives each session through one *pump*: an asyncio task that takes the session's
lease, runs its unfinished turns in chain order, and exits when none is left. ``start()``
makes a turn durable (a row in the store) before it returns and wakes the pump; a crash loses
nothing, because ``Runtime.recover()`` or a redelivery of the turn id starts a pump again and
the engine replays from the transcript. Nothing per session stays in memory once its pump
has exited, except a bounded cache of recent transcripts.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable

from .agent import Agent
from .engine import TurnEngine
from .errors import ConfigurationError, UnknownAgentError
from .events import EventSink, TurnEvent
from .hitl import InputRequest
from .messages import Message
from .models import Model
from .sessions import AgentSession, TurnResult
from .stores import Lease, SessionKey, SessionStore

log = logging.getLogger("durable_turns")

Observer = Callable[[TurnEvent], None]
TRANSCRIPT_CACHE = 64
"""How many recent sessions' transcripts a runtime keeps, so a step never re-reads history."""


class Runtime:
    """Drives agents' turns on a store.

    Args:
        agents: the agents sessions may address, by name.
        store: where sessions live.
        model: the model for agents that carry none.
        sink: receives every event of every turn this runtime drives.
        lease_timeout: how long a pump waits for another process to release a session
            (``None``: as long as it takes).
        poll_interval: how often ``result()`` re-reads a turn driven by another process.
        secret: signs answer grants (F6); random per runtime unless given, so a grant is
            only good on the runtime (or the runtimes sharing the secret) that issued it.
    """

    def __init__(
        self,
        agents: Iterable[Agent],
        store: SessionStore,
        model: Model | str | None = None,
        sink: EventSink | None = None,
        *,
        lease_timeout: float | None = None,
        poll_interval: float = 0.2,
        secret: bytes | None = None,
    ) -> None:
        self.agents: dict[str, Agent] = {}
        for a in agents:
            if a.name in self.agents:
                raise ConfigurationError(f"two agents named {a.name!r}")
            self.agents[a.name] = a
        self.store = store
        self._model = model
        self._models: dict[str, Model] = {}
        self.sink = sink
        self.lease_timeout = lease_timeout
        self.poll_interval = poll_interval
        self._opened = False
        self._pumps: dict[SessionKey, asyncio.Task[None]] = {}
        self._wake: set[SessionKey] = set()
        self._observers: dict[SessionKey, list[tuple[str | None, Observer]]] = {}
        self._waiters: dict[tuple[SessionKey, str], list[asyncio.Future[TurnResult | None]]] = {}
        self._cache: OrderedDict[SessionKey, tuple[int, list[Message]]] = OrderedDict()
        self._engines: dict[SessionKey, TurnEngine] = {}
        self._failures: dict[SessionKey, Exception] = {}
        self.secret = secret or os.urandom(32)

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if not self._opened:
            await self.store.open()
            self._opened = True

    async def close(self) -> None:
        """Stop driving (unfinished turns stay durable for ``recover()``) and close the store."""
        pumps = list(self._pumps.values())
        for t in pumps:
            t.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        if self._opened:
            await self.store.close()
            self._opened = False

    async def __aenter__(self) -> Runtime:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def session(self, agent: str, session_id: str) -> AgentSession:
        """The session ``session_id`` of agent ``agent`` (created on its first turn).

        Raises:
            UnknownAgentError: the runtime has no such agent.
        """
        if agent not in self.agents:
            raise UnknownAgentError(
                f"unknown agent {agent!r}; this runtime has {sorted(self.agents) or 'none'}"
            )
        if not session_id or not isinstance(session_id, str):
            raise ValueError("a session id must be a non-empty string")
        return AgentSession(self, SessionKey(agent, session_id))

    async def recover(self) -> list[SessionKey]:
        """Replay every unfinished turn in the store (run it when a worker starts).

        Returns the sessions whose pumps were started. Sessions of agents this runtime does
        not have are left for a runtime that has them.
        """
        await self.open()
        keys = []
        for key in await self.store.unfinished_sessions():
            if key.agent not in self.agents:
                log.warning("recover: no agent %r in this runtime; skipping %s", key.agent, key)
                continue
            self._kick(key)
            keys.append(key)
        return keys

    async def idle(self) -> None:
        """Wait until this runtime drives no session (for tests and orderly shutdown)."""
        while self._pumps:
            await asyncio.gather(*list(self._pumps.values()), return_exceptions=True)

    # -- the pump --------------------------------------------------------------------------

    def model_for(self, agent: Agent) -> Model:
        if agent.name in self._models:
            return self._models[agent.name]
        model: Model | str | None = agent.model or self._model
        if model is None:
            raise ConfigurationError(
                f"agent {agent.name!r} has no model and the runtime has none: pass "
                "Runtime(model=…) or Agent(model=…)"
            )
        if isinstance(model, str):
            from .models.resolve import resolve_model  # adapters load only when named

            model = resolve_model(model)
        assert not isinstance(model, str)
        self._models[agent.name] = model
        return model

    def _kick(self, key: SessionKey) -> None:
        self._failures.pop(key, None)
        self._wake.add(key)
        if key not in self._pumps:
            self._pumps[key] = asyncio.create_task(self._pump(key), name=f"durable-turns {key}")

    async def _pump(self, key: SessionKey) -> None:
        agent = self.agents[key.agent]
        try:
            while key in self._wake:
                self._wake.discard(key)
                lease = await self.store.acquire(key, timeout=self.lease_timeout)
                try:
                    await self._drive(agent, lease)
                finally:
                    await lease.release()
        except Exception as e:
            log.exception("durable_turns: driving %s failed; its turns stay for recover()", key)
            self._cache.pop(key, None)
            self._failures[key] = e
        finally:
            del self._pumps[key]
            self._wake_all(key)

    async def _drive(self, agent: Agent, lease: Lease) -> None:
        key = lease.key
        store = self.store

        async def read_step(step_id: str) -> str | None:
            return await store.read_step(key, step_id)

        engine = TurnEngine(agent, self.model_for(agent), lease, await self._transcript(lease),
                            lambda events: self._publish(key, events), read_step)
        self._engines[key] = engine
        try:
            while True:
                pending = await self.store.turns(key, unfinished=True)
                parked = [t.turn_id for t in pending if t.status == "suspended"]
                runnable = [t for t in pending if t.status != "suspended"]
                if not runnable or (parked and not any(t.kind == "reset" for t in runnable)):
                    return  # nothing to do, or the chain waits on a person
                turn = runnable[0]
                if turn.kind == "reset":
                    outcome = await engine.reset(turn, parked)
                    self._cache[key] = (lease.generation, engine.transcript)
                    for t in parked:
                        self._wake_turn(key, t)
                else:
                    outcome = await engine.run(turn)
                log.debug("turn %s of %s: %s", turn.turn_id, key, outcome.status)
                request = InputRequest.from_dict(outcome.request) if outcome.request else None
                self._wake_turn(key, turn.turn_id, TurnResult(
                    turn.turn_id, outcome.status, outcome.text, request,  # type: ignore[arg-type]
                    outcome.error, outcome.reason))
        finally:
            del self._engines[key]

    def _interrupt(self, key: SessionKey, turn_ids: Iterable[str]) -> None:
        engine = self._engines.get(key)
        if engine is not None:
            for t in turn_ids:
                engine.interrupt(t)

    def _interrupt_running(self, key: SessionKey) -> None:
        """Stop the model stream of whatever turn this runtime is driving on the session
        (its cancel was requested in the store: replace, reset)."""
        engine = self._engines.get(key)
        if engine is not None and engine.turn_id is not None:
            engine.interrupt(engine.turn_id)

    async def _transcript(self, lease: Lease) -> list[Message]:
        """The live log, from the cache when it is current; only the missing tail is read."""
        key = lease.key
        cached = self._cache.pop(key, None)
        if cached is None or cached[0] != lease.generation or len(cached[1]) > lease.message_count:
            cached = (lease.generation, [])
        log_ = cached[1]
        if len(log_) < lease.message_count:
            log_.extend(await self.store.read_messages(key, after=len(log_)))
        self._cache[key] = cached
        while len(self._cache) > TRANSCRIPT_CACHE:
            self._cache.popitem(last=False)
        return log_

    # -- events and waiting ----------------------------------------------------------------

    def _publish(self, key: SessionKey, events: list[TurnEvent]) -> None:
        observers = self._observers.get(key, ())
        for e in events:
            if self.sink is not None:
                try:
                    self.sink.emit(e)
                except Exception:
                    log.exception("event sink failed on %s", e.type)
            for turn_id, cb in list(observers):
                if turn_id is None or turn_id == e.turn_id:
                    try:
                        cb(e)
                    except Exception:
                        log.exception("observer failed on %s", e.type)

    def _wake_turn(self, key: SessionKey, turn_id: str,
                   result: TurnResult | None = None) -> None:
        """Wake ``result()`` callers, handing them the result when this pump knows it."""
        for f in self._waiters.pop((key, turn_id), ()):
            if not f.done():
                f.set_result(result)

    def _wake_all(self, key: SessionKey) -> None:
        for k in [k for k in self._waiters if k[0] == key]:
            self._wake_turn(*k)
