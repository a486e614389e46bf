"""What the HTTP server asks of a generation backend, and the errors every backend raises.

Both engines (the embedded `TorchEngine` and `VLLMEngine`) implement `Engine` and raise these
exceptions, so the server maps one set of errors to HTTP statuses whatever the backend:

    InvalidRequest -> 400, StaleVersion -> 409, EngineOverloaded -> 429 (with Retry-After),
    EngineDead -> 503, any other PolicyError (not started, shutting down) -> 503.

The server calls nothing on an engine that is not listed in `Engine`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agentrl.errors import PolicyError
from agentrl.generation import GenerationResult, SamplingParams

if TYPE_CHECKING:
    import torch


class InvalidRequest(PolicyError, ValueError):
    """The request cannot be served as given (empty or too long prompt, bad sampling values)."""


class StaleVersion(InvalidRequest):
    """A weight update whose version is lower than the one being served (HTTP 409)."""


class EngineOverloaded(PolicyError):
    """The bounded request queue is full; retry later."""


def check_version(current: int, new: int) -> None:
    """Refuse a weight push that would move the policy version backwards."""
    if new < current:
        raise StaleVersion(f"stale version: the server is at version {current}, the push says {new}")


class EngineDead(PolicyError):
    """The engine's core (decode loop, vLLM engine core) is gone: nothing will be generated until
    the process is restarted. `Engine.health()` gives the reason."""


@dataclass
class GenerationChunk:
    """The tokens a streaming request sampled since the previous chunk.

    `finish_reason` is None until the last chunk. Concatenating every chunk's lists gives exactly
    the `GenerationResult` of the same request.
    """

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0


class Engine(Protocol):
    """A generation backend: the embedded torch engine or vLLM. Token ids in, token ids out."""

    @property
    def version(self) -> int:
        """The policy version of the weights now loaded (set by `update_weights`, never by itself)."""
        ...

    def health(self) -> str | None:
        """None while the engine can serve; else a one-line reason (e.g. its decode loop died)."""
        ...

    def metrics(self) -> dict[str, Any]:
        """JSON-ready counters for /metrics. Keys every engine gives (None where unknown):
        running, queued, cancelled, kv_cache_bytes, sessions, session_bytes."""
        ...

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> GenerationResult:
        """Sample a continuation. `session_id` lets an engine keep a multi-turn episode's prefix.

        Cancelling the awaiting task aborts the request: its slot is freed at the next step and it
        is counted as cancelled. Identical concurrent prompts (n > 1) should share their prefill.
        """
        ...

    def stream(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        """`generate`, chunk by chunk. Validation errors are raised by the first `__anext__`;
        closing the iterator early aborts the request like cancelling `generate` does."""
        ...

    async def update_weights(self, source: str | Mapping[str, torch.Tensor], version: int) -> int:
        """Load weights from a HF checkpoint directory or a state dict and serve them as `version`.

        All or nothing: every tensor is checked (names, shapes, dtypes, finite values) before any
        is used; on any error the old weights keep serving (`InvalidRequest`). A `version` lower
        than the current one raises `StaleVersion`; equal is allowed. Returns `version`.
        """
        ...

    def drop_sessions(self, session_ids: list[str]) -> None:
        """Forget kept session prefixes (episodes over); unknown ids are ignored."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
