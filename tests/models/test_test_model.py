"""F29: ``durable_turns.testing.TestModel`` calls each tool once with an input that fits its
schema, then sums up; ``resolve_model("test")`` (``--model test``) is it.
"""

from __future__ import annotations

from typing import Any, Literal

import jsonschema
import pydantic
import pytest

from durable_turns import Agent, MemoryStore, Runtime, ToolContext, tool
from durable_turns.models.resolve import resolve_model
from durable_turns.testing import TestModel, example_input


class Address(pydantic.BaseModel):
    street: str = pydantic.Field(min_length=3)
    zip: str | None = None


class Order(pydantic.BaseModel):
    item: str = pydantic.Field(max_length=3)
    quantity: int = pydantic.Field(gt=0, le=10)
    price: float = pydantic.Field(ge=5)
    kind: Literal["a", "b"]
    tags: list[str] = pydantic.Field(min_length=2)
    ship_to: Address
    when: str = pydantic.Field(json_schema_extra={"format": "date-time"})


SCHEMAS: list[dict[str, Any]] = [
    Order.model_json_schema(),
    {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMaximum": 0}},
     "required": ["n"]},
    {"type": "object", "properties": {"x": {"anyOf": [{"type": "null"},
                                                      {"type": "number", "minimum": 2}]}},
     "required": ["x"]},
    {"type": "object", "properties": {"e": {"type": "string", "format": "email"},
                                      "u": {"type": ["null", "boolean"]}},
     "required": ["e", "u"]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
               {"properties": {"b": {"const": 7}}, "required": ["b"]}]},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_a_generated_input_fits_its_schema_and_is_the_same_each_time(
        schema: dict[str, Any]) -> None:
    made = example_input(schema)
    jsonschema.validate(made, schema)
    assert example_input(schema) == made


def test_resolve_model_test_is_the_test_model() -> None:
    assert isinstance(resolve_model("test"), TestModel)


@tool
def add(a: int, b: int, ctx: ToolContext) -> int:
    """Add two numbers."""
    return a + b


@tool
def shout(text: str, ctx: ToolContext) -> str:
    """Shout."""
    return text.upper()


async def test_each_tool_is_called_once_then_the_turn_is_summed_up() -> None:
    model = TestModel()
    async with Runtime([Agent("t", "x", [add, shout], model=model)], MemoryStore()) as rt:
        result = await rt.session("t", "s").turn("anything")
        transcript = await rt.session("t", "s").transcript()
    calls = [c for m in transcript for c in m.tool_calls]
    assert sorted(c.name for c in calls) == ["add", "shout"]
    assert result.text == 'Called each tool once.\n- add returned 2\n- shout returned "TEXT"'


async def test_call_tools_names_the_tools_to_call() -> None:
    model = TestModel(call_tools=["shout", "missing"], text="Done.")
    async with Runtime([Agent("t", "x", [add, shout], model=model)], MemoryStore()) as rt:
        result = await rt.session("t", "s").turn("anything")
    assert result.text == 'Done.\n- shout returned "TEXT"'
