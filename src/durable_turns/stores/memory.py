"""The in-memory reference store: no durability, no rollback, no raw handle."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..events import EventRecord, encode_event
from ..messages import Message
from . import (
    UNFINISHED,
    SessionInfo,
    SessionKey,
    SessionStatus,
    Transaction,
    TurnKind,
    TurnRecord,
)
from ._base import BufferedTransaction, LeaseBase, check_not_parked, poll_until

T = TypeVar("T")


@dataclass
class _Session:
    status: SessionStatus = "new"
    generation: int = 0
    turns: dict[str, TurnRecord] = field(default_factory=dict)
    messages: dict[int, list[Message]] = field(default_factory=dict)
    steps: dict[tuple[int, str], str] = field(default_factory=dict)
    events: list[EventRecord] = field(default_factory=list)
    held: bool = False


class _MemoryTransaction(BufferedTransaction):
    def unwrap(self) -> Any:
        return None

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        return fn(None)


class _MemoryLease(LeaseBase):
    def __init__(self, store: MemoryStore, key: SessionKey, s: _Session) -> None:
        log = s.messages.get(s.generation, [])
        super().__init__(key, s.generation, s.events[-1].seq if s.events else 0, len(log))
        self._store = store
        self._s = s

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        tx = _MemoryTransaction(self)
        yield tx
        s, w = self._s, tx.writes
        s.messages.setdefault(s.generation, []).extend(w.messages)
        for step_id, _turn, data in w.steps:
            s.steps[(s.generation, step_id)] = data
        for e in w.events:
            s.events.append(EventRecord(e.seq, e.turn_id, e.type, encode_event(e)))
        for turn_id, u in w.turns.items():
            old = s.turns[turn_id]
            s.turns[turn_id] = replace(
                old,
                status=u.status,
                text=u.text if u.text is not None else old.text,
                error=u.error if u.error is not None else old.error,
                reason=u.reason if u.reason is not None else old.reason,
                request=u.request if u.status == "suspended" else None,
            )
        if w.status is not None:
            s.status = w.status
        if w.new_generation:
            s.generation += 1
            s.status = "new"
            for t in list(s.turns.values()):
                if t.status == "suspended":
                    s.turns[t.turn_id] = replace(t, status="cancelled", reason="reset",
                                                 request=None)
        tx.committed()

    async def cancel_requested(self, turn_id: str) -> str | None:
        t = self._s.turns.get(turn_id)
        return t.cancel if t else None

    async def release(self) -> None:
        self._s.held = False


class MemoryStore:
    """Keeps everything in this process's memory. For tests and throwaway runs.

    ``unwrap()`` is ``None``: a local tool's writes elsewhere get no rollback here, so
    exactly-once holds only on the SQL stores.
    """

    def __init__(self) -> None:
        self._sessions: dict[SessionKey, _Session] = {}
        self._ordinal = 0

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def unwrap(self) -> Any:
        return None

    def _get(self, key: SessionKey) -> _Session:
        s = self._sessions.get(key)
        if s is None:
            s = self._sessions[key] = _Session()
        return s

    async def acquire(self, key: SessionKey, *, timeout: float | None = None) -> _MemoryLease:
        s = self._get(key)

        def take() -> bool:
            if s.held:
                return False
            s.held = True
            return True

        await poll_until(take, key, timeout)
        return _MemoryLease(self, key, s)

    async def enqueue_turn(
        self,
        key: SessionKey,
        turn_id: str,
        opening: Message,
        event: dict[str, Any] | None = None,
        policy: dict[str, Any] | None = None,
        *,
        kind: TurnKind = "turn",
        supersede: str | None = None,
    ) -> tuple[TurnRecord, bool]:
        s = self._get(key)
        if turn_id in s.turns:
            return s.turns[turn_id], False
        if kind == "turn":
            check_not_parked(key, ((t.turn_id, t.status, t.kind) for t in s.turns.values()))
        reason = "reset" if kind == "reset" else supersede
        if reason is not None:
            await self.request_cancel(key, None, reason)
        self._ordinal += 1
        rec = TurnRecord(turn_id, self._ordinal, "queued", opening, event, policy, kind=kind)
        s.turns[turn_id] = rec
        return rec, True

    async def request_cancel(
        self, key: SessionKey, turn_id: str | None, reason: str
    ) -> list[str]:
        s = self._sessions.get(key)
        if s is None:
            return []
        hit = [
            t for t in s.turns.values()
            if t.status in UNFINISHED and t.cancel is None and turn_id in (None, t.turn_id)
        ]
        for t in hit:
            s.turns[t.turn_id] = replace(t, cancel=reason)
        return [t.turn_id for t in hit]

    async def get_turn(self, key: SessionKey, turn_id: str) -> TurnRecord | None:
        s = self._sessions.get(key)
        return s.turns.get(turn_id) if s else None

    async def turns(self, key: SessionKey, *, unfinished: bool = False) -> list[TurnRecord]:
        s = self._sessions.get(key)
        if s is None:
            return []
        return [
            t for t in s.turns.values()
            if not unfinished or t.status in UNFINISHED or t.status == "suspended"
        ]

    async def session_info(self, key: SessionKey) -> SessionInfo | None:
        s = self._sessions.get(key)
        return SessionInfo(s.status, s.generation) if s else None

    async def read_messages(
        self, key: SessionKey, *, after: int = 0, generation: int | None = None
    ) -> list[Message]:
        s = self._sessions.get(key)
        if s is None:
            return []
        return list(s.messages.get(s.generation if generation is None else generation, [])[after:])

    async def read_step(self, key: SessionKey, step_id: str) -> str | None:
        s = self._sessions.get(key)
        return s.steps.get((s.generation, step_id)) if s else None

    async def read_steps(self, key: SessionKey, generation: int) -> dict[str, str]:
        s = self._sessions.get(key)
        if s is None:
            return {}
        return {sid: d for (g, sid), d in s.steps.items() if g == generation}

    async def read_events(
        self, key: SessionKey, *, after_seq: int = 0, turn_id: str | None = None
    ) -> list[EventRecord]:
        s = self._sessions.get(key)
        if s is None:
            return []
        return [
            e for e in s.events if e.seq > after_seq and turn_id in (None, e.turn_id)
        ]

    async def unfinished_sessions(self) -> list[SessionKey]:
        return self._where(lambda t: t.status in UNFINISHED)

    async def parked_sessions(self) -> list[SessionKey]:
        return self._where(lambda t: t.status == "suspended")

    async def sessions_with_turn(self, turn_id: str) -> list[SessionKey]:
        return self._where(lambda t: t.turn_id == turn_id and t.kind == "turn")

    def _where(self, test: Callable[[TurnRecord], bool]) -> list[SessionKey]:
        return sorted(k for k, s in self._sessions.items() if any(map(test, s.turns.values())))

