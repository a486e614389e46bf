"""The trainer's recording settings: whole batches (replayable), a sample per step, evaluations."""

from __future__ import annotations

from pathlib import Path

import torch
from agentrl_trainers.config import RecordConfig
from agentrl_trainers.recorder import StepRecorder

from agentrl.recording import Recording
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup, Turn


def group(name: str, size: int) -> TrajectoryGroup:
    trajectories = [
        Trajectory(
            f"{name}-e{i}",
            "games/GuessNumber-v0",
            name,
            seed=7,
            turns=[
                Turn(
                    "obs",
                    "act",
                    reward=float(i),
                    prompt_token_ids=[1, 2],
                    action_token_ids=[3],
                    action_logprobs=[-0.5],
                    action_versions=[0],
                )
            ],
            stop_reason=StopReason.TERMINATED,
        )
        for i in range(size)
    ]
    return TrajectoryGroup(name, 7, trajectories)


def test_default_records_the_whole_batch_with_its_order_and_thread_count(tmp_path: Path) -> None:
    recorder = StepRecorder(tmp_path, RecordConfig())
    groups = [group("a", 3), group("b", 2)]
    recorder.step(4, 3, groups, {"loss": 0.25, "grad_norm": 2.0})
    recorder.close()
    store = Recording(tmp_path / "recording")
    assert store.batch_groups(4) == groups
    assert store.batches[4].torch_threads == torch.get_num_threads()
    assert store.batches[4].version == 3


def test_sample_records_that_many_episodes_and_no_batch(tmp_path: Path) -> None:
    recorder = StepRecorder(tmp_path, RecordConfig(sample=2))
    recorder.step(1, 0, [group("a", 3), group("b", 3)], {"loss": 0.0, "grad_norm": 0.0})
    recorder.evaluation_episode(1, 1, group("e", 1).trajectories[0])
    recorder.close()
    store = Recording(tmp_path / "recording")
    assert store.batches == {}
    assert [(s["source"], s["episode_id"]) for s in store.summaries] == [
        ("train", "a-e0"),
        ("train", "a-e1"),
        ("eval", "e-e0"),
    ]


def test_evaluations_can_be_left_out(tmp_path: Path) -> None:
    recorder = StepRecorder(tmp_path, RecordConfig(evaluations=False))
    recorder.evaluation_episode(0, 0, group("e", 1).trajectories[0])
    recorder.close()
    assert Recording(tmp_path / "recording").summaries == []
