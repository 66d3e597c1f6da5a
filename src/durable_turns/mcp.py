"""Tools from Model Context Protocol servers (F17): ``await mcp_tools(server)``.

``server`` is what the official ``mcp`` SDK's ``Client`` takes: ``StdioServerParameters``
(the server is a command, spoken to over its stdin and stdout) or the URL of a
streamable-HTTP endpoint. :func:`mcp_tools` reads the server's tool list once, when it is
called, and returns one remote :class:`~durable_turns.tools.Tool` per MCP tool, with the
server's name, description and input schema passed to the model unchanged.

They are remote durable tools like any ``async def`` tool: at least once (a crash between the
server's answer and the step's commit calls it again, with the same ``ctx.idempotency_key``,
also sent to the server in the request's ``_meta``), and their results are checkpointed, so a
replay never calls the server again for a committed step. Each call opens its own connection
(for stdio: starts the server's process) and closes it, so nothing is held between turns or
across a crash; that costs a process start per call on stdio.

Failures become the call's error result, which the model reads, never a failed turn:

- the server cannot be reached (not started, connection refused, a crash mid-call):
  ``{"error": "ConnectionError: MCP server '<name>' …"}``;
- the server answers with an error (an unknown tool, bad arguments): ``MCPError: …``;
- the tool reports an error (``isError``): ``McpToolError: <its text>``.

A server that asks the user something (an ``input_required`` result, or the older
server-initiated ``elicitation/create``) parks the turn (F26): the park's prompt is the
server's message and its schema wraps the server's requested schema as
``{"action": "accept" | "decline" | "cancel", "content": <the server's schema>}``. While the
turn waits the server is told nothing (a park is no ``cancel``, and the request is not
cancelled): the call is not retried, an ``elicitation/create`` is left unanswered and the
connection closes. On ``resume()`` the tool runs again from the top and the stored answer goes
back to the server once (``accept`` with ``content``, or ``decline`` / ``cancel``).

A sampling request (``sampling/createMessage``) is refused with :data:`SAMPLING_REFUSED`
unless ``mcp_tools(…, sampling=True)``: then the agent's model answers it, as a step of its
own (``StepServices.sample``), which a run of the tool again reads instead of asking the model.

``timeout`` and ``retries`` are the tool's (:class:`~durable_turns.tools.Tool`): retry on
``ConnectionError`` to ride out a server that restarts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shlex
from collections.abc import Iterable, Mapping
from typing import Any, cast

from .context import ToolContext
from .errors import ConfigurationError, Parked
from .messages import Message
from .tools import RunFn, Tool, ToolSpec

try:
    import mcp_types
    from mcp import Client, MCPError, StdioServerParameters
    from mcp_types.jsonrpc import CONNECTION_CLOSED
except ImportError as e:  # pragma: no cover - the extra is part of dev
    raise ImportError(
        "durable_turns.mcp needs the official MCP SDK: pip install 'durable-turns[mcp]'"
    ) from e

McpServer = StdioServerParameters | str
"""A stdio server's parameters, or a streamable-HTTP URL."""
LIST_TIMEOUT = 60.0
"""Seconds :func:`load_mcp_servers` waits for a server's tool list."""
IDEMPOTENCY_META = "durable-turns/idempotency-key"
"""The ``_meta`` key that carries ``ctx.idempotency_key`` on every ``tools/call``."""


class McpToolError(Exception):
    """An MCP tool answered with ``isError``; its text is the message (the model reads it)."""


def server_label(server: McpServer) -> str:
    """How errors name a server: its URL, or its command line."""
    if isinstance(server, str):
        return server
    return shlex.join([server.command, *server.args])


def _cause(e: BaseException) -> BaseException:
    # anyio's task groups wrap a transport's failure in an ExceptionGroup: find the cause.
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _reason(e: BaseException) -> str:
    e = _cause(e)
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


async def mcp_tools(server: McpServer, *, name: str | None = None, prefix: str = "",
                    include: Iterable[str] | None = None, timeout: float | None = None,
                    retries: int = 0, retry_delay: float = 0.5,
                    sampling: bool = False) -> list[Tool]:
    """The tools of an MCP server, as remote durable tools.

    Args:
        server: ``StdioServerParameters(command=…, args=[…])`` or a streamable-HTTP URL.
        name: how error results name the server (default: its URL or command line).
        prefix: put before every tool's name (to keep two servers' tools apart).
        include: only these tools (MCP names); default all.
        timeout: seconds each call may take (``Tool(timeout=…)``).
        retries: how often a failed call is tried again (``Tool(retries=…)``).
        retry_delay: the first backoff in seconds.
        sampling: answer the server's sampling requests (``sampling/createMessage``) with
            the agent's model, each as a step of its own; else they are refused with
            :data:`SAMPLING_REFUSED`.

    Returns:
        One :class:`~durable_turns.tools.Tool` per MCP tool, in the server's order.

    Raises:
        ConfigurationError: the server could not be reached or could not list its tools,
            or ``include`` names a tool it does not have.
    """
    label = name or server_label(server)
    listed: list[mcp_types.Tool] = []
    try:
        async with Client(server) as client:
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                listed += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
    except Exception as e:
        raise ConfigurationError(
            f"MCP server {label!r} could not list its tools: {_reason(e)}") from e
    wanted = set(include) if include is not None else None
    missing = sorted(wanted - {t.name for t in listed}) if wanted is not None else []
    if missing:
        raise ConfigurationError(f"MCP server {label!r} has no tools {missing}")
    return [
        Tool(ToolSpec(prefix + t.name, t.description or t.title or t.name, t.input_schema),
             _caller(server, label, t.name, sampling), timeout=timeout, retries=retries,
             retry_delay=retry_delay)
        for t in listed if wanted is None or t.name in wanted
    ]


SAMPLING_REFUSED = ("durable_turns answers MCP sampling requests only from servers whose tools "
                    "were made with mcp_tools(..., sampling=True): this one's were not")
"""The error message a server's ``sampling/createMessage`` request receives without
``sampling=True``."""

_STOPS = {"end_turn": "endTurn", "stop": "endTurn", "max_tokens": "maxTokens",
          "length": "maxTokens", "stop_sequence": "stopSequence"}


def answer_schema(requested: Mapping[str, Any]) -> dict[str, Any]:
    """The schema of a park made from an MCP input request: an action and the content."""
    return {"type": "object", "required": ["action"], "additionalProperties": False,
            "properties": {"action": {"enum": ["accept", "decline", "cancel"]},
                           "content": dict(requested)}}


def _sampled_messages(params: mcp_types.CreateMessageRequestParams) -> list[Message] | str:
    """A sampling request's messages as the model reads them, or why they cannot be."""
    messages: list[Message] = []
    for m in params.messages:
        blocks = m.content if isinstance(m.content, list) else [m.content]
        if not all(isinstance(b, mcp_types.TextContent) for b in blocks):
            return "durable_turns answers sampling requests of text messages only"
        text = "\n".join(b.text for b in blocks if isinstance(b, mcp_types.TextContent))
        messages.append(Message("user" if m.role == "user" else "assistant", text))
    return messages


class _Asker:
    """The client's callbacks for one call: each elicitation is a park of the turn, each
    sampling request (with ``sampling=True``) a step asking the agent's model."""

    def __init__(self, ctx: ToolContext, sampling: bool) -> None:
        self.ctx = ctx
        self.sampling = sampling
        self.asked = 0
        self.sampled = 0
        self.parked: Parked | None = None
        self.parking = asyncio.Event()

    async def elicit(self, context: Any, params: mcp_types.ElicitRequestParams
                     ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        if not isinstance(params, mcp_types.ElicitRequestFormParams):
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST,
                                       message="durable_turns answers form elicitations only")
        self.asked += 1
        input_id = f"mcp:{self.ctx.call_id}:{self.asked}"
        schema = answer_schema(params.requested_schema)
        try:
            answer = await self.ctx.request_input(input_id, params.message, schema)
        except Parked as p:
            # The first time: the turn parks once the call is given up. The server's question
            # is never answered for it (not "cancel": nobody cancelled); the connection closes.
            self.parked = self.parked or p
            self.parking.set()
            await asyncio.Event().wait()  # until the connection is closed under it
            raise
        action = answer.get("action", "cancel") if isinstance(answer, Mapping) else "cancel"
        if action != "accept":
            return mcp_types.ElicitResult(action="decline" if action == "decline" else "cancel")
        return mcp_types.ElicitResult(action="accept", content=answer.get("content") or {})

    async def sample(self, context: Any, params: mcp_types.CreateMessageRequestParams
                     ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        services = self.ctx.services
        if not self.sampling or services is None:
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=SAMPLING_REFUSED)
        messages = _sampled_messages(params)
        if isinstance(messages, str):
            return mcp_types.ErrorData(code=mcp_types.INVALID_PARAMS, message=messages)
        self.sampled += 1
        try:
            reply = await services.sample(f"mcp:{self.ctx.call_id}:{self.sampled}",
                                          params.system_prompt or "", messages)
        except Exception as e:  # the model failed: the server reads why
            return mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR,
                                       message=f"the agent's model failed: {_reason(e)}")
        return mcp_types.CreateMessageResult(
            role="assistant", content=mcp_types.TextContent(type="text", text=reply.text),
            model=reply.model, stop_reason=_STOPS.get(reply.stop, reply.stop or None))

    async def until_parked(self, call: asyncio.Future[Any]) -> None:
        """Wait for the call to end, or for one of its questions to park the turn."""
        parking = asyncio.ensure_future(self.parking.wait())
        try:
            await asyncio.wait({call, parking}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            parking.cancel()


async def _stop(call: asyncio.Future[Any] | None) -> None:
    """Stop what is left of a call on this side (its outcome is not wanted)."""
    if call is None:
        return
    if not call.done():
        call.cancel()
    await asyncio.gather(call, return_exceptions=True)


def _caller(server: McpServer, label: str, tool_name: str, sampling: bool) -> RunFn:
    async def call(args: dict[str, Any], ctx: ToolContext) -> Any:
        connected = False
        asker = _Asker(ctx, sampling)
        running: asyncio.Future[mcp_types.CallToolResult] | None = None
        try:
            async with Client(server, elicitation_callback=asker.elicit,
                              sampling_callback=asker.sample) as client:
                connected = True
                meta = cast(mcp_types.RequestParamsMeta, {IDEMPOTENCY_META: ctx.idempotency_key})
                running = asyncio.ensure_future(client.call_tool(tool_name, args, meta=meta))
                try:
                    await asker.until_parked(running)
                except BaseException:
                    await _stop(running)  # a timeout, a cancel: the request is cancelled
                    raise
                if asker.parked is None:
                    result = running.result()
            # Parked: leaving the client closed the connection with the question unanswered
            # and the call not cancelled; what was left of it on this side stops now.
            await _stop(running)
        except Exception as e:
            await _stop(running)
            if asker.parked is not None:
                raise asker.parked from None
            cause = _cause(e)
            if connected and isinstance(cause, MCPError) and cause.code != CONNECTION_CLOSED:
                raise cause from None  # the server answered: an unknown tool, bad arguments
            what = "failed during" if connected else "is unreachable for"
            raise ConnectionError(
                f"MCP server {label!r} {what} {tool_name!r}: {_reason(e)}") from e
        if asker.parked is not None:
            raise asker.parked
        if result.is_error:
            raise McpToolError(_text(result) or f"{tool_name} failed")
        return _value(result)

    return call


def _text(result: mcp_types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent))


def _value(result: mcp_types.CallToolResult) -> Any:
    """A JSON value for the model: the structured result, else the text, else the blocks."""
    if result.structured_content is not None:
        return result.structured_content
    if all(isinstance(b, mcp_types.TextContent) for b in result.content):
        return _text(result)
    return {"content": [b.model_dump(mode="json", by_alias=True, exclude_none=True)
                        for b in result.content]}


def _server_entry(entry: Any, where: str) -> tuple[McpServer, dict[str, Any]]:
    """One ``mcp_servers`` entry: a server, or a mapping with ``url`` or ``command``."""
    if isinstance(entry, str | StdioServerParameters):
        return entry, {}
    if not isinstance(entry, Mapping):
        raise ConfigurationError(f"{where}: an mcp_servers entry must be a URL, "
                                 f"StdioServerParameters or a mapping, not {entry!r}")
    options = {k: entry[k] for k in ("name", "prefix", "include", "timeout", "retries",
                                     "retry_delay", "sampling") if k in entry}
    unknown = sorted(set(entry) - set(options) - {"url", "command", "args", "env", "cwd"})
    if unknown:
        raise ConfigurationError(f"{where}: unknown keys {unknown} in mcp_servers entry")
    if ("url" in entry) == ("command" in entry):
        raise ConfigurationError(f"{where}: an mcp_servers entry needs 'url' or 'command'")
    if "url" in entry:
        return str(entry["url"]), options
    params = StdioServerParameters(command=entry["command"], args=list(entry.get("args", [])),
                                   env=entry.get("env"), cwd=entry.get("cwd"))
    return params, options


def load_mcp_servers(entries: Iterable[Any], where: str) -> list[Tool]:
    """The tools of every server in an app folder's ``mcp_servers`` (blocking).

    The loader is synchronous and may run inside an event loop, so the lists are read on a
    thread with an event loop of its own.

    Raises:
        ConfigurationError: naming ``where`` and the server that failed.
    """
    servers = [_server_entry(e, where) for e in entries]

    async def read_all() -> list[Tool]:
        tools: list[Tool] = []
        for server, options in servers:
            tools += await mcp_tools(server, **options)
        return tools

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mcp-tools")
    try:
        return pool.submit(asyncio.run, read_all()).result(LIST_TIMEOUT * len(servers) or None)
    except ConfigurationError as e:
        raise ConfigurationError(f"{where}: {e}") from e
    except concurrent.futures.TimeoutError as e:
        raise ConfigurationError(f"{where}: MCP servers did not list their tools within "
                                 f"{LIST_TIMEOUT:g}s each") from e
    finally:
        pool.shutdown(wait=False)


__all__ = [
    "IDEMPOTENCY_META",
    "LIST_TIMEOUT",
    "SAMPLING_REFUSED",
    "McpServer",
    "McpToolError",
    "answer_schema",
    "load_mcp_servers",
    "mcp_tools",
    "server_label",
]
