"""The checks a generation request passes before it reaches an engine: one function for both.

vLLM's engine core is a separate process, and some inputs it does not expect (an id outside the
vocabulary, a seed beyond 64 bits) fail there instead of failing one request; the embedded engine
would fail mid-step. Both engines call `check_request` first, so they refuse a bad request with
the same `InvalidRequest` message (HTTP 400).
"""

from __future__ import annotations

import math

from agentrl.generation import SamplingParams
from agentrl.serving.engine_api import InvalidRequest

MAX_TOP_LOGPROBS = 20  # OpenAI's limit, and the embedded engine's


def check_request(
    prompt: list[int], params: SamplingParams, *, context_len: int, vocab_size: int, can_decode: bool = True
) -> None:
    """Raise `InvalidRequest` naming the first problem; return None when the request can be served.

    `context_len` is the longest sequence the engine holds (prompt + completion); `can_decode`
    says whether the engine has a tokenizer to match stop strings with.
    """
    if not prompt:
        raise InvalidRequest("prompt_token_ids is empty")
    if len(prompt) >= context_len:
        raise InvalidRequest(f"prompt has {len(prompt)} tokens; the context holds {context_len}")
    _check_ids("token ids", prompt, vocab_size)
    _check_ids("stop_token_ids", params.stop_token_ids, vocab_size)
    if params.max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be >= 1, got {params.max_tokens}")
    if not (params.temperature >= 0 and math.isfinite(params.temperature)):
        raise InvalidRequest(f"temperature must be a finite number >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {params.top_p}")
    if not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {params.top_logprobs}")
    if params.seed is not None and not -(2**63) <= params.seed < 2**63:
        raise InvalidRequest(f"seed must fit in a signed 64-bit integer, got {params.seed}")
    if params.stop and not can_decode:
        raise InvalidRequest("stop strings need a tokenizer; this engine has none")
    for stop in params.stop:
        if not stop:
            raise InvalidRequest("stop strings must not be empty")
        try:
            stop.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequest(f"stop string {stop!r} is not valid Unicode: {exc.reason}") from None


def _check_ids(what: str, ids: list[int], vocab_size: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequest(f"{what} out of range [0, {vocab_size}): {bad[:5]}")
