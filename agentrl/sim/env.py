"""An env whose only behaviour is time: turns, step latency and observation sizes from distributions.

It stands for an agentic task (a sandbox, a browser, a remote API) in modelled benchmarks: each
step awaits `asyncio.sleep(step_latency)` and so uses no CPU, the episode ends after a sampled
number of turns (`max_turns` -> truncated), and each observation is a string of `observation
tokens` words (one token each for `word_ids`). With `task_prompts` the first observation also
starts with the task's seed, so the episodes of one task (a group, and its re-rolls) share one
prompt and different tasks have different ones: what a prompt-keyed length model
(`LatencyEngine(prompt_factor=...)`) needs to make some tasks long. The reward is 1 or 0 with
probability 1/2, drawn per episode, so group-relative advantages are not all zero. With
`turns=Constant(1)` it is an RLVR task: one response, then the verifier's latency.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from typing import Any

from agentrl.core import Env
from agentrl.sim.distributions import Constant, Distribution, sample_int


class LatencyEnv(Env):
    system_prompt = "modelled task"

    def __init__(
        self,
        *,
        step_latency: Distribution = Constant(0.0),
        turns: Distribution = Constant(1),
        observation_tokens: Distribution = Constant(64),
        prompt_tokens: Distribution | None = None,
        task_prompts: bool = False,
        seed: int = 0,
    ) -> None:
        self.step_latency = step_latency
        self.turns = turns
        self.observation_tokens = observation_tokens
        self.prompt_tokens = prompt_tokens or observation_tokens
        self.task_prompts = task_prompts
        self._rng = random.Random(seed)
        self._turns_left = 0
        self._success = False

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        await super().areset(seed=seed, options=options)
        rng = self._rng
        self._turns_left = sample_int(self.turns, rng)
        self._success = rng.random() < 0.5
        prompt = _words(sample_int(self.prompt_tokens, rng))
        if self.task_prompts:
            prompt = f"task{seed} {prompt}"
        return prompt, {}

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        rng = self._rng
        delay = self.step_latency.sample(rng)
        if delay > 0:
            await asyncio.sleep(delay)
        self._turns_left -= 1
        done = self._turns_left <= 0
        reward = float(self._success) if done else 0.0
        observation = "" if done else _words(sample_int(self.observation_tokens, rng))
        return observation, reward, done, False, {"success": done and self._success}


_WORD = "w "


def _words(n: int) -> str:
    return (_WORD * n).rstrip()


def word_ids(text: str) -> list[int]:
    """The modelled tokenizer: one token per space-separated word. Filler words are all id 7 (only
    counts matter to a latency model); any other word gets an id of its own (its CRC-32), so a
    task tag makes prompts distinct."""
    return [7 if word == "w" else 3 + zlib.crc32(word.encode()) for word in text.split(" ")] if text else []
