"""From trajectory groups to padded micro-batches of exact tokens.

Samples are built from `Trajectory.token_ids() / loss_mask() / behaviour_logprobs()`, the exact
tokens the policy saw and sampled; nothing is re-tokenized. Micro-batches are planned by token count:
sequences are sorted by length and packed greedily while `rows * longest_row` stays within the
budget, so rows of similar length share a micro-batch and padding stays small. Padding is on the
right, which a causal model never attends to, so it needs no attention mask. Only the positions that
predict a loss-mask token are gathered from the logits, which keeps the log-softmax off the (usually
much longer) prompt and observation tokens.

Advantages are per token: with `credit="episode"` every sampled token of a trajectory gets its
group-relative advantage; with the per-turn credit modes each turn's sampled tokens get that
turn's advantage (`advantages.turn_return_advantages` / `turn_group_advantages`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.errors import InvalidArgumentError
from agentrl.trajectory import Trajectory, TrajectoryGroup
from agentrl_trainers.advantages import compute_advantages, turn_group_advantages, turn_return_advantages
from agentrl_trainers.config import AdvantageEstimator, Aggregation, CreditAssignment, TurnStateKey


@dataclass
class Sample:
    """One trajectory ready for the learner."""

    token_ids: list[int]
    loss_mask: list[int]
    behav_logprobs: list[float]
    advantages: list[float]  # per token, aligned with token_ids (0.0 where the loss mask is 0)
    reward: float
    proximal_logprobs: Tensor | None = None  # log-probs of the loss tokens under the proximal policy

    @property
    def num_loss_tokens(self) -> int:
        # The first token has no prediction, so a loss mask there cannot be trained.
        return sum(self.loss_mask[1:])

    @property
    def advantage_abs_mean(self) -> float:
        """Mean |advantage| over the trainable tokens (for metrics)."""
        values = [abs(a) for a, m in zip(self.advantages[1:], self.loss_mask[1:], strict=True) if m]
        return sum(values) / max(len(values), 1)


@dataclass
class MicroBatch:
    """Padded input ids plus flat per-loss-token tensors (N = loss tokens in the micro-batch)."""

    input_ids: Tensor  # [B, T] long, right-padded
    rows: Tensor  # [N] row of each loss token's predicting position
    cols: Tensor  # [N] column of the predicting position (the token itself is at cols + 1)
    targets: Tensor  # [N] the sampled token ids
    behav_logprobs: Tensor  # [N]
    advantages: Tensor  # [N]
    rewards: Tensor  # [N]
    seq_ids: Tensor  # [N] 0..B-1, which row (sequence) the token belongs to
    weights: Tensor  # [N] aggregation weights; they sum to 1 over the whole batch, not this micro-batch
    proximal_logprobs: Tensor | None  # [N] when precomputed

    @property
    def num_tokens(self) -> int:
        return int(self.targets.numel())


def trajectory_is_trainable(trajectory: Trajectory) -> bool:
    """A trajectory with at least one sampled token after the first position."""
    return sum(trajectory.loss_mask()[1:]) > 0


def turn_states(trajectory: Trajectory, key: TurnStateKey = "history") -> list[tuple[str, ...]]:
    """The state each turn acted from, as the key the turn-level group baseline groups turns by.

    The baseline compares turns of one group's episodes (same seed) that share this key.
    "history" (the default): the conversation up to and including the turn's observation. An
    observation alone need not be the state (GuessNumber's "higher" says nothing without the
    guess before it); with the same seed and the same history a deterministic env is in the same
    state, so this key is never wrong, but once episodes diverge almost no turn shares it.
    "observation": the turn's observation alone, GiGPO's anchor state, for envs whose
    observations are their state (GuessNumberInterval's "higher (6-10)"): turns that reached the
    same observation by different paths are then compared too.
    """
    if key == "observation":
        return [(turn.observation,) for turn in trajectory.turns]
    if key != "history":
        raise InvalidArgumentError(f"Unknown turn state key {key!r}; allowed: 'history', 'observation'")
    states, history = [], []
    for turn in trajectory.turns:
        history.append(turn.observation)
        states.append(tuple(history))
        history.append(turn.action)
    return states


def turn_advantages(
    groups: Sequence[TrajectoryGroup],
    estimator: AdvantageEstimator,
    credit: CreditAssignment = "episode",
    *,
    gamma: float = 1.0,
    turn_group_weight: float = 1.0,
    turn_state: TurnStateKey = "history",
) -> list[list[list[float]]]:
    """The advantage of every turn of every trajectory: `[group][trajectory][turn]`."""
    if credit == "episode":
        episode = compute_advantages([g.rewards for g in groups], estimator)
        return [
            [[float(a)] * len(t.turns) for t, a in zip(g.trajectories, adv, strict=True)]
            for g, adv in zip(groups, episode, strict=True)
        ]
    rewards = [[[turn.reward for turn in t.turns] for t in g.trajectories] for g in groups]
    if credit == "turn_return":
        per_turn = turn_return_advantages(rewards, gamma)
    elif credit == "turn_group":
        states = [[turn_states(t, turn_state) for t in g.trajectories] for g in groups]
        per_turn = turn_group_advantages(
            rewards, states, gamma=gamma, step_weight=turn_group_weight, episode_estimator=estimator
        )
    else:
        raise InvalidArgumentError(
            f"Unknown credit assignment {credit!r}; allowed: 'episode', 'turn_return', 'turn_group'"
        )
    return [[[float(a) for a in episode] for episode in group] for group in per_turn]


def build_samples(
    groups: Sequence[TrajectoryGroup],
    estimator: AdvantageEstimator,
    credit: CreditAssignment = "episode",
    *,
    gamma: float = 1.0,
    turn_group_weight: float = 1.0,
    turn_state: TurnStateKey = "history",
) -> list[Sample]:
    """Compute advantages and turn every trainable trajectory into a `Sample`.

    Advantages are computed over all trajectories of a group (a trajectory without tokens still
    tells the group what reward was possible), then only trajectories with loss tokens are kept.
    """
    advantages = turn_advantages(
        groups, estimator, credit, gamma=gamma, turn_group_weight=turn_group_weight, turn_state=turn_state
    )
    samples = []
    for group, group_adv in zip(groups, advantages, strict=True):
        for trajectory, adv in zip(group.trajectories, group_adv, strict=True):
            ids, mask, behav = trajectory.token_ids(), trajectory.loss_mask(), trajectory.behaviour_logprobs()
            if len(behav) != len(ids):
                raise InvalidArgumentError(
                    f"Trajectory {trajectory.episode_id}: {len(ids)} tokens but {len(behav)} behaviour "
                    "log-probs; every sampled token needs its log-prob from the policy server"
                )
            if sum(mask[1:]) == 0:
                continue
            token_adv = [
                a
                for turn, turn_adv in zip(trajectory.turns, adv, strict=True)
                for a in [0.0] * len(turn.prompt_token_ids) + [turn_adv] * len(turn.action_token_ids)
            ]
            samples.append(Sample(ids, mask, behav, token_adv, trajectory.total_reward))
    return samples


def aggregation_weights(samples: Sequence[Sample], mode: Aggregation) -> list[float]:
    """Per-sample weight of each of its loss tokens, so the weights of all tokens sum to 1."""
    if mode == "token":
        total = sum(s.num_loss_tokens for s in samples)
        return [1.0 / total] * len(samples)
    if mode == "sequence":
        return [1.0 / (s.num_loss_tokens * len(samples)) for s in samples]
    raise InvalidArgumentError(f"Unknown aggregation {mode!r}; allowed: 'token', 'sequence'")


def plan_micro_batches(lengths: Sequence[int], max_tokens: int, min_batches: int = 1) -> list[list[int]]:
    """Group sequence indices so each group's padded size (rows * longest) stays within `max_tokens`.

    Longest first, greedy. A sequence longer than the budget gets a micro-batch of its own (it cannot
    be split without a KV cache). If fewer than `min_batches` groups result, the largest groups are
    halved until there are enough (or every group holds one sequence).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches: list[list[int]] = []
    for index in order:
        current = batches[-1] if batches else None
        if current is not None and (len(current) + 1) * lengths[current[0]] <= max_tokens:
            current.append(index)
        else:
            batches.append([index])
    while len(batches) < min_batches:
        splittable = [b for b in batches if len(b) > 1]
        if not splittable:
            break
        largest = max(splittable, key=lambda b: len(b) * lengths[b[0]])
        half = len(largest) // 2
        batches.remove(largest)
        batches += [largest[:half], largest[half:]]
    return batches


def collate(samples: Sequence[Sample], weights: Sequence[float], pad_id: int = 0) -> MicroBatch:
    """Right-pad the samples into one [B, T] batch and flatten their loss tokens."""
    longest = max(len(s.token_ids) for s in samples)
    input_ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    rows, cols, targets, behav, adv, rew, wts = [], [], [], [], [], [], []
    for row, (sample, weight) in enumerate(zip(samples, weights, strict=True)):
        input_ids[row, : len(sample.token_ids)] = torch.tensor(sample.token_ids, dtype=torch.long)
        positions = [t for t in range(1, len(sample.token_ids)) if sample.loss_mask[t]]
        rows += [row] * len(positions)
        cols += [t - 1 for t in positions]
        targets += [sample.token_ids[t] for t in positions]
        behav += [sample.behav_logprobs[t] for t in positions]
        adv += [sample.advantages[t] for t in positions]
        rew += [sample.reward] * len(positions)
        wts += [weight] * len(positions)
    proximal = None
    if all(s.proximal_logprobs is not None for s in samples):
        proximal = torch.cat([s.proximal_logprobs for s in samples])  # type: ignore[misc]
    row_tensor = torch.tensor(rows, dtype=torch.long)
    return MicroBatch(
        input_ids=input_ids,
        rows=row_tensor,
        cols=torch.tensor(cols, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        behav_logprobs=torch.tensor(behav, dtype=torch.float32),
        advantages=torch.tensor(adv, dtype=torch.float32),
        rewards=torch.tensor(rew, dtype=torch.float32),
        seq_ids=row_tensor,
        weights=torch.tensor(wts, dtype=torch.float32),
        proximal_logprobs=proximal,
    )
