"""The OpenAI Agents SDK on Temporal, for ``bench/temporal.py``: Temporal's plugin
(``temporalio-openai-agents``) runs each model call as an activity, and the tool is an
activity (``activity_as_tool``). The fake model (the plugin's test model) asks for ``add``
ten times, one call per reply, then answers.

A workflow module: Temporal's sandbox imports it again for each workflow run, so it holds
only definitions. Needs ``pip install openai-agents temporalio-openai-agents``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import activity, workflow

CALLS = 10
"""Tool calls per run; then the model answers."""

with workflow.unsafe.imports_passed_through():
    from agents import Agent as OpenAIAgent
    from agents import Runner
    from temporalio.openai_agents import workflow as openai_workflow


@activity.defn(name="bench.add")
async def add_activity(a: int, b: int) -> int:
    """Add two numbers (the OpenAI agent's tool, as an activity)."""
    return a + b


@workflow.defn(name="bench.openai_agents", sandboxed=True)
class OpenAIWorkflow:
    """One OpenAI Agents SDK run; the model is the plugin's test model (``openai_model``)."""

    @workflow.run
    async def run(self, prompt: str) -> str:
        """Run the agent on ``prompt``; returns its final output."""
        agent = OpenAIAgent(
            name="bench", instructions="You add.",
            tools=[openai_workflow.activity_as_tool(
                add_activity, start_to_close_timeout=timedelta(seconds=30))])
        result = await Runner.run(agent, prompt, max_turns=2 * CALLS)
        return str(result.final_output)


def openai_model() -> Any:
    """The OpenAI plugin's test model: ten calls of ``add_activity``, then ``done``, again and
    again (runs are sequential)."""
    from temporalio.openai_agents.testing import ResponseBuilders, TestModel

    state = {"n": 0}

    def reply() -> Any:
        n = state["n"] % (CALLS + 1)
        state["n"] += 1
        if n < CALLS:
            return ResponseBuilders.tool_call(f'{{"a": {n}, "b": 1}}', "add_activity",
                                              call_id=f"c{n}", item_id=f"i{n}")
        return ResponseBuilders.output_message("done")

    return TestModel(reply)
