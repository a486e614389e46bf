"""An example agentrl environment: find a hidden number from "higher"/"lower" hints.

Copy this package to start your own suite. It shows everything an env needs:
seeded generation (`areset`), an action parser with a format penalty for unparseable
output, a turn limit (`truncated`), a success flag, a scripted expert and a random-action
sampler.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl import Env

_ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>", re.IGNORECASE)


class GuessNumberEnv(Env):
    """Guess an integer in [1, high]; each wrong guess is answered with "higher" or "lower"."""

    system_prompt = (
        "I am thinking of a whole number. Guess it. After each guess I say whether my number is "
        "higher or lower. Reply with your guess as <answer>N</answer>."
    )

    def __init__(self, high: int = 100, max_turns: int = 10, format_penalty: float = -0.1) -> None:
        self.high = high
        self.max_turns = max_turns
        self.format_penalty = format_penalty

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        await super().areset(seed=seed, options=options)  # seeds self.np_random
        self.target = int(self.np_random.integers(1, self.high + 1))
        self.low_bound, self.high_bound = 1, self.high  # what the hints have revealed so far
        self.turns = 0
        return f"The number is between 1 and {self.high}.", {}

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turns += 1
        truncated = self.turns >= self.max_turns
        match = _ANSWER.search(action)
        if match is None:
            observation = "I could not read a guess. Reply with <answer>N</answer>."
            info = {"format_error": True, "success": False}
            return observation, self.format_penalty, False, truncated, info
        guess = int(match.group(1))
        if guess == self.target:
            return f"Yes, it is {guess}!", 1.0, True, False, {"success": True}
        if guess < self.target:
            self.low_bound = max(self.low_bound, guess + 1)
            hint = "higher"
        else:
            self.high_bound = min(self.high_bound, guess - 1)
            hint = "lower"
        return f"No, my number is {hint} than {guess}.", 0.0, False, truncated, {"success": False}

    def expert_action(self) -> str:
        """Binary search over what the hints allow: solves within log2(high) + 1 turns."""
        return f"<answer>{(self.low_bound + self.high_bound) // 2}</answer>"

    def sample_action(self) -> str:
        """A well-formed random guess (`RandomPolicy` uses this instead of random text)."""
        return f"<answer>{int(self.np_random.integers(1, self.high + 1))}</answer>"
