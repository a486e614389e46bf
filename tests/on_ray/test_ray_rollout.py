"""Env workers on a real two-node Ray cluster: same results as in process, spread, fault-tolerant."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from agentrl.core import Env  # noqa: E402
from agentrl.ray.env_worker import ManagerSpec, PolicySpec  # noqa: E402
from agentrl.ray.queue import TaskQueue  # noqa: E402
from agentrl.ray.rollout import RayRollout  # noqa: E402
from agentrl.rollout.manager import Task  # noqa: E402
from agentrl.rollout.scripted import RandomPolicy  # noqa: E402
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup  # noqa: E402

# Worker processes cannot import this test module: ship its env classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Ticker(Env):
    """`length` turns, each env step awaiting `delay` s (no CPU); hangs at step `hang_at` if set."""

    def __init__(self, length: int = 3, delay: float = 0.0, hang_at: int | None = None) -> None:
        self.length, self.delay, self.hang_at = length, delay, hang_at

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.t = 0
        return "tick 0", {}

    async def astep(self, action: str):
        if self.t == self.hang_at:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.delay)
        self.t += 1
        done = self.t >= self.length
        return f"tick {self.t}", float(done), done, False, {"success": done}


def _play(trajectory: Trajectory) -> tuple[Any, ...]:
    """What an episode did, independent of where it ran (ids differ between backends)."""
    index = int(trajectory.episode_id.rsplit("-e", 1)[1])
    steps = tuple((t.observation, t.action, t.reward) for t in trajectory.turns)
    return (trajectory.seed, index, trajectory.stop_reason, steps, trajectory.final_observation)


def _schema(trajectory: Trajectory) -> dict[str, str]:
    return {f.name: type(getattr(trajectory, f.name)).__name__ for f in dataclasses.fields(trajectory)}


async def test_same_spec_in_process_and_on_ray_gives_same_episodes_and_accounting(ray_cluster) -> None:
    spec = ManagerSpec("games/FrozenLake-v0", group_size=2, max_concurrency=64, max_turns=12)
    manager = spec.build(RandomPolicy(seed=0))
    async with manager:
        local_groups = await manager.run(range(40))
    async with RayRollout(spec, PolicySpec("random"), workers=2, cpus_per_worker=0.5) as rollout:
        ray_groups = await rollout.run(range(40))
        assert len(set(rollout.worker_nodes.values())) == 2, "SPREAD should put one worker on each node"

    local = [t for g in local_groups for t in g.trajectories]
    remote = [t for g in ray_groups for t in g.trajectories]
    assert sorted(map(_play, remote)) == sorted(map(_play, local))
    assert {type(g) for g in ray_groups} == {TrajectoryGroup}
    assert {str(_schema(t)) for t in remote} == {str(_schema(t)) for t in local}
    assert rollout.stats.as_dict() == manager.stats.as_dict()
    assert rollout.stats.in_flight == 0 and rollout.stats.launched == 80


async def test_killed_env_worker_aborts_its_episodes_and_their_groups_run_again(ray_cluster) -> None:
    spec = ManagerSpec(lambda: Ticker(length=4, delay=0.2), group_size=2, redundancy=1, max_concurrency=12)
    seeds = range(16)
    delivered: list[TrajectoryGroup] = []
    async with RayRollout(spec, PolicySpec("random"), workers=2, cpus_per_worker=0.5) as rollout:
        async for group in rollout.stream(seeds):
            delivered.append(group)
            if len(delivered) == 2:  # both workers are mid-episode now
                ray.kill(rollout.actor(0))
    stats = rollout.stats
    assert sorted(g.seed for g in delivered) == list(seeds), "every group delivered exactly once"
    assert all(len(g.trajectories) == 2 and g.cancelled == 1 for g in delivered)
    width = 3
    aborted = stats.by_reason[StopReason.ABORTED]
    assert aborted > 0 and aborted % width == 0, stats.as_dict()
    assert stats.launched == stats.ended, "no episode unaccounted"
    assert stats.groups_launched == stats.groups_completed + aborted // width
    assert stats.by_reason[StopReason.TERMINATED] == 2 * len(seeds)


async def test_env_step_timeout_on_a_worker_ends_as_timeout_like_in_process(ray_cluster) -> None:
    spec = ManagerSpec(lambda: Ticker(length=3, hang_at=1), max_concurrency=8, step_timeout=0.5)
    manager = spec.build(RandomPolicy(seed=0))
    async with manager:
        local = [t for g in await manager.run(range(6)) for t in g.trajectories]
    async with RayRollout(spec, PolicySpec("random"), workers=2, cpus_per_worker=0.5) as rollout:
        remote = [t for g in await rollout.run(range(6)) for t in g.trajectories]
    assert {t.stop_reason for t in remote} == {StopReason.TIMEOUT}
    assert {t.error for t in remote} == {t.error for t in local} == {"env call exceeded step_timeout=0.5s"}
    assert rollout.stats.as_dict() == manager.stats.as_dict()


async def test_closing_mid_run_counts_the_running_episodes_as_aborted(ray_cluster) -> None:
    spec = ManagerSpec(lambda: Ticker(length=50, delay=0.1), max_concurrency=8)
    rollout = RayRollout(spec, PolicySpec("random"), workers=2, cpus_per_worker=0.5)
    async with rollout:
        consumer = asyncio.create_task(rollout.run(range(100)))
        await asyncio.sleep(2.0)  # episodes running; none can finish within 5 s
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
    stats = rollout.stats
    assert stats.groups_completed == 0 and stats.groups_launched > 0, stats.as_dict()
    assert stats.by_reason[StopReason.ABORTED] == stats.launched == stats.ended > 0, stats.as_dict()


async def test_a_dead_workers_waiting_request_gets_no_lease_from_the_requeued_tasks(ray_cluster) -> None:
    queue = ray.remote(TaskQueue).options(num_cpus=0).remote("q", max_pending=16)
    try:
        waiting = queue.get.remote(7, 4)  # sent by worker 7 before it died; blocks: nothing pending
        await asyncio.sleep(0.5)
        assert await queue.requeue.remote(7) == []
        await queue.put.remote([Task(seed=1), Task(seed=2)])
        assert await waiting == []
        leases = await queue.get.remote(8, 4)
        assert [lease.task.seed for lease in leases] == [1, 2] and {lease.worker_id for lease in leases} == {
            8
        }
    finally:
        ray.kill(queue)
