"""Typed records that flow from the environment manager to the buffer and the trainer.

A `Trajectory` is built by appending exact tokens, turn by turn: each `Turn` holds the prompt
tokens appended before the action (chat-template separators and the observation, loss mask 0)
and the tokens the policy sampled (loss mask 1) with their behaviour log-probs and the policy
version that produced each one. History is never re-tokenized from text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class StopReason(StrEnum):
    """Why an episode ended. Every launched episode ends with exactly one of these."""

    TERMINATED = "terminated"  # the env reached an end state
    TRUNCATED = "truncated"  # the env (or the manager's turn limit) cut the episode short
    ERROR = "error"  # the env or the policy raised
    TIMEOUT = "timeout"  # a step or the whole episode ran past its time limit
    CANCELLED = "cancelled"  # a redundant rollout, dropped because its group already had enough
    ABORTED = "aborted"  # the manager shut down before the episode ended

    @property
    def finished(self) -> bool:
        """True when the env itself ended the episode (usable as training data)."""
        return self in (StopReason.TERMINATED, StopReason.TRUNCATED)


@dataclass
class Turn:
    """One observation -> action -> reward exchange."""

    observation: str
    action: str
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    prompt_token_ids: list[int] = field(default_factory=list)
    action_token_ids: list[int] = field(default_factory=list)
    action_logprobs: list[float] = field(default_factory=list)
    action_versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    policy_seconds: float = 0.0
    env_seconds: float = 0.0


@dataclass
class Trajectory:
    """A whole episode of one environment."""

    episode_id: str
    env_id: str
    group_id: str
    seed: int | None
    system_prompt: str = ""
    turns: list[Turn] = field(default_factory=list)
    stop_reason: StopReason = StopReason.ABORTED
    error: str | None = None
    final_observation: str | None = None
    started_at: float = 0.0
    finished_at: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def total_reward(self) -> float:
        return float(sum(turn.reward for turn in self.turns))

    @property
    def success(self) -> bool:
        """Whether the final step reported `info["success"]`."""
        return bool(self.turns and self.turns[-1].info.get("success", False))

    @property
    def duration(self) -> float:
        return self.finished_at - self.started_at

    @property
    def num_action_tokens(self) -> int:
        return sum(len(turn.action_token_ids) for turn in self.turns)

    def token_ids(self) -> list[int]:
        """The exact token sequence of the episode: prompts and actions, in order."""
        ids: list[int] = []
        for turn in self.turns:
            ids += turn.prompt_token_ids
            ids += turn.action_token_ids
        return ids

    def loss_mask(self) -> list[int]:
        """1 for tokens the policy sampled, 0 for prompt and observation tokens."""
        mask: list[int] = []
        for turn in self.turns:
            mask += [0] * len(turn.prompt_token_ids)
            mask += [1] * len(turn.action_token_ids)
        return mask

    def behaviour_logprobs(self) -> list[float]:
        """Log-probs under the sampling policy, aligned with `token_ids()` (0.0 at prompt tokens)."""
        logprobs: list[float] = []
        for turn in self.turns:
            logprobs += [0.0] * len(turn.prompt_token_ids)
            logprobs += turn.action_logprobs
        return logprobs

    def versions(self) -> list[int]:
        """The policy version of each token, aligned with `token_ids()` (-1 at prompt tokens)."""
        versions: list[int] = []
        for turn in self.turns:
            versions += [-1] * len(turn.prompt_token_ids)
            versions += turn.action_versions
        return versions

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version among sampled tokens (None if the policy returned no tokens)."""
        sampled = [v for turn in self.turns for v in turn.action_versions]
        return min(sampled) if sampled else None


@dataclass
class TrajectoryGroup:
    """The episodes of one group: all played the same seed, for group-relative advantages."""

    group_id: str
    seed: int | None
    trajectories: list[Trajectory]
    cancelled: int = 0  # redundant rollouts dropped after the group had enough
    # rollout-side tail batching: the group was cut off unfinished (its batch had its quota) and
    # carries no trajectories; its task is to be re-rolled in a long round (EnvManager)
    deferred: bool = False

    @property
    def rewards(self) -> list[float]:
        return [t.total_reward for t in self.trajectories]

    @property
    def oldest_version(self) -> int | None:
        versions = [v for t in self.trajectories if (v := t.oldest_version) is not None]
        return min(versions) if versions else None
