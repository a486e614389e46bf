"""`agentrl replay`: a recorded training step recomputed from its checkpoint matches the logs exactly.

One tiny run (real policy server, real rollouts, real torch) records every step; replay then
recomputes step 3 from the step-2 checkpoint and step 2 from the start model through step 1,
and the loss and gradient norm must equal the logged floats bit for bit (same CPU, same threads).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agentrl_trainers.config import load_config
from agentrl_trainers.loop import TrainingRun
from agentrl_trainers.metrics import read_metrics
from agentrl_trainers.replay import ReplayError, replay_step
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.recording import Recording

TINY = {
    "env.id": "games/GuessNumber-v0",
    "env.group_size": 4,
    "env.max_turns": 4,
    "sampling.max_tokens": 8,
    "schedule.steps": 3,
    "schedule.groups_per_step": 2,
    "schedule.checkpoint_every": 2,
    "schedule.eval_episodes": 4,
    "buffer.dynamic_filter": False,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay") / "run"
    TrainingRun(load_config(None, {**TINY, "out": str(out)})).run()
    return out


def test_training_records_each_batch_in_learner_order(run: Path) -> None:
    store = Recording(run / "recording")
    assert sorted(store.batches) == [1, 2, 3]
    logged = {r["step"]: r for r in read_metrics(run / "metrics.jsonl") if "learner/loss" in r}
    for step, batch in store.batches.items():
        assert batch.version == step - 1
        assert batch.learner["loss"] == logged[step]["learner/loss"]
        assert len(batch.groups) == TINY["schedule.groups_per_step"]
        assert sum(len(g.episodes) for g in batch.groups) == logged[step]["learner/sequences"]
    # held-out evaluations at the start and the end, same seeds: the viewer compares them
    evals = [s for s in store.summaries if s["source"] == "eval"]
    assert sorted({s["step"] for s in evals}) == [0, 3]
    assert {s["seed"] for s in evals if s["step"] == 0} == {s["seed"] for s in evals if s["step"] == 3}
    tokens = [t for e in store.episodes() if e.source == "train" for t in e.trajectory.turns]
    assert all(len(t.action_logprobs) == len(t.action_token_ids) == len(t.action_versions) for t in tokens)


def test_replay_from_the_previous_checkpoint_matches_bit_for_bit(run: Path) -> None:
    result = replay_step(run, 3)
    assert result.start.endswith("step_000002")
    assert [c.step for c in result.steps] == [3]
    assert result.target.replayed == result.target.logged


def test_replay_between_checkpoints_reruns_the_recorded_steps_before_it(run: Path) -> None:
    result = replay_step(run, 2)  # no checkpoint before step 2 is kept: start model, then step 1
    assert result.start.endswith("model_init")
    assert [c.step for c in result.steps] == [1, 2]
    for comparison in result.steps:
        assert comparison.replayed == comparison.logged


def test_replay_command_reports_match_and_fails_on_unrecorded_steps(run: Path) -> None:
    ok = CliRunner().invoke(app, ["replay", str(run), "--step", "3"])
    assert ok.exit_code == 0, ok.output
    assert "MATCH" in ok.output and "bit-for-bit" in ok.output
    missing = CliRunner().invoke(app, ["replay", str(run), "--step", "9"])
    assert missing.exit_code == 2
    assert "step 9 has no recorded batch; replayable steps: [1, 2, 3]" in missing.output


def test_replay_of_a_directory_without_a_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="not a training run directory"):
        replay_step(tmp_path, 1)


def test_replay_detects_a_batch_that_differs_from_the_one_trained_on(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Recording.batch_groups

    def tampered(self: Recording, step: int) -> list:
        # Returns 0, 1, 2, 3 in every group: four distinct values, so the group-normalised
        # advantages cannot equal the recorded ones (success rewards take at most two values,
        # and z-scores are blind to any affine change, so "+1 on one episode" can be invisible).
        groups = original(self, step)
        for group in groups:
            for episode_return, trajectory in enumerate(group.trajectories):
                for turn in trajectory.turns:
                    turn.reward = 0.0
                trajectory.turns[-1].reward = float(episode_return)
        return groups

    monkeypatch.setattr(Recording, "batch_groups", tampered)
    result = replay_step(run, 1)
    # The loss alone can match: at importance ratio 1 it is minus the token-weighted mean advantage,
    # zero for any z-scored group whose episodes have equal lengths. The gradient norm cannot.
    assert result.target.replayed["grad_norm"] != result.target.logged["grad_norm"]
    assert not result.target.matches(0.0)
