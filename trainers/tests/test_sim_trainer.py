"""SimulatedLearner: the step waits the profile's time for the batch's tokens and bumps the version."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentrl_trainers.sim_trainer import SimulatedLearner, TrainerProfile, batch_tokens

from agentrl.errors import ConfigError
from agentrl.sim.clock import run_virtual
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup, Turn


def group(tokens_per_turn: list[tuple[int, int]]) -> TrajectoryGroup:
    turns = [Turn("o", "a", 0.0, {}, [1] * p, [2] * a, [-1.0] * a, [0] * a) for p, a in tokens_per_turn]
    trajectory = Trajectory("e", "x", "g", 0, turns=turns, stop_reason=StopReason.TERMINATED)
    return TrajectoryGroup("g", 0, [trajectory])


def test_a_step_takes_base_plus_per_token_time_and_bumps_the_version():
    profile = TrainerProfile("t", "assumed", step_base_s=2.0, step_per_token_s=0.01)
    groups = [group([(10, 5), (3, 2)]), group([(100, 80)])]
    assert batch_tokens(groups) == 200

    async def main():
        learner = SimulatedLearner(profile, version=4)
        loop = asyncio.get_running_loop()
        started = loop.time()
        metrics = await learner.train_step(groups)
        return learner, metrics, loop.time() - started

    learner, metrics, elapsed = run_virtual(main())
    assert elapsed == pytest.approx(4.0) and metrics["tokens"] == 200 and learner.version == 5


def test_profiles_load_from_the_trainer_section_and_say_what_is_missing(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps({"trainer": {"name": "x", "source": "assumed", "step_base_s": 1, "step_per_token_s": 0}})
    )
    assert TrainerProfile.load(path).step_s(100) == 1
    path.write_text(json.dumps({"engine": {}}))
    with pytest.raises(ConfigError, match="no 'trainer' section"):
        TrainerProfile.load(path)
    path.write_text(json.dumps({"trainer": {"name": "x"}}))
    with pytest.raises(ConfigError, match="lacks"):
        TrainerProfile.load(path)
