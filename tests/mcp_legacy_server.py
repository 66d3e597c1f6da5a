"""An MCP server of the handshake era (protocol 2025-11-25), on the official SDK's low-level
``Server``: it asks mid-call with the older server-initiated requests (``elicitation/create``,
``sampling/createMessage``), which need a connection held open while the client answers.

Run as ``python tests/mcp_legacy_server.py LOG`` (stdio, served by the SDK's handshake-only
loop) or ``python tests/mcp_legacy_server.py LOG --http PORT`` (streamable HTTP on 127.0.0.1,
refusing the 2026-07-28 ``server/discover`` as a server that predates it does). Every call
appends to LOG what the tool was called with and what came back from the client: the action
of an elicitation, the text of a sampled message, or the error the request got; and every
``notifications/cancelled`` it receives (a request the client gave up).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server

warnings.simplefilter("ignore")  # sampling's deprecation (2026-07-28) is this server's point
LOG = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("legacy.jsonl")
APPROVAL = {"type": "object", "properties": {"approver": {"type": "string"}},
            "required": ["approver"]}
TOOLS = [
    types.Tool(name="pay_out", description="Pay out an account once a person approves.",
               input_schema={"type": "object", "properties": {"account": {"type": "string"}},
                             "required": ["account"]}),
    types.Tool(name="summarise", description="Summarise a text (asks the client's model).",
               input_schema={"type": "object", "properties": {"text": {"type": "string"}},
                             "required": ["text"]}),
]


def log(**what: Any) -> None:
    with LOG.open("a") as f:
        f.write(json.dumps(what) + "\n")


def text(value: str, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=value)],
                                is_error=error)


async def list_tools(ctx: ServerRequestContext[Any],
                     params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: ServerRequestContext[Any],
                    params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    log(tool=params.name, args=args)
    if params.name == "pay_out":
        account = args["account"]
        try:
            answer = await ctx.session.elicit_form(f"Who approves paying out {account}?",
                                                   APPROVAL, related_request_id=ctx.request_id)
        except BaseException as e:  # the client went away, or answered with an error
            log(tool="pay_out", got="error", error=type(e).__name__)
            raise
        log(tool="pay_out", got=answer.action, content=answer.content)
        if answer.action != "accept" or not answer.content:
            return text(f"not paid: {answer.action}")
        return text(f"paid {account}, approved by {answer.content['approver']}")
    if params.name == "summarise":
        message = types.SamplingMessage(
            role="user", content=types.TextContent(type="text", text=args["text"]))
        try:
            sampled = await ctx.session.create_message(
                [message], max_tokens=64, system_prompt="Summarise in five words.",
                related_request_id=ctx.request_id)
        except MCPError as e:
            log(tool="summarise", got="error", error=e.error.message)
            return text(f"no summary: {e.error.message}", error=True)
        assert isinstance(sampled.content, types.TextContent)
        log(tool="summarise", got="sampled", text=sampled.content.text, model=sampled.model)
        return text(f"summary: {sampled.content.text}")
    raise MCPError(code=types.METHOD_NOT_FOUND, message=f"unknown tool {params.name}")


async def predates_discover(ctx: ServerRequestContext[Any], call_next: CallNext
                            ) -> HandlerResult:
    # A 2025 server knows no server/discover: the client falls back to initialize.
    if ctx.method == "server/discover":
        raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found")
    if ctx.method == "notifications/cancelled":
        log(cancelled=ctx.params)
    return await call_next(ctx)


server: Server[Any] = Server("legacy-ledger", on_list_tools=list_tools,
                             on_call_tool=call_tool)
server.middleware.append(predates_discover)


async def stdio() -> None:
    async with stdio_server() as (read, write):
        await serve_loop(server, read, write, lifespan_state={},
                         init_options=server.create_initialization_options())


if __name__ == "__main__":
    if "--http" in sys.argv:
        import uvicorn

        port = int(sys.argv[sys.argv.index("--http") + 1])
        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port,
                    log_level="warning")
    else:
        anyio.run(stdio)
