"""The training loop's policy and rollout side when a run uses Ray (`ray.address` is set).

In process, the loop starts one policy server (`ServerProcess`) and one `EnvManager`. On Ray it
starts, in the same places, a `ReplicaPool` (policy replicas in a placement group, behind the
router) and a `RayRollout` (env-worker actors spread over the nodes, fed by one task queue). The
trainer itself (learner, buffer, checkpoints) stays in the driver process. Weight updates go from
the learner to every replica with the learner's version; evaluation plays its held-out seeds in
the driver against the same replicas.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.generation import SamplingParams
from agentrl.ray.env_worker import ManagerSpec, PolicySpec
from agentrl.ray.policy import RoutedPolicy
from agentrl.ray.replicas import ReplicaPool
from agentrl.ray.rollout import RayRollout
from agentrl.rollout.evaluate import EvalReport, evaluate_policy
from agentrl.trajectory import Trajectory
from agentrl_trainers.config import TrainConfig


class RayBackend:
    """Replicas, router and env workers for one training run; lives in the driver.

    It stands where the loop's `ServerProcess` stands (`astart`, `push`, `returncode`, `stop`,
    `cpu_seconds`, `url`), so the loop's supervisor and step code run unchanged: the replicas
    restart themselves (`ReplicaPool`), so `returncode` is always None and the supervisor never
    has a process to restart.
    """

    url = ""  # no HTTP endpoint: env workers reach the replicas through the router
    returncode = None

    def __init__(self, config: TrainConfig, model_dir: Path, version: int) -> None:
        self.config = config
        self.model_dir = model_dir
        settings = config.ray
        self.pool = ReplicaPool(
            model_dir,
            replicas=settings.replicas,
            cpus_per_replica=settings.cpus_per_replica,
            gpus_per_replica=settings.gpus_per_replica,
            engine=settings.engine,
            version=version,
        )
        self.rollout: RayRollout | None = None

    async def astart(self) -> RayBackend:
        await self.pool.start()
        return self

    def cpu_seconds(self) -> None:
        """Unknown: the work runs in actors on other processes and nodes (the dashboard shows it)."""
        return None

    @property
    def version(self) -> int:
        return self.pool.version

    def make_rollout(self, on_trajectory: Any) -> RayRollout:
        """The EnvManager stand-in: the config's env settings, spread over `ray.env_workers`."""
        config, env = self.config, self.config.env
        sampling = SamplingParams(
            max_tokens=config.sampling.max_tokens,
            temperature=config.sampling.temperature,
            top_p=config.sampling.top_p,
        )
        spec = ManagerSpec(
            env.id,
            env_kwargs=env.kwargs,
            group_size=env.group_size,
            redundancy=env.redundancy,
            max_concurrency=max(env.concurrency, env.group_size + env.redundancy),
            max_turns=env.max_turns,
            step_timeout=env.step_timeout,
            episode_timeout=env.episode_timeout,
        )
        policy = PolicySpec(
            "router",
            target=self.pool.router,
            tokenizer=str(self.model_dir),
            sampling=sampling,
            turn_timeout=config.ray.turn_timeout,
        )
        self.rollout = RayRollout(
            spec,
            policy,
            workers=config.ray.env_workers,
            cpus_per_worker=config.ray.cpus_per_env_worker,
            on_trajectory=on_trajectory,
        )
        return self.rollout

    async def push(self, state_dict: dict[str, Any], version: int) -> int:
        return await self.pool.push({k: v.detach().cpu() for k, v in state_dict.items()}, version)

    async def evaluate(
        self, episodes: int, seed_offset: int, on_trajectory: Callable[[Trajectory], None] | None = None
    ) -> EvalReport:
        """Held-out episodes in the driver against the replicas (greedy unless eval_temperature > 0)."""
        config = self.config
        params = SamplingParams(
            max_tokens=config.sampling.max_tokens, temperature=config.sampling.eval_temperature
        )
        policy = RoutedPolicy(self.pool.router, self.model_dir, sampling=params, seed=0)
        try:
            return await evaluate_policy(
                policy,
                config.env.id,
                episodes,
                seed_offset=seed_offset,
                temperature=config.sampling.eval_temperature,
                env_kwargs=config.env.kwargs,
                max_turns=config.env.max_turns,
                concurrency=config.env.concurrency,
                on_trajectory=on_trajectory,
            )
        finally:
            await policy.aclose()

    def stop(self) -> None:
        """Kill the replicas and the router and free their placement group (the loop closes the
        rollout, and with it the env workers, before this)."""
        self.pool.stop()
