"""Scripted policies: no model, for tests, smoke runs, env checks and warm-start data.

`RandomPolicy` plays a plausible random action: the env's own `sample_action()` when it has one
(games know their move syntax), else random text drawn from the action space. `ExpertPolicy`
asks the env's scripted expert (`env.expert_action()`). `ReferencePolicy(name)` plays one of the
env's declared reference policies (`Env.reference_policies`), the yardsticks of evaluation.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from agentrl.rollout.protocol import PolicyInput


class RandomPolicy:
    """Uniformly random actions, reproducible from `seed`."""

    def __init__(self, seed: int | None = None, max_text_length: int = 16) -> None:
        self.rng = np.random.default_rng(seed)
        self.max_text_length = max_text_length

    async def __call__(self, request: PolicyInput) -> str:
        env = request.env
        sample_action = getattr(env, "sample_action", None)
        if callable(sample_action):
            return str(sample_action())
        space = env.action_space
        if isinstance(space, spaces.Text):
            # Text.sample() would draw up to max_length (64k) characters: keep it short.
            length = int(self.rng.integers(1, self.max_text_length + 1))
            return "".join(self.rng.choice(list(space.character_list), size=length))
        return str(space.sample())


class ExpertPolicy:
    """The env's scripted expert; `NotImplementedError` if the env has none."""

    async def __call__(self, request: PolicyInput) -> str:
        return request.env.expert_action()


class ReferencePolicy:
    """The env's reference policy `name` (`env.reference_action(name)`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def __call__(self, request: PolicyInput) -> str:
        return request.env.reference_action(self.name)
