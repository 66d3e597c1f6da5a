"""A turn's structured output (F25): its final answer validated against a JSON schema.

``start(…, output=…)`` keeps the schema (a pydantic model's, or one given as is) and its
retries in the turn's data (``output_schema``), so every process that drives the turn reads
the same. How the model is asked depends on the model (:func:`request_output`):

- natively, where the model says it can (a true ``structured_output`` attribute: the
  ``anthropic`` and ``openai_compatible`` adapters): the schema goes on the request
  (``ModelRequest.output``) and the adapter asks its provider for it (OpenAI's
  ``response_format`` ``json_schema``, Anthropic's ``output_config.format``); the system
  prompt is left as it is;
- else in the system prompt (:func:`system_with`): any model, the scripted one included.

Either way the final answer is its text, parsed as JSON (a fenced block is unwrapped) and
validated here with ``jsonschema`` against the schema as given; no synthetic tool, so the
transcript stays an ordinary conversation any provider replays.

At the turn's end (an assistant reply with no calls) :func:`settle` decides: valid → the turn
completes, its value kept in the turn's data (``OUTPUT``) in the same write as its end, so a
replay reads it and never asks again; invalid with retries left → a user message naming the
validation error (``by=OUTPUT_RETRY_BY``), committed as a step of its own, and the model is asked
again; no retries left → the turn fails with :class:`~durable_turns.errors.OutputInvalid`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from ..errors import OutputInvalid
from ..messages import OUTPUT_RETRY_BY, Message
from ..records import ChainEntry, TurnResult, TurnStatus

__all__ = ["OUTPUT_RETRIES", "OUTPUT_SCHEMA", "OutputSpec", "as_model", "native_output",
           "output_data", "request_output", "schema_of", "settle", "system_with"]

OUTPUT_RETRIES = 2
"""How many invalid final answers go back to the model by default (``output_retries``)."""
OUTPUT_SCHEMA = "output_schema"
"""The name of a turn's data that keeps its output schema and retries."""
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?```\s*$", re.DOTALL)


def schema_of(output: Any) -> dict[str, Any]:
    """The JSON schema of ``output``: a pydantic model class's, or a schema dict as is.

    Raises:
        ValueError: ``output`` is neither, or the schema itself is invalid.
    """
    make = getattr(output, "model_json_schema", None)
    if isinstance(output, type) and callable(make):
        schema: dict[str, Any] = dict(make())
    elif isinstance(output, Mapping):
        schema = dict(output)
    else:
        raise ValueError("output must be a pydantic model class or a JSON schema (a dict), "
                         f"not {type(output).__name__}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ValueError(f"the output schema is not a valid JSON schema: {e.message}") from None
    return schema


def output_data(output: Any, retries: int) -> dict[str, Any]:
    """The turn data ``start(output=…)`` stores: ``{OUTPUT_SCHEMA: {schema, retries}}``.

    Raises:
        ValueError: a bad ``output`` (:func:`schema_of`) or a negative ``retries``.
    """
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"output_retries must be an int >= 0, not {retries!r}")
    return {OUTPUT_SCHEMA: {"schema": schema_of(output), "retries": retries}}


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """A turn's output schema and how many invalid answers go back to the model."""

    schema: dict[str, Any]
    retries: int

    @classmethod
    def of(cls, turn: ChainEntry) -> OutputSpec | None:
        got = (turn.data or {}).get(OUTPUT_SCHEMA)
        if not isinstance(got, dict):
            return None
        return cls(dict(got["schema"]), int(got["retries"]))

    def instructions(self) -> str:
        return ("End the turn with a final answer that is only a JSON value (no prose, no "
                "code fence) matching this JSON schema:\n"
                + json.dumps(self.schema, sort_keys=True))

    def check(self, text: str) -> tuple[Any, str | None]:
        """``(value, None)`` for a valid answer, else ``(None, the validation error)``."""
        fenced = _FENCE.match(text)
        raw = fenced.group(1) if fenced else text
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as e:
            return None, f"the answer is not JSON: {e}"
        error = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(self.schema)(self.schema).iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(the value)"
            return None, f"at {where}: {error.message}"
        return value, None


def native_output(model: object) -> bool:
    """Whether ``model`` asks its provider for structured output itself (a true
    ``structured_output`` attribute, F25)."""
    return getattr(model, "structured_output", False) is True


def request_output(turn: ChainEntry, model: object) -> dict[str, Any] | None:
    """The schema a model step of ``turn`` puts on its request (``ModelRequest.output``):
    the turn's, for a model that takes it natively; else ``None``."""
    spec = OutputSpec.of(turn)
    return spec.schema if spec is not None and native_output(model) else None


def system_with(system: str, turn: ChainEntry, model: object = None) -> str:
    """The system prompt of a turn, with its output schema's instructions if it has one and
    ``model`` does not take the schema natively."""
    spec = OutputSpec.of(turn)
    if spec is None or native_output(model):
        return system
    return f"{system}\n\n{spec.instructions()}" if system else spec.instructions()


def settle(turn: ChainEntry, transcript: list[Message], text: str) -> TurnResult | Message:
    """What a final answer ``text`` of ``turn`` makes of it: its end (completed, with the
    validated ``output``; or failed with :class:`OutputInvalid`), or the user message that
    hands its validation error back to the model."""
    spec = OutputSpec.of(turn)
    if spec is None:
        return TurnResult(turn.turn_id, TurnStatus.COMPLETED, text)
    value, error = spec.check(text)
    if error is None:
        return TurnResult(turn.turn_id, TurnStatus.COMPLETED, text, output=value)
    asked = sum(1 for m in transcript if m.turn_id == turn.turn_id and m.by == OUTPUT_RETRY_BY)
    if asked >= spec.retries:
        return TurnResult(turn.turn_id, TurnStatus.FAILED,
                          error=str(OutputInvalid(error, spec.retries)))
    return Message("user", f"Your final answer did not match the output schema ({error}). "
                           "Answer again with only the JSON value.",
                   turn_id=turn.turn_id, by=OUTPUT_RETRY_BY)


def as_model(res: TurnResult, output: Any) -> TurnResult:
    """``res`` with its output made an instance of ``output`` when that is a pydantic model
    class (``turn(output=Model)``); else ``res`` as it is.

    Raises:
        pydantic.ValidationError: the value matched the model's schema but not its own
            validators.
    """
    validate = getattr(output, "model_validate", None)
    if res.output is None or not isinstance(output, type) or not callable(validate):
        return res
    return dataclasses.replace(res, output=validate(res.output))
