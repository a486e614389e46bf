"""`agentrl train` end to end on a tiny model: real server process, real HTTP, real torch.

Kept small (a few steps of a 1M-parameter model) so it runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from agentrl_trainers.config import load_config
from agentrl_trainers.loop import TrainingRun
from agentrl_trainers.metrics import read_metrics

from agentrl.cli.evaluate import evaluate_checkpoint
from agentrl.errors import AgentRLError

TINY = {
    "env.id": "games/GuessNumber-v0",
    "env.group_size": 4,
    "env.max_turns": 5,
    "sampling.max_tokens": 10,
    "schedule.steps": 3,
    "schedule.groups_per_step": 2,
    "schedule.checkpoint_every": 2,
    "schedule.eval_episodes": 8,
    "sft.episodes": 16,
    "buffer.dynamic_filter": False,
}


@pytest.mark.parametrize(("mode", "rollout"), [("sync", "batch"), ("async", "async")])
def test_train_runs_end_to_end(tmp_path: Path, mode: str, rollout: str) -> None:
    config = load_config(None, {**TINY, "out": str(tmp_path / "run"), "mode": mode, "env.rollout": rollout})
    result = TrainingRun(config).run()

    assert result.steps == 3 and result.version == 3
    assert result.warm_start_success is not None and result.final_success is not None
    run = tmp_path / "run"
    records = read_metrics(run / "metrics.jsonl")
    train_steps = [r["step"] for r in records if "learner/loss" in r]
    assert train_steps == [1, 2, 3]
    assert [r["version"] for r in records if "learner/loss" in r] == [1, 2, 3]
    staleness = [r["buffer/batch_staleness_max"] for r in records if "learner/loss" in r]
    # trainer + server CPU per second of each step: positive, and at most the machine's cores
    # (plus clock-tick rounding over a short step)
    cores = len(os.sched_getaffinity(0))
    assert all(0 < r["cpu_busy_cores"] <= cores + 0.5 for r in records if "learner/loss" in r)
    assert max(staleness) <= config.effective_max_staleness
    assert [r["step"] for r in records if "eval_success_rate" in r] == [0, 3]
    assert list((run / "tb").glob("events.out.tfevents.*"))
    # every step says where its time went: engine busy (from the server's /metrics), trainer idle
    for r in (r for r in records if "learner/loss" in r):
        assert 0 < r["timeline/engine_busy_frac"] <= 1 and 0 <= r["timeline/trainer_idle_frac"] < 1
        assert r["timeline/rollout_wait_s"] == pytest.approx(r["trainer_wait_s"])
        assert r["timeline/train_s"] > 0 and r["timeline/weight_sync_s"] > 0
    # The env's reference policies were played once on the eval seeds and plotted beside the model.
    references = {"random", "random_distinct", "random_in_hints", "expert"}
    assert set(result.references) == references and result.references["expert"] == 1.0
    logged = {k.removeprefix("reference/") for r in records if r["step"] == 0 for k in r}
    assert references <= logged
    assert {p.name for p in result.plots} == {
        "metrics_vs_step.png",
        "metrics_vs_wall_time.png",
        "timeline.png",
        "eval_success.png",
    }
    assert all(p.stat().st_size > 1000 for p in result.plots)
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["step_000002", "step_000003"]
    assert json.loads((run / "checkpoints/step_000003/state.json").read_text())["version"] == 3

    # The checkpoint evaluates on its own (a fresh server process) to the same greedy figure.
    report = evaluate_checkpoint(run, "games/GuessNumber-v0", 8, max_tokens=10, max_turns=5)
    assert report.success_rate == pytest.approx(result.final_success)


@pytest.mark.parametrize(("rollout", "redundancy"), [("batch", 0), ("rounds", 1)])
def test_rollout_tail_batching_defers_and_re_rolls_in_the_real_loop(
    tmp_path: Path, rollout: str, redundancy: int
) -> None:
    overrides = {
        "mode": "sync",
        "env.rollout": rollout,
        "env.redundancy": redundancy,
        "env.speculative_groups": 1,
    }
    config = load_config(
        None, {**TINY, **overrides, "out": str(tmp_path / "run"), "schedule.eval_episodes": 0}
    )
    assert TrainingRun(config).run().version == 3
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "learner/loss" in r]
    # 2 groups per step from 3 launched: one deferred per short round; two deferred make the
    # third step a long round that re-rolls them, all trained at the version they were sampled at
    assert [r["buffer/deferred_groups"] for r in records] == [1, 2, 2]
    assert [r["buffer/long_rounds"] for r in records] == [0, 0, 1]
    assert all(r["buffer/batch_staleness_max"] == 0 for r in records)


def test_existing_run_needs_resume(tmp_path: Path) -> None:
    ckpt = tmp_path / "run/checkpoints/step_000002"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text("{}")
    config = load_config(None, {**TINY, "out": str(tmp_path / "run")})
    with pytest.raises(AgentRLError, match="--resume"):
        TrainingRun(config).run()
