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


class StaleVersion(InvalidRequest):
    """A weight update whose version is below the one being served."""


def check_version(current: int, new: int) -> None:
    """Refuse a weight push that would move the policy version backwards."""
    if new < current:
        raise StaleVersion(f"stale version: the server is at version {current}, the push says {new}")


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

    async def update_weights(self, source: str | Mapping[str, torch.Tensor], version: int) -> int:
        """Load weights from a HF checkpoint directory or a state dict, stamped `version`.

        The trainer owns the version: the engine stamps exactly `version` on every token sampled
        with these weights and never counts on its own. A version below the current one is a
        `StaleVersion` error (a late push must not roll the policy back); an equal one is allowed.
        Returns `version`.
        """
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
