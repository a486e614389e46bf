"""Group-relative advantages: one scalar per trajectory, broadcast to its tokens by the learner.

Every trajectory of a group played the same seed, so subtracting the group's mean reward compares
like with like and needs no value network. The two estimators differ only in the scale:

- GRPO (DeepSeekMath): divide by the group's own std, so an easy group and a hard group weigh the
  same; a group whose rewards are all equal gets zero advantages.
- Lite PPO (arXiv 2508.08221): divide by the std of the group-centred rewards over the whole batch,
  which keeps the relative size of groups with large and small spreads and avoids blowing up
  groups whose rewards barely differ.

Standard deviations are population ones (divide by n), so a 2-trajectory group with rewards 0 and 1
gets advantages -1 and +1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentrl.errors import InvalidArgumentError
from agentrl_trainers.config import AdvantageEstimator

EPS = 1e-6


def grpo_advantages(group_rewards: Sequence[Sequence[float]]) -> list[np.ndarray]:
    """A_i = (R_i - mean_group(R)) / (std_group(R) + 1e-6), per group."""
    out = []
    for rewards in group_rewards:
        r = np.asarray(rewards, dtype=np.float64)
        out.append((r - r.mean()) / (r.std() + EPS))
    return out


def lite_ppo_advantages(group_rewards: Sequence[Sequence[float]]) -> list[np.ndarray]:
    """A_i = (R_i - mean_group(R)) / (std_batch(R - mean_group(R)) + 1e-6)."""
    centred = [np.asarray(r, dtype=np.float64) - np.mean(r) for r in group_rewards]
    if not centred:
        return []
    batch_std = np.concatenate(centred).std()
    return [c / (batch_std + EPS) for c in centred]


def compute_advantages(
    group_rewards: Sequence[Sequence[float]], estimator: AdvantageEstimator
) -> list[np.ndarray]:
    """Dispatch by name; raises ValueError naming the allowed estimators."""
    if estimator == "grpo":
        return grpo_advantages(group_rewards)
    if estimator == "lite_ppo":
        return lite_ppo_advantages(group_rewards)
    raise InvalidArgumentError(f"Unknown advantage estimator {estimator!r}; allowed: 'grpo', 'lite_ppo'")


# -- multi-turn credit assignment ------------------------------------------------------------
#
# An episode-level advantage gives every turn of an episode the same credit, so a good first
# guess in an episode that failed later is punished with the bad ones. The two estimators below
# give each turn its own advantage, computed from the group's per-turn rewards (`Turn.reward`);
# docs/algorithms.md explains the choices.


def reward_to_go(rewards: Sequence[float], gamma: float = 1.0) -> np.ndarray:
    """G_t = sum_{k >= t} gamma^(k - t) r_k: what followed turn t, itself included."""
    out = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def turn_return_advantages(
    group_turn_rewards: Sequence[Sequence[Sequence[float]]], gamma: float = 1.0
) -> list[list[np.ndarray]]:
    """Reward-to-go with a per-turn-index group baseline, per group, per episode, per turn.

    A_{i,t} = (G_{i,t} - b_t) / (std_group(G - b) + 1e-6), where b_t is the mean of G_{j,t} over
    the group's episodes that reached turn t (a baseline that depends on the turn index only, so
    it adds no bias) and the std runs over all centred turns of the group. A turn that only one
    episode reached gets 0: nothing to compare it with.
    """
    out = []
    for episodes in group_turn_rewards:
        returns = [reward_to_go(r, gamma) for r in episodes]
        longest = max((len(g) for g in returns), default=0)
        baseline = [np.mean([g[t] for g in returns if len(g) > t]) for t in range(longest)]
        centred = [g - np.asarray(baseline[: len(g)]) for g in returns]
        flat = np.concatenate(centred) if centred else np.zeros(0)
        scale = flat.std() if flat.size else 0.0
        out.append([c / (scale + EPS) for c in centred])
    return out


def turn_group_advantages(
    group_turn_rewards: Sequence[Sequence[Sequence[float]]],
    group_turn_states: Sequence[Sequence[Sequence[object]]],
    *,
    gamma: float = 1.0,
    step_weight: float = 1.0,
    episode_estimator: str = "grpo",
) -> list[list[np.ndarray]]:
    """GiGPO-style: episode-level group advantage plus a turn-level one among equal states.

    A_{i,t} = A^E_i + step_weight * A^S_{i,t}. A^E is the episode-level estimator on the
    episodes' total rewards. A^S compares the turns of the group's episodes that acted from the
    same state (`group_turn_states[g][i][t]`, any hashable key, e.g. the conversation so far):
    A^S_{i,t} = (G_{i,t} - mean_S(G)) / (std_S(G) + 1e-6) over the set S of turns sharing that
    state, with G the discounted reward-to-go; a state seen once gets A^S = 0.
    """
    totals = [[float(np.sum(r)) for r in episodes] for episodes in group_turn_rewards]
    episode_adv = compute_advantages(totals, episode_estimator)  # type: ignore[arg-type]
    out = []
    for episodes, states, adv_e in zip(group_turn_rewards, group_turn_states, episode_adv, strict=True):
        returns = [reward_to_go(r, gamma) for r in episodes]
        members: dict[object, list[tuple[int, int]]] = {}
        for i, episode_states in enumerate(states):
            if len(episode_states) != len(returns[i]):
                raise InvalidArgumentError(
                    f"episode {i}: {len(episode_states)} states for {len(returns[i])} turns"
                )
            for t, state in enumerate(episode_states):
                members.setdefault(state, []).append((i, t))
        step = [np.zeros(len(g)) for g in returns]
        for turns in members.values():
            if len(turns) < 2:
                continue
            values = np.array([returns[i][t] for i, t in turns])
            normed = (values - values.mean()) / (values.std() + EPS)
            for (i, t), value in zip(turns, normed, strict=True):
                step[i][t] = value
        out.append([adv_e[i] + step_weight * step[i] for i in range(len(returns))])
    return out
