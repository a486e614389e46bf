"""Success rate of a policy on held-out seeds, through the same server and client as training.

Evaluation seeds start at `seed_offset` (the config's `schedule.eval_seed_offset`, 1,000,000 by
default), a range training never draws from, so the number measures generalisation to unseen
tasks rather than recall of training seeds. Each seed is played once. Sampling is greedy
(temperature 0) by default, which makes the figure a property of the weights rather than of
the sampling noise; pass a temperature > 0 to measure the sampled policy that RL trains. Sampling
is seeded per episode and turn (`sampling_seed`), so an evaluation at temperature > 0 is
repeatable too, and evaluations of two checkpoints use the same random numbers.

`evaluate_references` plays the env's scripted reference policies (`Env.reference_policies`) on
the same seeds, so the model's figure can be read against a player that ignores the env's
feedback and against the expert.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.registry import make
from agentrl.rollout.manager import EnvManager
from agentrl.rollout.protocol import Policy
from agentrl.rollout.scripted import ReferencePolicy
from agentrl.rollout.stats import RolloutStats
from agentrl.trajectory import Trajectory


@dataclass
class EvalReport:
    env_id: str
    episodes: int
    successes: int
    reward_mean: float
    turns_mean: float
    errors: int  # episodes the env did not end (error/timeout/...): failures, not in the means
    seed_offset: int
    temperature: float

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


async def evaluate_server(
    url: str,
    tokenizer_dir: str | Path,
    env_id: str,
    episodes: int,
    *,
    seed_offset: int = 1_000_000,
    temperature: float = 0.0,
    max_tokens: int = 24,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    concurrency: int = 32,
    sampling_seed: int | None = 0,
    retry_for: float | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    api_key: str | None = None,
) -> EvalReport:
    """Play `episodes` held-out seeds against the policy server at `url`.

    `on_trajectory` sees every episode as it ends (the trainer records them).
    """
    from agentrl.generation import SamplingParams
    from agentrl.rollout.client import PolicyClient

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    client = PolicyClient(
        url, tokenizer_dir, sampling=params, seed=sampling_seed, retry_for=retry_for, api_key=api_key
    )
    try:
        return await evaluate_policy(
            client,
            env_id,
            episodes,
            seed_offset=seed_offset,
            temperature=temperature,
            env_kwargs=env_kwargs,
            max_turns=max_turns,
            concurrency=concurrency,
            on_trajectory=on_trajectory,
        )
    finally:
        await client.aclose()


async def evaluate_policy(
    policy: Policy,
    env_id: str,
    episodes: int,
    *,
    seed_offset: int = 1_000_000,
    temperature: float = 0.0,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    concurrency: int = 32,
    on_trajectory: Callable[[Trajectory], None] | None = None,
) -> EvalReport:
    """Play `episodes` held-out seeds with any policy (`temperature` is recorded, not applied)."""
    manager = EnvManager(
        env_id,
        policy,
        group_size=1,
        max_concurrency=concurrency,
        max_turns=max_turns,
        env_kwargs=env_kwargs,
        on_trajectory=on_trajectory,
    )
    async with manager:
        groups = await manager.run(range(seed_offset, seed_offset + episodes))
    stats = RolloutStats.of(t for g in groups for t in g.trajectories)
    return EvalReport(
        env_id=env_id,
        episodes=episodes,
        successes=stats.successes,
        reward_mean=stats.reward_mean,
        turns_mean=stats.turns_mean,
        errors=stats.episodes - stats.finished,
        seed_offset=seed_offset,
        temperature=temperature,
    )


def reference_names(env_id: str, env_kwargs: dict[str, Any] | None = None) -> dict[str, str]:
    """The reference policies `env_id` declares, name -> description (empty if none)."""
    env = make(env_id, **(env_kwargs or {}))
    try:
        return dict(env.reference_policies)
    finally:
        env.close()


async def evaluate_references(
    env_id: str,
    episodes: int,
    *,
    seed_offset: int = 1_000_000,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    concurrency: int = 64,
    names: list[str] | None = None,
) -> dict[str, EvalReport]:
    """Success of each reference policy (all the env declares, or `names`) on the eval seeds."""
    reports = {}
    for name in names if names is not None else list(reference_names(env_id, env_kwargs)):
        reports[name] = await evaluate_policy(
            ReferencePolicy(name),
            env_id,
            episodes,
            seed_offset=seed_offset,
            env_kwargs=env_kwargs,
            max_turns=max_turns,
            concurrency=concurrency,
        )
    return reports
