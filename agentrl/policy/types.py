"""The records and the engine interface shared by the policy server, its engines and clients."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)  # stop strings (the matched text is kept)
    stop_token_ids: list[int] = field(default_factory=list)  # in addition to the tokenizer's EOS
    seed: int | None = None


@dataclass
class GenerationResult:
    """Exactly what was sampled, token by token."""

    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the sampling distribution
    versions: list[int]  # the policy version that produced each token
    finish_reason: str  # "stop" (EOS, stop token or stop string), "length", or "abort"
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens served from a kept KV prefix, not re-encoded


class Engine(Protocol):
    """A generation backend: the embedded torch engine or vLLM. Token ids in, token ids out."""

    @property
    def version(self) -> int:
        """The policy version of the weights now loaded (0 for the initial checkpoint)."""
        ...

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> GenerationResult:
        """Sample a continuation. `session_id` lets an engine keep a multi-turn episode's prefix."""
        ...

    async def update_weights(self, source: str | Mapping[str, torch.Tensor]) -> int:
        """Load weights from a HF checkpoint directory or a state dict; return the new version."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
