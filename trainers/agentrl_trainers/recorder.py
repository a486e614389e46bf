"""What a training run writes to its trajectory store, per step and per evaluation.

The loop calls `step()` once a batch is trained on and `evaluation_episode()` for held-out
episodes; everything lands in `OUT/recording/train.arl` (see `agentrl.recording`). Recording
every trajectory of a batch, in order, with the batch record naming them is what lets
`agentrl replay` rebuild the learner's exact input for that step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from agentrl.recording import RECORDING_DIR, RecordWriter
from agentrl.trajectory import Trajectory, TrajectoryGroup
from agentrl_trainers.config import RecordConfig

STORE_FILE = "train"  # OUT/recording/train.arl; a resumed run appends to it


class StepRecorder:
    """Appends the trained-on trajectories of each step (all, or a sample) and evaluation episodes."""

    def __init__(self, run_dir: str | Path, config: RecordConfig) -> None:
        self.config = config
        self.writer = RecordWriter(Path(run_dir) / RECORDING_DIR, STORE_FILE)

    def step(
        self, step: int, version: int, groups: Sequence[TrajectoryGroup], learner_metrics: dict[str, float]
    ) -> None:
        """Record step `step`, trained from learner version `version` on `groups` (in that order)."""
        if self.config.sample is None:
            threads = torch.get_num_threads()
            self.writer.write_batch(step, version, groups, learner=learner_metrics, torch_threads=threads)
            return
        trajectories = [t for g in groups for t in g.trajectories][: self.config.sample]
        for trajectory in trajectories:
            self.writer.write_episode(trajectory, source="train", step=step)

    def resumed(self, step: int) -> None:
        """The run resumed from its step-`step` checkpoint: what later steps hold is superseded."""
        self.writer.write_resume(step)

    def evaluation_episode(self, step: int, version: int, trajectory: Trajectory) -> None:
        if self.config.evaluations:
            self.writer.write_episode(trajectory, source="eval", step=step, policy=f"version {version}")

    def close(self) -> None:
        self.writer.close()
