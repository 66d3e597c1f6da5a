"""Tools: what the model may call, and how the engine classifies them (F3).

A tool's ``run`` decides its delivery guarantee by how it is declared:

- a plain ``def`` is **local**: it runs inside the step's store transaction, so writes made
  through ``ctx.store.unwrap()`` commit or roll back with the step — exactly once;
- an ``async def`` is **remote**: it cannot join the transaction, so a crash between its
  effect and the commit re-runs it — at least once; key remote effects on
  ``ctx.idempotency_key``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, get_args, get_type_hints, overload

import jsonschema
import pydantic

from ._in_doubt import InDoubt, checked_in_doubt
from .context import ActionContext, ToolContext
from .errors import ConfigurationError, FatalToolError, RetryStep, runtime_failure


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    input: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    """A JSON schema (an object schema) for the call's input."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input": dict(self.input)}


RunFn = Callable[[dict[str, Any], ToolContext], Any]
OnRetry = Callable[[int, float, BaseException], None]
"""Told ``(failed attempt, delay in seconds, its exception)`` before a tool is asked again."""
RETRY_BACKOFF_CAP = 30.0
"""The longest backoff between two attempts of a tool call, in seconds."""


def backoff(base: float, attempt: int, cap: float) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based) of a call retried from a
    first backoff of ``base``: doubled per attempt up to ``cap``, with "equal jitter" (half
    of it fixed, half random), so that callers failing together do not retry together."""
    ceiling = min(base * 2.0 ** (attempt - 1), cap)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


class Tool:
    """A tool: its spec and its ``run(input, ctx)``.

    Args:
        spec: name, description and input schema shown to the model.
        run: ``def run(input, ctx)`` (local) or ``async def run(input, ctx)`` (remote).
        validate: checks a call's input (default: the spec's JSON schema).
        interruptible: a remote tool that a cancel of its turn stops at once (see the
            ``interruptible`` attribute); what :func:`~durable_turns.subagent` builds.
        timeout: seconds one attempt may take (``None``: no limit). A remote tool over it is
            cancelled; a local one cannot be (it runs inside the step's transaction): when it
            returns late its writes are rolled back. Either way the attempt fails with
            ``TimeoutError``.
        retries: how often a remote tool's failed attempt is tried again before its error
            becomes the call's result (default 0). Every attempt sees the same
            ``ctx.idempotency_key``; ``ctx.attempt`` counts them.
        retry_on: the exceptions that are retried (default: any ``Exception`` but
            :class:`~durable_turns.errors.FatalToolError`; a timeout is a ``TimeoutError``).
        retry_delay: the first backoff in seconds; it doubles per attempt, with jitter, up
            to 30 s.
        uses_context: whether ``run`` reads its ``ctx``. When it does not, the engine builds
            no context for a call and passes ``None`` (``@tool`` sets this for a function
            without a :class:`ToolContext` parameter).
        in_doubt: what a replay does with a remote call that began and did not finish (a
            crash between its effect and its commit): ``"rerun"`` (the default: run it again
            under the same key, nothing more written), ``"ask"`` (park the turn asking a
            person) or a reconcile function (the guide "Remote calls in doubt").

    Raises:
        ConfigurationError: ``run`` is not callable, a limit is negative, or ``retries`` is
            set on a local tool (it would hold the step's transaction through the backoff).
    """

    __slots__ = ("_check", "in_doubt", "interruptible", "remote", "retries", "retry_delay",
                 "retry_on", "run", "spec", "timeout", "uses_context")

    def __init__(
        self,
        spec: ToolSpec,
        run: RunFn,
        *,
        validate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        interruptible: bool = False,
        timeout: float | None = None,
        retries: int = 0,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        retry_delay: float = 0.5,
        uses_context: bool = True,
        in_doubt: InDoubt = "rerun",
    ) -> None:
        if not callable(run):
            raise ConfigurationError(f"tool {spec.name!r}: run must be callable")
        if timeout is not None and not timeout > 0:
            raise ConfigurationError(f"tool {spec.name!r}: timeout must be > 0 seconds")
        if not isinstance(retries, int) or retries < 0:
            raise ConfigurationError(f"tool {spec.name!r}: retries must be an int >= 0")
        if retry_delay < 0:
            raise ConfigurationError(f"tool {spec.name!r}: retry_delay must be >= 0")
        if not isinstance(retry_on, tuple) or not all(
                isinstance(c, type) and issubclass(c, Exception) for c in retry_on):
            raise ConfigurationError(
                f"tool {spec.name!r}: retry_on must be a tuple of Exception classes")
        self.spec = spec
        self.run = run
        self.remote = _is_async(run)
        self.interruptible = interruptible and self.remote
        """A cancel of the turn cancels the running call (``asyncio.CancelledError`` is
        raised in it) instead of waiting for it to return: for calls that wait on other
        durable work, such as a subagent's turn, and stop it on the way out."""
        if retries and not self.remote:
            raise ConfigurationError(
                f"tool {spec.name!r}: retries apply to remote tools (async def); a local "
                "tool runs inside the step's transaction, which would hold the database's "
                "write lock through the backoff"
            )
        self.timeout = timeout
        self.retries = retries
        self.retry_on = retry_on
        self.retry_delay = retry_delay
        self.in_doubt: InDoubt = checked_in_doubt(spec.name, in_doubt, self.remote)
        self.uses_context = uses_context or self.in_doubt != "rerun"  # the intent's key
        self._check = validate or _schema_validator(spec)

    async def call(self, args: dict[str, Any], ctx: ToolContext | None,
                   on_retry: OnRetry | None = None, attempt: int | None = None) -> Any:
        """Run a remote tool's attempts: each within ``timeout``, up to ``1 + retries``.

        Returns the first attempt's result that did not raise; raises the last attempt's
        exception (a timeout as ``TimeoutError`` naming the tool and the limit). Exceptions
        outside ``retry_on``, :class:`~durable_turns.errors.FatalToolError`, the runtime's
        own failures (``errors.RUNTIME_FAILURES``, met through the context) and its signals
        (``BaseException``) are raised at once.

        With ``attempt`` (a scheduler that retries the step itself, as Temporal does), only
        that attempt runs: a failure the tool would retry raises
        :class:`~durable_turns.errors.RetryStep` with its backoff instead of waiting here.
        """
        if attempt is not None:
            return await self._one_attempt(args, ctx, on_retry, attempt)
        if self.timeout is None and not self.retries:
            return await self.run(args, ctx)  # type: ignore[arg-type]  # None: unused
        attempt = 1
        while True:
            try:
                return await self._one_attempt(args, ctx, on_retry, attempt)
            except RetryStep as retry:
                await asyncio.sleep(retry.delay)
                attempt += 1

    async def _one_attempt(self, args: dict[str, Any], ctx: ToolContext | None,
                           on_retry: OnRetry | None, attempt: int) -> Any:
        """Attempt ``attempt``: its result, its error, or :class:`RetryStep` when the error
        is retried (``on_retry`` told first)."""
        if ctx is not None:
            ctx.attempt = attempt
        try:
            return await self._attempt(args, ctx)
        except Exception as e:
            if not self.retries_after(e, attempt):
                raise  # the runtime's own failure abandons the step: never retried here
            delay = self.backoff(attempt)
            if on_retry is not None:
                on_retry(attempt, delay, e)
            raise RetryStep(f"tool {self.name!r} failed on attempt {attempt} of "
                            f"{self.retries + 1}: {type(e).__name__}: {e}",
                            delay=delay, attempt=attempt) from e

    def retries_after(self, error: Exception, attempt: int) -> bool:
        """Whether failed attempt ``attempt`` (1-based) of a call is tried again."""
        return attempt <= self.retries and not isinstance(error, FatalToolError) \
            and isinstance(error, self.retry_on) and runtime_failure(error) is None

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (:func:`backoff` from
        ``retry_delay``, up to :data:`RETRY_BACKOFF_CAP`)."""
        return backoff(self.retry_delay, attempt, RETRY_BACKOFF_CAP)

    async def _attempt(self, args: dict[str, Any], ctx: ToolContext | None) -> Any:
        if self.timeout is None:
            return await self.run(args, ctx)  # type: ignore[arg-type]  # None: unused
        try:
            async with asyncio.timeout(self.timeout) as limit:
                return await self.run(args, ctx)  # type: ignore[arg-type]
        except TimeoutError:
            if not limit.expired():
                raise  # the tool's own TimeoutError, not our limit
            raise TimeoutError(f"tool {self.name!r} took longer than {self.timeout:g}s and "
                               "was cancelled") from None

    def call_local(self, args: dict[str, Any], ctx: ToolContext | None) -> Any:
        """Run a local tool once; past ``timeout`` it raises ``TimeoutError`` when it returns.

        A local tool cannot be interrupted: it runs on the store's thread, inside the step's
        transaction. Raising after the fact makes the engine roll its writes back, so a
        late result never commits.
        """
        if self.timeout is None:
            return self.run(args, ctx)  # type: ignore[arg-type]  # None: unused
        start = time.monotonic()
        out = self.run(args, ctx)  # type: ignore[arg-type]
        took = time.monotonic() - start
        if took > self.timeout and not inspect.isawaitable(out):
            raise TimeoutError(f"tool {self.name!r} took {took:.3g}s, longer than its "
                               f"{self.timeout:g}s; its writes were rolled back")
        return out

    @property
    def name(self) -> str:
        return self.spec.name

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        """Check a call's input against the schema.

        Raises:
            ValueError: naming the field that is wrong.
        """
        return self._check(data)

    def __repr__(self) -> str:
        kind = "remote" if self.remote else "local"
        return f"Tool({self.spec.name!r}, {kind})"


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects
    )


def compile_schema(schema: Mapping[str, Any]) -> Any:
    """A checked, reusable validator for a JSON schema (cached: checking is costly).

    Raises:
        jsonschema.SchemaError: the schema itself is invalid.
    """
    return _compile(json.dumps(schema, sort_keys=True))


@functools.lru_cache(maxsize=256)
def _compile(canonical: str) -> Any:
    schema = json.loads(canonical)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_problem(validator: Any, value: Any) -> str | None:
    """The most relevant reason ``value`` does not fit, naming the field; ``None`` if it fits.
    A number that is not finite (``1e400`` read as infinity, ``NaN``) fits no schema: JSON
    has no such number, so it could not be stored as it was given."""
    infinite = _not_finite(value, ())
    if infinite is not None:
        return f"{'.'.join(infinite)}: not a finite number" if infinite else \
            "not a finite number"
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else str(error.message)


def _not_finite(value: Any, path: tuple[str, ...]) -> tuple[str, ...] | None:
    """Where in ``value`` a number is not finite (``()``: ``value`` itself); ``None``: none."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list | tuple) else ()
    for k, v in items:
        found = _not_finite(v, (*path, str(k)))
        if found is not None:
            return found
    return None


def _schema_validator(spec: ToolSpec) -> Callable[[dict[str, Any]], dict[str, Any]]:
    try:
        validator = compile_schema(spec.input)
    except jsonschema.SchemaError as e:
        raise ConfigurationError(f"tool {spec.name!r}: invalid input schema: {e.message}") from e

    def check(data: dict[str, Any]) -> dict[str, Any]:
        problem = schema_problem(validator, data)
        if problem is not None:
            raise ValueError(problem)
        return data

    return check


_PLAIN = (str, int, float, bool)


def _plain_fields(model: type[pydantic.BaseModel]) -> tuple[tuple[str, type], ...] | None:
    """``(name, type)`` of every field when each is a bare ``str``/``int``/``float``/``bool``
    with no constraint and the model has no validator: input whose values already have exactly
    these types is what pydantic would return unchanged."""
    decorators = model.__pydantic_decorators__
    if any(getattr(decorators, f.name) for f in fields(decorators)):
        return None
    plain: list[tuple[str, type]] = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if not isinstance(kind, type) or kind not in _PLAIN or info.metadata \
                or info.alias not in (None, name):
            return None
        plain.append((name, kind))
    return tuple(plain)


def _pydantic_validator(
    model: type[pydantic.BaseModel], schema: Mapping[str, Any],
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Checks a call's input against the schema the model was shown, strictly (``true`` is
    no integer, ``"1"`` no number, as JSON Schema says), then lets pydantic build the
    arguments (a date from its string, a tuple from a list: what the schema allows)."""
    plain = _plain_fields(model)
    names = frozenset(name for name, _ in plain or ())
    strict = _schema_validator(ToolSpec(model.__name__, "", dict(schema)))

    def check(data: dict[str, Any]) -> dict[str, Any]:
        # The fast path: every field given, with exactly its type (a finite number, if a
        # float), and nothing else.
        if plain is not None and len(data) == len(plain) and data.keys() == names and all(
                type(data[name]) is kind and (kind is not float or math.isfinite(data[name]))
                for name, kind in plain):
            return {name: data[name] for name, _ in plain}
        strict(data)
        try:
            obj = model.model_validate(data)
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None
        return {name: getattr(obj, name) for name in type(obj).model_fields}

    return check


@overload
def tool(fn: Callable[..., Any], *, name: str | None = None,
         description: str | None = None, timeout: float | None = None, retries: int = 0,
         retry_on: tuple[type[BaseException], ...] = (Exception,),
         retry_delay: float = 0.5,
         in_doubt: InDoubt = "rerun") -> Tool: ...


@overload
def tool(fn: None = None, *, name: str | None = None,
         description: str | None = None, timeout: float | None = None, retries: int = 0,
         retry_on: tuple[type[BaseException], ...] = (Exception,),
         retry_delay: float = 0.5,
         in_doubt: InDoubt = "rerun") -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None,
    description: str | None = None, timeout: float | None = None, retries: int = 0,
    retry_on: tuple[type[BaseException], ...] = (Exception,), retry_delay: float = 0.5,
    in_doubt: InDoubt = "rerun",
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` from a function's signature and docstring.

    The JSON schema comes from the parameters' type hints (pydantic), the description from the
    docstring. A parameter annotated :class:`ToolContext` receives the context. Use as
    ``@tool`` or ``@tool(name=…, timeout=…, retries=…)``; ``timeout``, ``retries``,
    ``retry_on``, ``retry_delay`` and ``in_doubt`` are :class:`Tool`'s.
    """

    def build(f: Callable[..., Any]) -> Tool:
        tool_name = name or f.__name__
        hints = get_type_hints(f)
        fields: dict[str, Any] = {}
        ctx_param: str | None = None
        for p in inspect.signature(f).parameters.values():
            hint = hints.get(p.name, Any)
            if hint is ToolContext or ToolContext in get_args(hint):
                ctx_param = p.name
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ConfigurationError(f"tool {tool_name!r}: *args/**kwargs have no schema")
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (hint, default)
        model = pydantic.create_model(f"{tool_name}_input", **fields)
        schema = model.model_json_schema()
        schema.pop("title", None)
        desc = description or inspect.getdoc(f) or ""
        if not desc:
            raise ConfigurationError(f"tool {tool_name!r} needs a docstring or a description")
        spec = ToolSpec(tool_name, desc, schema)

        def call_args(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            return {**args, ctx_param: ctx} if ctx_param else args

        run: RunFn
        if _is_async(f):
            async def run_async(args: dict[str, Any], ctx: ToolContext) -> Any:
                return await f(**call_args(args, ctx))

            run = run_async
        else:
            def run_sync(args: dict[str, Any], ctx: ToolContext) -> Any:
                return f(**call_args(args, ctx))

            run = run_sync
        return Tool(spec, run, validate=_pydantic_validator(model, schema), timeout=timeout,
                    retries=retries, retry_on=retry_on, retry_delay=retry_delay,
                    uses_context=ctx_param is not None, in_doubt=in_doubt)

    return build(fn) if fn is not None else build


def define_action(
    name: str,
    description: str,
    input: Mapping[str, Any] | type[pydantic.BaseModel],
    run: Callable[[Any, ActionContext], Any],
) -> Tool:
    """A tool whose ``run(input, ActionContext)`` sees only who asked, not the store.

    ``input`` is a JSON schema or a pydantic model (then ``run`` gets the model instance).
    An ``async`` run is remote, a plain one local.
    """
    validate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    model: type[pydantic.BaseModel] | None = None
    if isinstance(input, type) and issubclass(input, pydantic.BaseModel):
        model = input
        schema = model.model_json_schema()
        schema.pop("title", None)
        validate = _pydantic_validator(model, schema)
    else:
        schema = dict(input)
    spec = ToolSpec(name, description, schema)

    def arg(data: dict[str, Any]) -> Any:
        return model(**data) if model else data

    wrapped: RunFn
    if _is_async(run):
        async def run_async(data: dict[str, Any], ctx: ToolContext) -> Any:
            return await run(arg(data), ActionContext(user=ctx.user))

        wrapped = run_async
    else:
        def run_sync(data: dict[str, Any], ctx: ToolContext) -> Any:
            return run(arg(data), ActionContext(user=ctx.user))

        wrapped = run_sync
    return Tool(spec, wrapped, validate=validate)


__all__ = [
    "RETRY_BACKOFF_CAP",
    "OnRetry",
    "RunFn",
    "Tool",
    "ToolSpec",
    "backoff",
    "compile_schema",
    "define_action",
    "schema_problem",
    "tool",
]
