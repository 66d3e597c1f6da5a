"""F2: The stored log read back lazily: a MessageLog reads as the list of messages it stores."""

from __future__ import annotations

import json

import pytest

from durable_turns.messages import Message, MessageLog, ToolCall, encode_message

CALL = ToolCall("c1", "lookup", {"q": "x"})
MESSAGES = [
    Message("user", "hi", turn_id="t1", by="U1"),
    Message("assistant", "", (CALL,), turn_id="t1", usage={"input_tokens": 3}),
    Message("tool", call_id="c1", result={"n": 1}, turn_id="t1"),
    Message("assistant", "done", turn_id="t1"),
]


def stored() -> MessageLog:
    return MessageLog.stored(encode_message(m) for m in MESSAGES)


def test_reads_as_the_list_it_stores() -> None:
    log = stored()
    assert len(log) == 4
    assert log == MESSAGES
    assert not log != MESSAGES  # noqa: SIM202 - __ne__ is overridden too
    assert MESSAGES == log  # noqa: SIM300 - the reflected comparison
    assert list(log) == MESSAGES
    assert list(reversed(log)) == MESSAGES[::-1]
    assert log[0] == MESSAGES[0] and log[-1] == MESSAGES[-1]
    assert log[1:3] == MESSAGES[1:3]
    assert MESSAGES[2] in log and Message("user", "other") not in log
    assert log.copy() == MESSAGES and type(log.copy()) is list
    assert all(isinstance(m, Message) for m in log)
    assert repr(log) == repr(MESSAGES)


def test_items_are_decoded_once_and_handed_out_as_messages() -> None:
    log = stored()
    first = log[1]
    assert first is log[1]  # decoded on first read, kept
    assert first.tool_calls == (CALL,)


def test_appending_and_extending() -> None:
    log = MessageLog()
    log.extend(stored())  # another log's items move over as they are
    log.append(Message("user", "again", turn_id="t2"))
    assert log == [*MESSAGES, Message("user", "again", turn_id="t2")]
    assert log != MESSAGES and log != "not a list"


def test_a_corrupt_record_fails_when_read() -> None:
    log = MessageLog.stored([encode_message(MESSAGES[0]), json.dumps({"v": 99, "role": "user"})])
    assert log[0] == MESSAGES[0]
    with pytest.raises(ValueError, match="unsupported message record version"):
        log[1]


def joined(after: int = 0) -> MessageLog:
    """The four messages as a store may keep them: the first three in one string (of which
    the last ``3 - after`` count), then the fourth alone."""
    rows = "\n".join(encode_message(m) for m in MESSAGES[:3])
    return MessageLog.joined([(rows, 3 - after), (encode_message(MESSAGES[3]), 1)])


@pytest.mark.parametrize("first_read", [0, 1, 2, 3, -1])
def test_messages_joined_in_one_string_read_as_the_list(first_read: int) -> None:
    log = joined()
    assert len(log) == 4
    assert log[first_read] == MESSAGES[first_read]  # splits the string, whichever is read
    assert log == MESSAGES and list(reversed(log)) == MESSAGES[::-1]
    assert log[1] is log[1]


@pytest.mark.parametrize("after", [1, 2])
def test_the_last_messages_of_a_joined_string(after: int) -> None:
    log = joined(after)
    assert log == MESSAGES[after:]
    assert list(reversed(joined(after))) == MESSAGES[after:][::-1]


def test_joined_messages_move_to_another_log_unread() -> None:
    log = MessageLog.stored([encode_message(Message("user", "before"))])
    log.extend(joined(1))  # the references move over; the string is split in ``log``
    log.append(Message("user", "after"))
    assert log[2] == MESSAGES[2]
    assert log == [Message("user", "before"), *MESSAGES[1:], Message("user", "after")]
    log.clear()
    assert log == []


def test_a_joined_string_with_fewer_messages_than_its_places_fails_when_read() -> None:
    log = MessageLog.joined([(encode_message(MESSAGES[0]) + "\n" + encode_message(
        MESSAGES[1]), 3)])
    with pytest.raises(ValueError, match="holds 2 messages, not the 3"):
        log[0]


@pytest.mark.parametrize("value", [
    {"text": "é ☃ \u2028 \x00 \"q\" \\ \n", "n": -3, "f": 0.1 + 0.2, "ok": True, "none": None},
    [1, [2.5, {"k": []}], "", 10**18],
    {"big": 10**30},  # beyond 64 bits: orjson refuses, the standard library writes it
    {1: "a"},  # a non-string key: the standard library's "1"
    ("a", 1),
])
def test_encode_json_writes_what_the_standard_library_reads_back(value: object) -> None:
    from durable_turns.messages import encode_json
    text = encode_json(value)
    assert json.loads(text) == json.loads(json.dumps(value))


def test_encode_json_refuses_what_the_standard_library_refuses() -> None:
    import dataclasses
    import datetime

    from durable_turns.messages import encode_json

    @dataclasses.dataclass
    class Point:
        x: int

    for value in (Point(1), datetime.date(2026, 1, 1), object(), {"s": {1, 2}}):
        with pytest.raises(TypeError, match="not JSON serializable"):
            encode_json(value)
