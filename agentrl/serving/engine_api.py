"""What the HTTP server asks of a generation backend, and the errors every backend raises.

Both engines (the embedded `TorchEngine` and `VLLMEngine`) implement `Engine` and raise these
exceptions, so the server maps one set of errors to HTTP statuses whatever the backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from agentrl.errors import PolicyError
from agentrl.generation import GenerationResult, SamplingParams

if TYPE_CHECKING:
    import torch


class InvalidRequest(PolicyError, ValueError):
    """The request cannot be served as given (empty or too long prompt, bad sampling values)."""


class EngineOverloaded(PolicyError):
    """The bounded request queue is full; retry later."""


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
