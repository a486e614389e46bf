"""The off-policy trainer: group advantages, policy-gradient losses and the learner.

Lives in the core package (not a top-level `trainers/` folder) because `agentrl train` and
`--resume` depend on it.
"""

from agentrl.trainer.advantages import compute_advantages, grpo_advantages, lite_ppo_advantages
from agentrl.trainer.learner import Learner, LearnerConfig, LossName

__all__ = [
    "Learner",
    "LearnerConfig",
    "LossName",
    "compute_advantages",
    "grpo_advantages",
    "lite_ppo_advantages",
]
