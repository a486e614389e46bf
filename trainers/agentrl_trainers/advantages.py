"""Group-relative advantages: one scalar per trajectory, broadcast to its tokens by the learner.

Every trajectory of a group played the same seed, so subtracting the group's mean reward compares
like with like and needs no value network. The two estimators differ only in the scale:

- GRPO (DeepSeekMath): divide by the group's own std, so an easy group and a hard group weigh the
  same; a group whose rewards are all equal gets zero advantages.
- Lite PPO (arXiv 2508.08221): divide by the std of the group-centred rewards over the whole batch,
  which keeps the relative size of groups with large and small spreads and avoids blowing up
  groups whose rewards barely differ.

Standard deviations are population ones (divide by n), so a 2-trajectory group with rewards 0 and 1
gets advantages -1 and +1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentrl.errors import InvalidArgumentError
from agentrl_trainers.config import AdvantageEstimator

EPS = 1e-6


def grpo_advantages(group_rewards: Sequence[Sequence[float]]) -> list[np.ndarray]:
    """A_i = (R_i - mean_group(R)) / (std_group(R) + 1e-6), per group."""
    out = []
    for rewards in group_rewards:
        r = np.asarray(rewards, dtype=np.float64)
        out.append((r - r.mean()) / (r.std() + EPS))
    return out


def lite_ppo_advantages(group_rewards: Sequence[Sequence[float]]) -> list[np.ndarray]:
    """A_i = (R_i - mean_group(R)) / (std_batch(R - mean_group(R)) + 1e-6)."""
    centred = [np.asarray(r, dtype=np.float64) - np.mean(r) for r in group_rewards]
    if not centred:
        return []
    batch_std = np.concatenate(centred).std()
    return [c / (batch_std + EPS) for c in centred]


def compute_advantages(
    group_rewards: Sequence[Sequence[float]], estimator: AdvantageEstimator
) -> list[np.ndarray]:
    """Dispatch by name; raises ValueError naming the allowed estimators."""
    if estimator == "grpo":
        return grpo_advantages(group_rewards)
    if estimator == "lite_ppo":
        return lite_ppo_advantages(group_rewards)
    raise InvalidArgumentError(f"Unknown advantage estimator {estimator!r}; allowed: 'grpo', 'lite_ppo'")
