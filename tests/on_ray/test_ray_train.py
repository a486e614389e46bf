"""`agentrl train` with `ray.address` set: the same loop, with env workers and policy replicas
on the two-node test cluster instead of an in-process manager and one server process."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("agentrl_trainers")

from agentrl_trainers.config import load_config
from agentrl_trainers.loop import TrainingRun
from agentrl_trainers.metrics import read_metrics

TINY_ON_RAY = {
    "env.id": "games/GuessNumber-v0",
    "env.group_size": 2,
    "env.max_turns": 3,
    "env.concurrency": 8,
    "sampling.max_tokens": 4,
    "schedule.steps": 2,
    "schedule.groups_per_step": 2,
    "schedule.eval_episodes": 4,
    "buffer.dynamic_filter": False,
    "ray.env_workers": 2,
    "ray.replicas": 1,
    "ray.cpus_per_env_worker": 0.5,
    "ray.cpus_per_replica": 0.5,
}


def test_train_on_ray_runs_the_same_loop_to_the_end(ray_cluster, tmp_path: Path) -> None:
    config = load_config(
        None, {**TINY_ON_RAY, "out": str(tmp_path / "run"), "ray.address": ray_cluster.address}
    )
    result = TrainingRun(config).run()

    assert result.steps == 2 and result.version == 2
    assert result.warm_start_success is not None and result.final_success is not None
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in records if "learner/loss" in r]
    assert [r["version"] for r in steps] == [1, 2]
    assert [r["step"] for r in records if "eval_success_rate" in r] == [0, 2]
    assert all(r["env_steps"] > 0 for r in steps)
    assert max(r["buffer/batch_staleness_max"] for r in steps) <= config.effective_max_staleness
