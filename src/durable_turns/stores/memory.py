"""The in-memory reference store: no durability, no rollback, no raw handle."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..errors import LeaseLostError
from ..events import TurnEvent
from ..messages import Message
from ..records import (
    NewEntry,
    SessionInfo,
    SessionKey,
    SessionStatus,
    StepRecord,
    TurnRecord,
    TurnStatus,
)
from ._base import (
    BufferedTransaction,
    LeaseBase,
    check_enqueue,
    claim_found,
    poll_until,
    supersede_reason,
    updated_request,
)
from ._feed import Feed, FeedStore

T = TypeVar("T")


@dataclass
class _Session:
    status: SessionStatus = "new"
    generation: int = 0
    epoch: int = 0
    turns: dict[str, TurnRecord] = field(default_factory=dict)
    messages: dict[int, list[Message]] = field(default_factory=dict)
    steps: dict[tuple[int, str], StepRecord] = field(default_factory=dict)
    events: list[TurnEvent] = field(default_factory=list)
    held: bool = False


class _MemoryTransaction(BufferedTransaction):
    lease: _MemoryLease

    def unwrap(self) -> Any:
        return None

    async def run_local(self, fn: Callable[[Any], T]) -> T:
        return fn(None)

    async def __aenter__(self) -> _MemoryTransaction:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.lease.apply(self)


class _MemoryLease(LeaseBase):
    def __init__(self, store: MemoryStore, key: SessionKey, s: _Session) -> None:
        log = s.messages.get(s.generation, [])
        s.epoch += 1
        super().__init__(key, s.epoch, s.generation, s.events[-1].seq if s.events else 0,
                         len(log))
        self._store = store
        self._s = s
        self._released = False

    def transaction(self) -> _MemoryTransaction:
        return _MemoryTransaction(self)

    def apply(self, tx: _MemoryTransaction) -> None:
        s, w = self._s, tx.writes
        if s.epoch != self.epoch:
            raise LeaseLostError(str(self.key), self.epoch)
        s.messages.setdefault(s.generation, []).extend(w.messages)
        for step_id, turn_id, memo in w.steps:
            s.steps[(s.generation, step_id)] = StepRecord(step_id, turn_id, memo)
        s.events.extend(w.events)
        for turn_id, r in w.turns.items():
            s.turns[turn_id] = replace(
                s.turns[turn_id],
                status=r.status,
                text=r.text,
                error=r.error,
                reason=r.reason,
                request=r.request if updated_request(r) is not None else None,
            )
        for turn_id, name, value in w.data:
            _merge(s, turn_id, name, value, only_new=False)
        if w.status is not None:
            s.status = w.status
        if w.new_generation:
            s.generation += 1
            s.status = "new"
            for t in list(s.turns.values()):
                if t.status == TurnStatus.SUSPENDED:
                    s.turns[t.turn_id] = replace(t, status=TurnStatus.CANCELLED,
                                                 reason="reset", request=None)
        tx.committed()
        self._store._feed.published(self.key, w.events)

    async def cancel_requested(self, turn_id: str) -> str | None:
        t = self._s.turns.get(turn_id)
        return t.cancel if t else None

    async def release(self) -> None:
        if not self._released and self._s.epoch == self.epoch:
            self._s.held = False
        self._released = True


def _merge(s: _Session, turn_id: str, name: str, value: Any, *, only_new: bool) -> Any:
    """Set one name of an entry's ``data``, keeping the others (``None``: no such entry)."""
    t = s.turns.get(turn_id)
    if t is None:
        return None
    data = dict(t.data or {})
    if only_new and name in data:
        return data[name]
    data[name] = value
    s.turns[turn_id] = replace(t, data=data)
    return value


class MemoryStore(FeedStore):
    """Keeps everything in this process's memory. For tests and throwaway runs.

    ``unwrap()`` is ``None``: a local tool's writes elsewhere get no rollback here, so
    exactly-once holds only on the SQL stores.
    """

    def __init__(self) -> None:
        self._sessions: dict[SessionKey, _Session] = {}
        self._ordinal = 0
        self._feed = Feed(self._read_after, self._newest)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        self._feed.close()

    def unwrap(self) -> Any:
        return None

    def _get(self, key: SessionKey) -> _Session:
        s = self._sessions.get(key)
        if s is None:
            s = self._sessions[key] = _Session()
        return s

    async def claim(self, key: SessionKey, *, timeout: float | None = None) -> _MemoryLease:
        s = self._get(key)

        def take() -> bool:
            if s.held:
                return False
            s.held = True
            return True

        await poll_until(take, key, timeout)
        return _MemoryLease(self, key, s)

    async def enqueue(self, key: SessionKey, entry: NewEntry) -> tuple[TurnRecord, bool]:
        s = self._get(key)
        if entry.turn_id in s.turns:
            return s.turns[entry.turn_id], False
        check_enqueue(key, entry.kind, ((t.turn_id, t.status, t.kind, t.cancel)
                                        for t in s.turns.values() if not t.status.final))
        reason = supersede_reason(entry.kind, entry.supersede)
        if reason is not None:
            self._cancel(s, None, reason, parks=False)
        self._ordinal += 1
        rec = TurnRecord(entry.turn_id, self._ordinal, TurnStatus.QUEUED, entry.opening,
                         entry.event, entry.policy, kind=entry.kind, args=entry.args)
        s.turns[entry.turn_id] = rec
        self._feed.changed(key)
        return rec, True

    async def request_cancel(
        self, key: SessionKey, turn_id: str | None, reason: str
    ) -> list[str]:
        s = self._sessions.get(key)
        ids = [] if s is None else self._cancel(s, turn_id, reason)
        if ids:
            self._feed.changed(key)
        return ids

    async def set_turn_data(self, key: SessionKey, turn_id: str, name: str, value: Any, *,
                            only_new: bool = False) -> Any:
        s = self._sessions.get(key)
        return None if s is None else _merge(s, turn_id, name, value, only_new=only_new)

    @staticmethod
    def _cancel(s: _Session, turn_id: str | None, reason: str, *,
                parks: bool = True) -> list[str]:
        hit = [
            t for t in s.turns.values()
            if (t.status.unfinished or (parks and t.status == TurnStatus.SUSPENDED))
            and t.cancel is None and turn_id in (None, t.turn_id)
        ]
        for t in hit:
            s.turns[t.turn_id] = replace(t, cancel=reason)
        return [t.turn_id for t in hit]

    async def turns(self, key: SessionKey, *, turn_id: str | None = None,
                    unfinished: bool = False) -> list[TurnRecord]:
        s = self._sessions.get(key)
        if s is None:
            return []
        return [
            t for t in s.turns.values()
            if (not unfinished or not t.status.final) and turn_id in (None, t.turn_id)
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

    async def read_steps(self, key: SessionKey, *, generation: int | None = None,
                         step_id: str | None = None) -> dict[str, StepRecord]:
        s = self._sessions.get(key)
        if s is None:
            return {}
        gen = s.generation if generation is None else generation
        return {sid: r for (g, sid), r in s.steps.items()
                if g == gen and step_id in (None, sid)}

    async def read_events(
        self, key: SessionKey, *, after_seq: int = 0, turn_id: str | None = None
    ) -> list[TurnEvent]:
        s = self._sessions.get(key)
        if s is None:
            return []
        return [e for e in s.events if e.seq > after_seq and turn_id in (None, e.turn_id)]

    async def find_sessions(self, which: str | None = None, *,
                            turn_id: str | None = None) -> list[SessionKey]:
        if which not in (None, "unfinished", "parked"):
            raise ValueError(f"unknown session filter {which!r}: 'unfinished' or 'parked'")

        def test(t: TurnRecord) -> bool:
            if which == "unfinished" and not t.needs_driving:
                return False
            if which == "parked" and not t.parked:
                return False
            return turn_id is None or (t.turn_id == turn_id and t.kind == "turn")

        return sorted(k for k, s in self._sessions.items() if any(map(test, s.turns.values())))

    async def find_claimable(self, limit: int = 100) -> list[SessionKey]:
        keys = await self.find_sessions("unfinished")
        return [k for k in keys if not self._sessions[k].held][:limit]

    async def claim_ready(self, agents: Collection[str], limit: int = 100) -> list[_MemoryLease]:
        return await claim_found(self.find_claimable, lambda k: self.claim(k, timeout=0),
                                 agents, limit)

    async def list_sessions(self, agent: str) -> list[SessionKey]:
        # Dicts keep insertion order: the order the sessions were created in.
        return [k for k in reversed(self._sessions) if k.agent == agent]

    async def _read_after(self, key: SessionKey, after_seq: int) -> list[TurnEvent]:
        return await self.read_events(key, after_seq=after_seq)

    async def _newest(self, key: SessionKey) -> int:
        s = self._sessions.get(key)
        return s.events[-1].seq if s and s.events else 0
