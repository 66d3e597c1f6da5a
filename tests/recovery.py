"""What a recovered turn of the crash kit's agent must satisfy (``crashkit.py``): shared by the
crash tests (``tests/engine/test_crash.py``) and Temporal's (``tests/temporal/test_temporal.py``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import crashkit
from crashkit import CALLS, FINAL_TEXT, LOCAL_CALLS, REMOTE_CALLS, SCRIPT, TEXT, TURN_ID, State
from durable_turns import Message


def check_recovered(db: Path, before: State, after: State, crashed: list[str],
                    replay: str) -> None:
    """Everything a recovered turn must satisfy; ``before`` is the store before ``replay``."""
    # The turn finished as an uninterrupted run would have.
    assert after.turn is not None
    assert (after.turn.status, after.turn.text) == ("completed", FINAL_TEXT)
    assert after.status == "idle"
    # What committed before the replay is kept as it was.
    assert after.messages[: len(before.messages)] == before.messages
    openings = [m for m in after.messages if m.is_opening]
    assert [(m.role, m.text, m.turn_id) for m in openings] == [("user", TEXT, TURN_ID)]
    assert after.replies() == [r.text for r in SCRIPT]
    assert [c.id for m in after.messages for c in m.tool_calls] == [c.id for c in CALLS]
    answered = Counter(m.call_id for m in after.messages if m.role == "tool")
    assert answered == dict.fromkeys((c.id for c in CALLS), 1)
    assert [m.role for m in after.messages] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "tool", "tool",
        "assistant",
    ]
    assert not any(m.is_error for m in after.messages)
    assert_every_call_answered_once(after.messages)

    # Local tools: every row exactly once, the committed ones untouched.
    assert Counter(r[0] for r in after.rows) == dict.fromkeys(LOCAL_CALLS, 1)
    assert after.rows[: len(before.rows)] == before.rows

    # Remote tools: at least once, at most once per delivery, one key per call.
    effects = crashkit.effects(db)
    assert {e["tag"] for e in effects} <= {*crashed, replay}
    keys = {}
    for call in REMOTE_CALLS:
        lines = [e for e in effects if e["call"] == call]
        per_delivery = Counter(e["tag"] for e in lines)
        assert all(n == 1 for n in per_delivery.values()), (call, per_delivery)
        assert len({e["key"] for e in lines}) == 1, f"{call}: the idempotency key changed"
        keys[call] = lines[0]["key"]
        if call in before.tool_results():
            assert replay not in per_delivery, f"{call} committed, yet ran again"
        else:
            assert per_delivery[replay] == 1, f"{call} was owed and did not run"
    assert len(set(keys.values())) == len(REMOTE_CALLS)

    # Live tokens: only the model steps that had not committed are streamed again.
    fresh = after.replies()[len(before.replies()):]
    assert crashkit.deltas(db, replay) == "".join(fresh)

    # The event log: each step's event once, numbered without gaps.
    assert [e.seq for e in after.events] == list(range(1, len(after.events) + 1))
    types = Counter(e.type for e in after.events)
    assert types["turn.started"] == types["turn.completed"] == 1
    assert types["message.completed"] == len(SCRIPT)
    assert after.events[-1].type == "turn.completed"
    completed = Counter(e.payload()["call"]["id"] for e in after.events
                        if e.type == "action.completed")
    assert completed == dict.fromkeys((c.id for c in CALLS), 1)


def assert_every_call_answered_once(messages: list[Message]) -> None:
    """The transcript is a valid conversation for every provider: each call of each assistant
    message has exactly one tool message, right after it, before the next assistant message."""
    owed: list[str] = []
    for m in messages:
        if m.role == "assistant":
            assert owed == [], f"calls {owed} unanswered before the next reply"
            owed = [c.id for c in m.tool_calls]
        elif m.role == "tool":
            assert m.call_id in owed, f"a result for {m.call_id!r}, which nothing owed"
            owed.remove(m.call_id)
    assert owed == [], f"calls {owed} never answered"
