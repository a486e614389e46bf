"""`agentrl rollout ... --ray local|ADDRESS --workers N`: the same rollout on Ray env workers.

Kept apart from `envs.py` so that the in-process command never imports the Ray side. The
episodes, their accounting and the printed table are the same as in process; only where the
envs run differs (`--workers` actors spread over the cluster's nodes, sharing `--concurrency`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from agentrl.cli.progress import episode_progress
from agentrl.errors import AgentRLError
from agentrl.generation import SamplingParams
from agentrl.ray.cluster import connect
from agentrl.ray.env_worker import ManagerSpec, PolicySpec
from agentrl.ray.rollout import RayRollout
from agentrl.rollout.manager import ManagerStats
from agentrl.trajectory import Trajectory


def policy_spec(policy: str, seed: int, tokenizer: str | None, sampling: SamplingParams) -> PolicySpec:
    if policy in ("random", "expert"):
        return PolicySpec(policy, seed=seed)
    if policy.startswith(("http://", "https://")):
        if tokenizer is None:
            raise AgentRLError(
                "--policy URL needs --tokenizer MODEL_DIR (the directory of the served checkpoint)"
            )
        return PolicySpec("url", target=policy, tokenizer=tokenizer, sampling=sampling)
    raise AgentRLError(
        f"--policy must be 'random', 'expert' or a policy server URL (http://...), got {policy!r}"
    )


def rollout_on_ray(
    env_id: str,
    manager: dict[str, Any],
    policy: str,
    seed: int,
    tokenizer: str | None,
    sampling: SamplingParams,
    seeds: range,
    address: str,
    workers: int,
    console: Console,
    on_trajectory: Callable[[Trajectory], None] | None = None,
) -> tuple[ManagerStats, list[Trajectory], float]:
    """Play `seeds` on `workers` env-worker actors; return the accounting, the kept trajectories
    and the seconds from the first task to the last group (cluster start-up not included).
    `on_trajectory` sees every trajectory of every delivered group, in the driver."""
    spec = ManagerSpec(env_id, **manager)
    width = spec.group_size + spec.redundancy
    progress = episode_progress(console)
    bar = progress.add_task(f"{env_id} on Ray ({workers} workers)", total=len(seeds) * width)

    async def play() -> tuple[ManagerStats, list[Trajectory], float]:
        kept: list[Trajectory] = []
        rollout = RayRollout(
            spec, policy_spec(policy, seed, tokenizer, sampling), workers=workers, on_trajectory=on_trajectory
        )
        async with rollout:
            started = time.perf_counter()
            async for group in rollout.stream(seeds):
                kept += group.trajectories
                progress.advance(bar, len(group.trajectories) + group.cancelled)
            return rollout.stats, kept, time.perf_counter() - started

    # A private cluster gets at least one logical CPU per worker (the workers mostly wait on envs).
    with connect(address, num_cpus=max(workers, os.cpu_count() or 1)), progress:
        return asyncio.run(play())
