"""Success, reward and length of a set of episodes, counted by one rule everywhere.

Training metrics, `agentrl eval`, `agentrl rollout` and `agentrl envs check` all summarise
episodes through `RolloutStats`, so their figures mean the same thing:

- `success_rate` is over every episode counted: one that ended in error or timeout did not
  succeed;
- `reward_mean`, `turns_mean` and `format_error_rate` are over the episodes the env itself ended
  (terminated or truncated): a failed episode's partial reward says nothing about the policy;
- `failures` counts the others by stop reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from agentrl.trajectory import Trajectory


@dataclass
class RolloutStats:
    episodes: int = 0
    finished: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    turns_sum: int = 0
    action_tokens: int = 0
    format_errors: int = 0  # turns whose info says `format_error`
    failures: Counter[str] = field(default_factory=Counter)  # stop reason -> episodes

    @classmethod
    def of(cls, trajectories: Iterable[Trajectory]) -> RolloutStats:
        stats = cls()
        for trajectory in trajectories:
            stats.add(trajectory)
        return stats

    def add(self, trajectory: Trajectory) -> None:
        self.episodes += 1
        self.successes += bool(trajectory.success)
        if not trajectory.stop_reason.finished:
            self.failures[trajectory.stop_reason.value] += 1
            return
        self.finished += 1
        self.reward_sum += trajectory.total_reward
        self.turns_sum += len(trajectory.turns)
        self.action_tokens += trajectory.num_action_tokens
        self.format_errors += sum(bool(turn.info.get("format_error")) for turn in trajectory.turns)

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / self.finished if self.finished else 0.0

    @property
    def turns_mean(self) -> float:
        return self.turns_sum / self.finished if self.finished else 0.0

    @property
    def format_error_rate(self) -> float:
        return self.format_errors / self.turns_sum if self.turns_sum else 0.0

    @property
    def errors(self) -> int:
        """Episodes that ended in error or timeout."""
        return self.failures["error"] + self.failures["timeout"]

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat scalar metrics (for metrics.jsonl / TensorBoard), names prefixed by `prefix`."""
        return {
            f"{prefix}episodes": float(self.episodes),
            f"{prefix}success_rate": self.success_rate,
            f"{prefix}reward_mean": self.reward_mean,
            f"{prefix}turns_mean": self.turns_mean,
            f"{prefix}format_error_rate": self.format_error_rate,
            f"{prefix}action_tokens": float(self.action_tokens),
        }
