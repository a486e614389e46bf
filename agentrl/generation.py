"""The generation records shared by the rollout client and the policy server (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)  # stop strings (the matched text is kept)
    stop_token_ids: list[int] = field(default_factory=list)  # in addition to the tokenizer's EOS
    seed: int | None = None
    top_logprobs: int = 0  # also report this many most likely tokens at each step (0-20)


@dataclass
class GenerationResult:
    """Exactly what was sampled, token by token."""

    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the sampling distribution
    versions: list[int]  # the policy version that produced each token
    finish_reason: str  # "stop" (EOS, stop token or stop string), "length", or "abort"
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens served from a kept KV prefix, not re-encoded
    # With SamplingParams.top_logprobs = k > 0: per sampled token, the k most likely [token, logprob]
    # pairs of the distribution it was drawn from (tokens outside the top-p nucleus: -9999.0).
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


# The HTTP header that carries a weight push's policy version (the trainer owns the count).
POLICY_VERSION_HEADER = "X-Policy-Version"
