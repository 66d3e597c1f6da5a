"""F3: Tool declarations: schemas from type hints, classification, define_action."""

from __future__ import annotations

import datetime
from typing import Any, Literal

import pydantic
import pytest

from durable_turns import ActionContext, Tool, ToolContext, ToolSpec, User, define_action, tool
from durable_turns.errors import ConfigurationError


def test_tool_schema_comes_from_type_hints_and_docstring() -> None:
    @tool
    def create_order(item: str, quantity: int = 1, rush: Literal["no", "yes"] = "no",
                     ctx: ToolContext | None = None) -> dict[str, Any]:
        """Place an order for an item."""
        return {}

    spec = create_order.spec
    assert spec.name == "create_order"
    assert spec.description == "Place an order for an item."
    props = spec.input["properties"]
    assert props["item"]["type"] == "string"
    assert props["quantity"] == {"default": 1, "title": "Quantity", "type": "integer"}
    assert props["rush"]["enum"] == ["no", "yes"]
    assert spec.input["required"] == ["item"]
    assert not create_order.remote


def test_context_parameter_is_not_part_of_the_schema() -> None:
    @tool(name="ping", description="Ping a host.")
    async def anything(host: str, ctx: ToolContext) -> str:
        return host

    assert anything.name == "ping" and anything.remote
    assert set(anything.spec.input["properties"]) == {"host"}


def test_validation_names_the_field() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    assert add.validate({"a": 1, "b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match=r"^b: "):
        add.validate({"a": 1, "b": "two"})
    with pytest.raises(ValueError, match=r"'a' is a required property"):
        add.validate({"b": 1})


class Window(pydantic.BaseModel):
    start: datetime.date
    days: int = 1


def test_input_is_checked_strictly_against_the_advertised_schema() -> None:
    """What the schema the model saw refuses is refused, whatever pydantic would coerce
    (F3: such input becomes an error result, and the tool does not run)."""
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    assert add.spec.input["properties"]["a"]["type"] == "integer"
    for bad, where in (({"a": True, "b": 2}, "a"), ({"a": "1", "b": "2"}, "[ab]"),
                       ({"a": 1, "b": 2.5}, "b"), ({"a": 1, "b": None}, "b"),
                       ({"a": [1], "b": 2}, "a")):
        with pytest.raises(ValueError, match=rf"^{where}: "):
            add.validate(bad)
    assert add.validate({"a": 1, "b": 2.0}) == {"a": 1, "b": 2}  # 2.0 is an integer in JSON

    @tool
    async def book(window: Window, rooms: tuple[int, int]) -> None:
        """Book rooms for a window."""

    got = book.validate({"window": {"start": "2026-12-01"}, "rooms": [1, 2]})
    assert got == {"window": Window(start=datetime.date(2026, 12, 1)), "rooms": (1, 2)}
    with pytest.raises(ValueError, match=r"^window\.days: "):
        book.validate({"window": {"start": "2026-12-01", "days": "2"}, "rooms": [1, 2]})


def test_plain_inputs_validate_as_pydantic_does() -> None:
    """Every input of a tool with plain fields that its schema takes comes out exactly as
    pydantic's own check gives it, whether it takes the fast path (every field, exact types)
    or not."""
    @tool
    async def plain(n: int, name: str, ratio: float = 0.5, on: bool = False) -> None:
        """A tool with plain fields."""

    model = pydantic.create_model("plain_check", n=(int, ...), name=(str, ...),
                                  ratio=(float, 0.5), on=(bool, False))
    inputs: list[dict[str, Any]] = [
        {"n": 1, "name": "a", "ratio": 2.5, "on": True},  # exact types: the fast path
        {"n": 1, "name": "a"},  # defaults filled
        {"n": 1, "name": "a", "ratio": 2, "on": False},  # an int for a float
        {"n": 1, "name": "a", "ratio": 1.0, "on": True, "extra": 1},  # extra key dropped
    ]
    for data in inputs:
        expected = model.model_validate(data).model_dump()
        got = plain.validate(dict(data))
        assert got == expected and [type(v) for v in got.values()] == \
            [type(v) for v in expected.values()], data
    for bad in ({"n": 1.5, "name": "a", "ratio": 1.0, "on": True},
                {"n": "7", "name": "a", "ratio": 1.0, "on": True},  # no coercion
                {"n": 1, "name": "a", "on": 1},
                {"n": 1, "name": 3, "ratio": 1.0, "on": True}, {"name": "a"}):
        with pytest.raises(ValueError):
            plain.validate(dict(bad))


def test_raw_tool_validates_against_its_json_schema() -> None:
    t = Tool(ToolSpec("t", "d", {"type": "object", "properties": {"n": {"type": "integer"}},
                                  "required": ["n"]}), lambda i, c: i)
    assert t.validate({"n": 3}) == {"n": 3}
    with pytest.raises(ValueError, match=r"^n: 'x' is not of type 'integer'"):
        t.validate({"n": "x"})
    with pytest.raises(ValueError, match="'n' is a required property"):
        t.validate({})


def test_bad_declarations_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="docstring"):
        @tool
        def undocumented(x: int) -> int:
            return x

    with pytest.raises(ConfigurationError, match="invalid input schema"):
        Tool(ToolSpec("t", "d", {"type": "no-such-type"}), lambda i, c: i)
    with pytest.raises(ConfigurationError, match="must be callable"):
        Tool(ToolSpec("t", "d"), "not a function")  # type: ignore[arg-type]


def test_define_action_gets_only_the_user() -> None:
    class Refund(pydantic.BaseModel):
        order_id: str
        amount: float

    seen: list[Any] = []

    def run(data: Refund, ctx: ActionContext) -> str:
        seen.append((data, ctx))
        return "ok"

    action = define_action("refund", "Refund an order.", Refund, run)
    assert not action.remote
    assert action.spec.input["required"] == ["order_id", "amount"]
    args = action.validate({"order_id": "42", "amount": 9.5})
    with pytest.raises(ValueError, match=r"^amount: '9.5' is not of type 'number'"):
        action.validate({"order_id": "42", "amount": "9.5"})  # the schema says a number
    ctx = ToolContext("a", "s", "t", "c", "tool:1:c", "k", store=None,  # type: ignore[arg-type]
                      user=User("U1", True))
    assert action.run(args, ctx) == "ok"
    data, actx = seen[0]
    assert data == Refund(order_id="42", amount=9.5)
    assert actx == ActionContext(user=User("U1", True))

    async def remote_run(data: dict[str, Any], ctx: ActionContext) -> None:
        return None

    schema = {"type": "object", "properties": {}}
    assert define_action("notify", "Notify.", schema, remote_run).remote


async def test_a_context_is_built_only_for_tools_that_read_it() -> None:
    # A call's ToolContext (its idempotency key, its hooks) costs time on every tool step:
    # the engine builds one only for a tool whose run reads it.
    from durable_turns import Agent, MemoryStore, ModelReply, Runtime, ToolCall, scripted

    @tool
    async def plain(n: int) -> int:
        """No context."""
        return n

    @tool(retries=1, retry_delay=0.0)
    async def flaky(n: int) -> int:
        """No context, retried once."""
        flaky_calls.append(n)
        if len(flaky_calls) == 1:
            raise ConnectionError("once")
        return n

    seen: list[object] = []

    @tool
    def keyed(n: int, ctx: ToolContext) -> str:
        """Reads its context."""
        seen.append(ctx)
        return ctx.idempotency_key

    def custom_run(args: dict[str, Any], ctx: ToolContext) -> int:
        seen.append(ctx)
        return 1

    flaky_calls: list[int] = []
    bare = Tool(ToolSpec("bare", "Takes none.", {"type": "object"}), custom_run,
                uses_context=False)
    assert not plain.uses_context and not flaky.uses_context and not bare.uses_context
    assert keyed.uses_context and Tool(bare.spec, custom_run).uses_context
    assert define_action("act", "Act.", {"type": "object"}, lambda i, a: 1).uses_context

    calls = [ToolCall("c1", "plain", {"n": 1}), ToolCall("c2", "flaky", {"n": 2}),
             ToolCall("c3", "keyed", {"n": 3}), ToolCall("c4", "bare", {})]
    agent = Agent("ops", "", [plain, flaky, keyed, bare])
    model = scripted([ModelReply("", calls), ModelReply("ok")])
    async with Runtime([agent], MemoryStore(), model) as rt:
        s = rt.session("ops", "s1")
        assert (await s.turn("go")).text == "ok"
        results = {m.call_id: m.result for m in await s.transcript() if m.role == "tool"}
    assert results["c1"] == 1 and results["c2"] == 2 and flaky_calls == [2, 2]
    assert isinstance(seen[0], ToolContext) and results["c3"] == seen[0].idempotency_key
    assert len(results["c3"]) == 32 and seen[1] is None
