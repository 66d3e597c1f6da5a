"""Pydantic AI on Temporal, for ``bench/temporal.py``: an ``Agent`` with the
``TemporalDurability`` capability run in a workflow (``PydanticAIWorkflow``); each model
request and each tool call is an activity. The fake model asks for ``add`` ten times, one
call per reply, then answers.

A workflow module: Temporal's sandbox imports it again for each workflow run, so it holds
only definitions. Needs ``pip install pydantic-ai-slim``.
"""

from __future__ import annotations

from temporalio import workflow

CALLS = 10
"""Tool calls per run; then the model answers."""

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel


def _pydantic_reply(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
    done = sum(1 for m in messages for p in getattr(m, "parts", ())
               if isinstance(p, ToolReturnPart))
    if done < CALLS:
        return ModelResponse(parts=[ToolCallPart("add", {"a": done, "b": 1},
                                                 tool_call_id=f"c{done}")])
    return ModelResponse(parts=[TextPart("done")])


pydantic_agent: PydanticAgent[None, str] = PydanticAgent(
    FunctionModel(_pydantic_reply), name="bench", capabilities=[TemporalDurability()])


@pydantic_agent.tool_plain
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@workflow.defn(name="bench.pydantic_ai")
class PydanticWorkflow(PydanticAIWorkflow):
    """One Pydantic AI run."""

    __pydantic_ai_agents__ = (pydantic_agent,)

    @workflow.run
    async def run(self, prompt: str) -> str:
        """Run the agent on ``prompt``; returns its output."""
        result = await pydantic_agent.run(prompt)
        return str(result.output)
