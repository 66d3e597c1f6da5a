"""A small MCP server for the tests, on the official SDK (``MCPServer``), over stdio.

Run as ``python tests/mcp_server.py COUNTER`` (stdio) or ``python tests/mcp_server.py COUNTER
--http PORT`` (streamable HTTP on 127.0.0.1). Every ``tools/call`` appends a line to COUNTER
(the tool's name, its arguments and the idempotency key the client sent), so a test can count
how often the server was really called, from any process. Every ``notifications/cancelled``
the server receives is appended to ``COUNTER.cancelled`` (a request a client gave up).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import Elicit, Resolve, Sample
from mcp_types import CreateMessageResult, SamplingMessage, TextContent
from pydantic import BaseModel

COUNTER = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("calls.jsonl")
CANCELLED = COUNTER.with_name(COUNTER.name + ".cancelled")


async def note_cancels(ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
    if ctx.method == "notifications/cancelled":
        with CANCELLED.open("a") as f:
            f.write(json.dumps(ctx.params) + "\n")
    return await call_next(ctx)


server = MCPServer("ledger", log_level="WARNING", middleware=[note_cancels])


def count(tool: str, ctx: Context | None, **args: Any) -> None:
    meta = ctx.request_context.meta if ctx is not None else None
    key = (meta or {}).get("durable-turns/idempotency-key") if isinstance(meta, dict) else None
    with COUNTER.open("a") as f:
        f.write(json.dumps({"tool": tool, "args": args, "key": key}) + "\n")


@server.tool()
def add_entry(account: str, amount: int, ctx: Context) -> dict[str, Any]:
    """Add an entry to an account's ledger."""
    count("add_entry", ctx, account=account, amount=amount)
    return {"account": account, "balance": 100 + amount}


@server.tool()
def close_account(account: str, ctx: Context) -> str:
    """Close an account (always refused)."""
    count("close_account", ctx, account=account)
    raise ToolError(f"account {account} has a balance")


@server.tool()
async def audit(account: str, ctx: Context) -> str:
    """Audit an account (never finishes)."""
    count("audit", ctx, account=account)
    await anyio.sleep_forever()
    return "unreachable"


class Approval(BaseModel):
    approver: str


def ask_approval(account: str) -> Elicit[Approval]:
    return Elicit(f"Who approves paying out {account}?", Approval)


@server.tool()
def pay_out(account: str,
            approval: Annotated[ElicitationResult[Approval], Resolve(ask_approval)],
            ctx: Context) -> str:
    """Pay out an account once a person approves (asks with an input_required result)."""
    if approval.action != "accept":
        count("pay_out", ctx, account=account, action=approval.action)
        return f"not paid: {approval.action}"
    count("pay_out", ctx, account=account, action="accept", approver=approval.data.approver)
    return f"paid {account}, approved by {approval.data.approver}"


def ask_summary(text: str) -> Sample:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=text))
    return Sample([message], max_tokens=64, system_prompt="Summarise in five words.")


@server.tool()
def summarise(text: str, summary: Annotated[CreateMessageResult, Resolve(ask_summary)],
              ctx: Context) -> str:
    """Summarise a text (asks the client's model: an input_required result)."""
    assert isinstance(summary.content, TextContent)
    count("summarise", ctx, text=text, summary=summary.content.text, model=summary.model)
    return f"summary: {summary.content.text}"


if __name__ == "__main__":
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run(transport="streamable-http", host="127.0.0.1", port=port)
    else:
        server.run()
