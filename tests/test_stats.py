"""RolloutStats: one rule for success (all episodes) and means (episodes the env ended)."""

from agentrl.rollout.stats import RolloutStats
from agentrl.trajectory import StopReason, Trajectory, Turn


def _episode(reward: float, turns: int, reason: StopReason, success: bool = False) -> Trajectory:
    steps = [Turn("o", "a", reward=reward / turns, info={"format_error": i == 0}) for i in range(turns)]
    trajectory = Trajectory("e", "env", "g", 0, turns=steps, stop_reason=reason)
    if success:
        trajectory.turns[-1].info["success"] = True
    return trajectory


def test_failed_episodes_count_against_success_but_stay_out_of_the_means() -> None:
    stats = RolloutStats.of(
        [
            _episode(1.0, 2, StopReason.TERMINATED, success=True),
            _episode(0.0, 4, StopReason.TRUNCATED),
            _episode(-5.0, 1, StopReason.ERROR),
            _episode(-5.0, 1, StopReason.TIMEOUT),
        ]
    )
    assert stats.episodes == 4 and stats.finished == 2 and stats.errors == 2
    assert stats.success_rate == 0.25  # 1 of 4: the failed ones did not succeed
    assert stats.reward_mean == 0.5  # (1 + 0) / 2
    assert stats.turns_mean == 3.0  # (2 + 4) / 2
    assert stats.format_error_rate == 2 / 6  # one flagged turn per finished episode
    assert stats.failures == {"error": 1, "timeout": 1}
    assert stats.as_metrics("rollout/")["rollout/success_rate"] == 0.25


def test_no_episodes_gives_zeros_not_errors() -> None:
    empty = RolloutStats()
    assert (empty.success_rate, empty.reward_mean, empty.turns_mean, empty.format_error_rate) == (0, 0, 0, 0)
