"""What the environment manager asks of a policy: an async callable from conversation to action.

Scripted policies return plain text. LLM policies (the policy client) also return the exact
token ids they appended to the episode's context and sampled, with log-probs and versions, so
that trajectories are built token-in/token-out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentrl.core import ChatMessage, Env


@dataclass
class PolicyInput:
    """The state of one episode at the moment its env asks for an action."""

    episode_id: str
    turn: int
    messages: list[ChatMessage]  # the whole conversation; the last message is the new observation
    env: Env  # the live env: scripted experts read its state, LLM policies ignore it
    seed: int | None = None  # the episode's task seed (None if the task has none)
    index: int = 0  # the episode's index within its group (the group's episodes share `seed`)
    tools: list[dict[str, Any]] | None = None  # the env's tools, OpenAI-shaped (None: a text-only env)


@dataclass
class PolicyOutput:
    """An action and, for LLM policies, the exact tokens behind it."""

    text: str
    prompt_token_ids: list[int] = field(default_factory=list)  # appended before sampling; loss mask 0
    token_ids: list[int] = field(default_factory=list)  # sampled; loss mask 1
    logprobs: list[float] = field(default_factory=list)  # behaviour log-prob of each sampled token
    versions: list[int] = field(default_factory=list)  # policy version of each sampled token
    finish_reason: str | None = None


@runtime_checkable
class Policy(Protocol):
    async def __call__(self, request: PolicyInput) -> PolicyOutput | str: ...


@runtime_checkable
class EpisodeAwarePolicy(Policy, Protocol):
    """A policy that keeps per-episode state (e.g. a token prefix) and wants to free it."""

    async def end_episode(self, episode_id: str) -> None: ...
