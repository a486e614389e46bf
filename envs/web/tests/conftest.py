"""Helpers shared by the web suite's tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from agentrl_web.web_env import WebEnv


async def play(env: WebEnv, seed: int, choose: Callable[[WebEnv], str] | None = None) -> dict:
    """Run one episode with `choose` (default: the env's expert) and summarise it."""
    choose = choose or (lambda e: e.expert_action())
    _, info = await env.areset(seed=seed)
    total, steps, last = 0.0, 0, {}
    terminated = truncated = False
    while not (terminated or truncated):
        _, reward, terminated, truncated, last = await env.astep(choose(env))
        total += reward
        steps += 1
    return {
        "seed": seed,
        "task": info["task"],
        "reward": total,
        "steps": steps,
        "success": last["success"],
        "terminated": terminated,
        "truncated": truncated,
    }


@pytest.fixture
def play_episode():
    return play
