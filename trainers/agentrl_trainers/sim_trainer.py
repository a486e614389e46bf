"""A simulated learner: an optimizer step that waits `step_base_s + step_per_token_s * tokens`.

Why: on a CPU machine the real learner and the policy engine fight for the same cores, so a
measured async-vs-sync comparison there measures the CPU, not the overlap. With the engine
modelled too (`agentrl.serving.latency_engine`) and both on a virtual clock, rollout/training
overlap can be measured on its own. The step-time model is fitted to the real `Learner` on this
machine (`bench/calibrate_latency.py`, the profile's `trainer` section) or, for a GPU cluster,
given as an assumption in the profile file (its `source` says which).

It reads the same `TrajectoryGroup`s as the real learner (so the buffer's staleness rules apply
to real token versions) and counts the tokens the real learner would forward: every prompt and
action token of every trajectory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.sim.profiles import profile_from_mapping, read_profile
from agentrl.trajectory import TrajectoryGroup


@dataclass(frozen=True)
class TrainerProfile:
    name: str
    source: str
    step_base_s: float
    step_per_token_s: float
    notes: str = ""

    def step_s(self, tokens: int) -> float:
        return self.step_base_s + self.step_per_token_s * tokens

    @classmethod
    def load(cls, path: str | Path) -> TrainerProfile:
        """Read the `trainer` section of a profile file."""
        data = read_profile(path, "trainer")
        if "trainer" not in data:
            raise ConfigError(f"{path} has no 'trainer' section")
        return cls.from_mapping(data["trainer"], where=str(path))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "trainer profile") -> TrainerProfile:
        return profile_from_mapping(cls, data, where)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_tokens(groups: Sequence[TrajectoryGroup]) -> int:
    """Tokens a learner forwards for these groups: each trajectory's whole token sequence."""
    return sum(
        len(turn.prompt_token_ids) + len(turn.action_token_ids)
        for g in groups
        for t in g.trajectories
        for turn in t.turns
    )


class SimulatedLearner:
    """`await train_step(groups)` waits the profile's step time and bumps `version`."""

    def __init__(self, profile: TrainerProfile, *, version: int = 0) -> None:
        self.profile = profile
        self.version = version
        self.busy_s = 0.0

    async def train_step(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        tokens = batch_tokens(groups)
        seconds = self.profile.step_s(tokens)
        await asyncio.sleep(seconds)
        self.busy_s += seconds
        self.version += 1
        return {"tokens": float(tokens), "step_s": seconds}
