"""A policy that calls an `Engine` in-process: the policy client's job without HTTP.

Why: modelled benchmarks run the manager, the buffer and a latency-model engine on a virtual clock
(`agentrl.sim.clock`), where no socket can be awaited. This policy does what `PolicyClient` does
for the token layout: it keeps each episode's token context, appends the new observation's
tokens (`encode`), asks the engine for a continuation with the episode id as session (so a kept
prefix is not re-encoded), and returns the exact tokens with their log-probs and versions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.generation import SamplingParams
from agentrl.rollout.protocol import PolicyInput, PolicyOutput


class EnginePolicy:
    def __init__(
        self,
        engine: Any,
        encode: Callable[[str], list[int]],
        *,
        sampling: SamplingParams | None = None,
        decode: Callable[[list[int]], str] | None = None,
    ) -> None:
        self.engine = engine
        self.encode = encode
        self.decode = decode or (lambda ids: "")
        self.sampling = sampling or SamplingParams()
        self._contexts: dict[str, tuple[list[int], int]] = {}  # episode -> (tokens, messages seen)

    async def __call__(self, request: PolicyInput) -> PolicyOutput:
        tokens, seen = self._contexts.get(request.episode_id, ([], 0))
        new: list[int] = []
        for message in request.messages[seen:]:
            if message["role"] != "assistant":  # our own replies are already in `tokens`
                new.extend(self.encode(message["content"]) or [0])
        prompt = tokens + new
        result = await self.engine.generate(prompt, self.sampling, session_id=request.episode_id)
        # the next turn's messages add this reply (already in the context) and a new observation
        self._contexts[request.episode_id] = (prompt + result.token_ids, len(request.messages) + 1)
        return PolicyOutput(
            self.decode(result.token_ids),
            new,
            result.token_ids,
            result.logprobs,
            result.versions,
            result.finish_reason,
        )

    async def end_episode(self, episode_id: str) -> None:
        self._contexts.pop(episode_id, None)
        drop = getattr(self.engine, "drop_sessions", None)
        if drop is not None:
            drop([episode_id])
