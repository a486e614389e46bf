"""The web tool envs: the browser actions as tools, played through the env manager."""

from __future__ import annotations

import json

import pytest

import agentrl
from agentrl.rollout.manager import EnvManager
from agentrl.rollout.scripted import ExpertPolicy
from agentrl.tools import ToolCall
from agentrl.trajectory import StopReason


@pytest.mark.parametrize("env_id", ["web/ShopTools-v0", "web/WikiTools-v0"])
async def test_the_expert_succeeds_by_calling_tools(env_id):
    async with EnvManager(env_id, ExpertPolicy(), max_turns=25) as manager:
        groups = await manager.run([3, 4])
    trajectories = [t for g in groups for t in g.trajectories]
    assert all(t.stop_reason is StopReason.TERMINATED and t.success for t in trajectories)
    assert manager.stats.env_steps == 0 and manager.stats.tool_calls == sum(
        len(t.turns) for t in trajectories
    )
    assert all(turn.action.startswith("<tool_call>") for t in trajectories for turn in t.turns)


async def test_bad_calls_cost_a_turn_and_a_penalty_and_say_why():
    env = agentrl.make("web/WikiTools-v0")
    await env.areset(seed=1)
    assert {spec.name for spec in env.tools()} == {"search", "click", "type", "back", "answer"}
    missing = await env.call_tool(ToolCall("c0", "click", json.dumps({"element": 999})))
    assert "No element [999]" in missing.content and missing.reward == -env.format_penalty and env.turn == 1
    wrong = await env.call_tool(ToolCall("c1", "click", json.dumps({"element": "three"})))
    assert "arguments.element must be integer" in wrong.content and wrong.reward == env.tool_error_penalty
    assert env.turn == 1  # a call that does not match the schema never reaches the site
    await env.aclose()
