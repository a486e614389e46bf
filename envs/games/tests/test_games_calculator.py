"""Calculator: a calculate tool beside <answer> steps; tool budget; bad expressions."""

from __future__ import annotations

import json

from agentrl_games import CalculatorEnv

from agentrl.rollout.manager import EnvManager
from agentrl.rollout.scripted import ExpertPolicy
from agentrl.tools import ToolCall
from agentrl.trajectory import StopReason


def calculate(expression: str) -> ToolCall:
    return ToolCall("c", "calculate", json.dumps({"expression": expression}))


async def test_the_expert_calls_the_calculator_then_answers():
    async with EnvManager(CalculatorEnv, ExpertPolicy()) as manager:
        (group,) = await manager.run([5])
    (trajectory,) = group.trajectories
    assert trajectory.stop_reason is StopReason.TERMINATED and trajectory.success
    tool_turn, answer_turn = trajectory.turns
    (call,) = tool_turn.info["tool_calls"]
    assert answer_turn.action == f"<answer>{call['result']}</answer>"
    assert (manager.stats.tool_calls, manager.stats.env_steps) == (1, 1)


async def test_bad_expressions_are_tool_errors_and_the_budget_ends_the_episode():
    env = CalculatorEnv(max_tool_calls=2)
    await env.areset(seed=0)
    refused = await env.call_tool(calculate("__import__('os')"))
    assert refused.content.startswith("Error: ") and refused.reward == 0.0
    assert (await env.call_tool(calculate("(2+3)*4"))).content == "20"
    over = await env.call_tool(calculate("1+1"))
    assert over.truncated and over.info["success"] is False
