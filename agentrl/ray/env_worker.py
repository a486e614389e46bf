"""The env worker: one Ray actor running one EnvManager over its share of the episodes.

A worker plays thousands of episodes at once exactly as the in-process path does (the same
`EnvManager`, the same accounting and timeouts); only its task source and its output differ.
Tasks come from the rollout's one `TaskQueue` actor, pulled when a whole group fits. Finished
groups wait in an outbox until the driver's next `take()`, which returns all of them in one
reply: each trajectory is serialised once, straight from the worker to the driver that feeds
the buffer (no intermediate actor, no second copy).

A plain class; `agentrl.ray.rollout` makes it an async actor. Policies are built here, in the
worker's process, from a picklable `PolicySpec` (scripted, a policy server URL, or the replica
router), since a live client holds connections that cannot travel.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.core import Env
from agentrl.errors import AgentRLError
from agentrl.generation import SamplingParams
from agentrl.rollout.manager import EnvManager, Task
from agentrl.rollout.protocol import Policy
from agentrl.trajectory import StopReason, TrajectoryGroup


@dataclass(frozen=True)
class ManagerSpec:
    """The EnvManager settings every worker uses (`max_concurrency` is per worker).

    `env`: a registered env id (its suite must be installed on every node), or a picklable
    zero-argument factory returning an `Env`.
    """

    env: str | Callable[[], Env]
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    group_size: int = 1
    redundancy: int = 0
    max_concurrency: int = 256
    max_turns: int | None = None
    step_timeout: float | None = None
    episode_timeout: float | None = None

    def build(self, policy: Policy) -> EnvManager:
        return EnvManager(
            self.env,
            policy,
            group_size=self.group_size,
            redundancy=self.redundancy,
            max_concurrency=max(self.max_concurrency, self.group_size + self.redundancy),
            max_turns=self.max_turns,
            step_timeout=self.step_timeout,
            episode_timeout=self.episode_timeout,
            env_kwargs=self.env_kwargs,
        )


@dataclass(frozen=True)
class PolicySpec:
    """How a worker builds its policy: "random", "expert", "url" (a policy server) or "router".

    `target` is the server URL or the router actor handle; `tokenizer` the served model's
    directory (it must exist at that path on every node: a shared or identical filesystem).
    """

    kind: str
    seed: int = 0
    target: Any = None
    tokenizer: str | None = None
    sampling: SamplingParams | None = None
    sampling_seed: int | None = None
    turn_timeout: float = 600.0

    def build(self) -> Policy:
        if self.kind == "random":
            from agentrl.rollout.scripted import RandomPolicy

            return RandomPolicy(seed=self.seed)
        if self.kind == "expert":
            from agentrl.rollout.scripted import ExpertPolicy

            return ExpertPolicy()
        if self.tokenizer is None:
            raise AgentRLError(f"a {self.kind!r} policy needs the served model's tokenizer directory")
        if self.kind == "url":
            from agentrl.rollout.client import PolicyClient

            return PolicyClient(self.target, self.tokenizer, sampling=self.sampling, seed=self.sampling_seed)
        if self.kind == "router":
            from agentrl.ray.policy import RoutedPolicy

            return RoutedPolicy(
                self.target,
                Path(self.tokenizer),
                sampling=self.sampling,
                seed=self.sampling_seed,
                turn_timeout=self.turn_timeout,
            )
        raise AgentRLError(f"unknown policy kind {self.kind!r} (random, expert, url, router)")


class EnvWorker:
    """See the module docstring. Driven by `RayRollout`: `start()`, then `take()` until done."""

    def __init__(self, worker_id: int, queue: Any, manager: ManagerSpec, policy: PolicySpec) -> None:
        # The worker owns its process: collect young objects less often while thousands of
        # episodes hold live Turns (the same setting, for the same reason, as `agentrl rollout`).
        gc.set_threshold(50_000, 20, 20)
        self.worker_id = worker_id
        self.queue = queue
        self.policy = policy.build()
        self.manager = manager.build(self.policy)
        self._outbox: list[TrajectoryGroup] = []
        self._ready = asyncio.Event()
        self._done = False
        self._error: str | None = None
        self._runner: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Begin pulling tasks; return this worker's node id (placement is checked by tests)."""
        import ray

        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        return str(ray.get_runtime_context().get_node_id())

    async def _tasks(self) -> AsyncIterator[Task]:
        """Leases from the queue, fetched as many at a time as the manager has room for.

        The manager asks for the next task once it holds the slots of one group; the groups
        that would fit besides it (free slots / group width) come in the same round trip.
        """
        manager = self.manager
        while True:
            room = (manager.max_concurrency - manager.stats.in_flight) // manager.width
            leases = await self.queue.get.remote(self.worker_id, max(1, room))
            if not leases:
                return
            for lease in leases:
                yield lease.task

    async def _run(self) -> None:
        try:
            async for group in self.manager.stream(self._tasks()):
                self._outbox.append(group)
                self._ready.set()
        except Exception as exc:
            self._error = f"env worker {self.worker_id}: {type(exc).__name__}: {exc}"
        finally:
            self._done = True
            self._ready.set()

    async def take(self) -> dict[str, Any]:
        """Every group finished since the last call (waits for at least one, or the end).

        `done`: the worker has no more groups to give. `env_steps`: the worker's running total.
        `error`: why its manager stopped early, if it did (the groups before it still count).
        `resampled_turns`: turns its policy sampled again after their replica died.
        """
        await self._ready.wait()
        groups, self._outbox = self._outbox, []
        done = self._done  # read with no await since the swap: no group can be left behind
        if not done:
            self._ready.clear()
        return {
            "groups": groups,
            "env_steps": self.manager.stats.env_steps,
            "resampled_turns": getattr(self.policy, "resampled_turns", 0),
            "done": done,
            "error": self._error,
        }

    async def cpu_seconds(self) -> float:
        """CPU time this worker's process has used (what the rollout costs here, per step)."""
        return time.process_time()

    async def stop(self) -> dict[str, int]:
        """Abort what runs, close envs and the policy; say what the abort ended.

        `aborted`: episodes that were running (the manager counts them ABORTED); `groups`: the
        groups they belonged to, never delivered. The driver adds both to its accounting.
        """
        stats = self.manager.stats
        aborted_before = stats.by_reason[StopReason.ABORTED]
        open_groups = stats.groups_launched - stats.groups_completed
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        await self.manager.aclose()
        close = getattr(self.policy, "aclose", None)
        if close is not None:
            await close()
        return {"aborted": stats.by_reason[StopReason.ABORTED] - aborted_before, "groups": open_groups}
