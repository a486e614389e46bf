"""Simulation parts: the virtual clock, the latency distributions, LatencyEnv and EnginePolicy."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from agentrl.errors import AgentRLError, ConfigError
from agentrl.generation import SamplingParams
from agentrl.rollout.engine_policy import EnginePolicy
from agentrl.rollout.manager import EnvManager
from agentrl.serving.latency_engine import LatencyEngine, LatencyProfile
from agentrl.sim import distributions
from agentrl.sim.clock import run_virtual
from agentrl.sim.distributions import Constant, LogNormal, RareSlow
from agentrl.sim.env import LatencyEnv, word_ids


def test_an_hour_of_sleeping_takes_no_real_time_on_the_virtual_clock():
    async def main():
        loop = asyncio.get_running_loop()
        await asyncio.gather(asyncio.sleep(3600), asyncio.sleep(1800))
        async with asyncio.timeout(10):
            await asyncio.sleep(5)
        return loop.time()

    started = time.perf_counter()
    assert run_virtual(main()) == pytest.approx(3605)
    assert time.perf_counter() - started < 1


def test_a_simulation_waiting_on_nothing_raises_instead_of_hanging():
    with pytest.raises(AgentRLError, match="nothing is scheduled"):
        run_virtual(asyncio.Event().wait())


def test_distributions_have_the_shapes_they_name():
    rng = random.Random(0)
    tail = [LogNormal(2.0, 1.0, cap=60).sample(rng) for _ in range(20_000)]
    assert sorted(tail)[10_000] == pytest.approx(2.0, rel=0.05)
    assert max(tail) == 60 and sorted(tail)[19_800] > 15  # p99 about 10x the median
    rare = [RareSlow(0.1, 30.0, 0.05).sample(rng) for _ in range(20_000)]
    assert sum(v == 30.0 for v in rare) / 20_000 == pytest.approx(0.05, abs=0.01)
    assert RareSlow(0.1, 30.0, 0.05).mean() == pytest.approx(0.1 + 0.05 * 29.9)
    assert distributions.parse("lognormal:2,1,60") == LogNormal(2, 1, 60)
    assert distributions.parse("const:0.5") == Constant(0.5)
    with pytest.raises(ConfigError, match="bad distribution"):
        distributions.parse("gamma:1")


def test_latency_env_waits_its_step_latency_for_its_sampled_turns():
    async def main():
        env = LatencyEnv(step_latency=Constant(2.0), turns=Constant(3), observation_tokens=Constant(4))
        loop = asyncio.get_running_loop()
        obs, _ = await env.areset(seed=1)
        started, turns, done = loop.time(), 0, False
        while not done:
            obs, _, done, _, _ = await env.astep("a")
            turns += 1
            if not done:
                assert len(word_ids(obs)) == 4
        return turns, loop.time() - started

    assert run_virtual(main()) == (3, pytest.approx(6.0))


def test_engine_policy_builds_the_episode_token_layout_and_frees_sessions():
    profile = LatencyProfile("t", "assumed", 0.01, 0.0, 0.0, 0.0, 1e-4, 10_000, 16)

    async def main():
        engine = LatencyEngine(profile, response_tokens=Constant(3), eos_token_id=2, token_pool=[9])
        await engine.start()
        policy = EnginePolicy(engine, word_ids, sampling=SamplingParams(max_tokens=8))
        manager = EnvManager(
            lambda: LatencyEnv(turns=Constant(2), observation_tokens=Constant(5), prompt_tokens=Constant(7)),
            policy,
            group_size=2,
        )
        groups = await manager.run([0])
        await engine.stop()
        return groups, engine, policy

    groups, engine, policy = run_virtual(main())
    for t in groups[0].trajectories:
        first, second = t.turns
        assert len(first.prompt_token_ids) == 2 + 7  # system prompt (two words) + the first observation
        assert len(second.prompt_token_ids) == 5 and second.action_token_ids == [9, 9, 2]
    assert engine.stats.cached_prompt_tokens > 0  # the second turn reused the first's prefix
    assert not policy._contexts and not engine._sessions


def test_task_prompts_are_shared_within_a_task_and_differ_between_tasks():
    async def first_prompt(env: LatencyEnv, seed: int) -> list[int]:
        return word_ids((await env.areset(seed=seed))[0])

    async def main():
        tagged = [LatencyEnv(prompt_tokens=Constant(5), task_prompts=True, seed=s) for s in range(2)]
        same = [await first_prompt(env, 7) for env in tagged]
        other = await first_prompt(tagged[0], 8)
        plain = await first_prompt(LatencyEnv(prompt_tokens=Constant(5)), 7)
        return same, other, plain

    same, other, plain = run_virtual(main())
    assert same[0] == same[1] and len(same[0]) == 6  # the tag word, then 5 filler words
    assert other != same[0] and other[1:] == same[0][1:]
    assert plain == [7] * 5  # untagged prompts are filler only, as before
