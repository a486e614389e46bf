"""Policy-gradient losses, one small function per paper, equations visible (see docs/algorithms.md).

Every function works on flat 1-D tensors holding only the loss-mask tokens of a (micro-)batch:

- `logp`: log pi_theta(token), with grad (the policy being trained);
- `logp_old`: the proximal policy the trainer last synced (no grad), used by TIS and decoupled PPO;
- `logp_behav`: what the policy server returned when it sampled the token (no grad);
- `adv`: the advantage of the token's sequence, broadcast to its tokens;
- `weights`: aggregation weights that sum to 1 over the whole training batch.

Aggregation is a weighted sum so gradient accumulation is exact: with token-level aggregation every
token weighs `1 / (loss-mask tokens in the batch)`; with sequence-mean it weighs
`1 / (len(its sequence) * sequences in the batch)`. Summing the losses of the micro-batches gives
the loss of the whole batch, and the same holds for the metrics, which are weighted means too.

Each function returns `(loss, metrics)`: the loss to minimise (the negated objective) and a dict of
0-d tensors (detached) such as the clip fraction.
"""

from __future__ import annotations

import torch
from torch import Tensor

Metrics = dict[str, Tensor]


def _uniform(like: Tensor) -> Tensor:
    """Token-mean weights for a tensor used on its own (tests, quick checks)."""
    return torch.full_like(like, 1.0 / max(like.numel(), 1), dtype=torch.float32)


def _wmean(values: Tensor, weights: Tensor) -> Tensor:
    return (values.float() * weights).sum().detach()


def _ppo_clip_objective(
    ratio: Tensor, adv: Tensor, eps_lo: float, eps_hi: float, dual_clip_c: float | None = None
) -> tuple[Tensor, Tensor]:
    """`min(r*A, clip(r, 1-eps_lo, 1+eps_hi)*A)`, dual-clipped to `max(., c*A)` where A < 0.

    Returns the per-token objective and a 0/1 tensor marking tokens whose gradient was clipped away.
    """
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_lo, 1.0 + eps_hi) * adv
    objective = torch.minimum(unclipped, clipped)
    was_clipped = clipped < unclipped
    if dual_clip_c is not None:
        lower = dual_clip_c * adv
        dual = (adv < 0) & (objective < lower)
        objective = torch.where(dual, lower, objective)
        was_clipped = was_clipped | dual
    return objective, was_clipped


def ppo_clip_loss(
    logp: Tensor,
    logp_behav: Tensor,
    adv: Tensor,
    weights: Tensor | None = None,
    *,
    eps_lo: float = 0.2,
    eps_hi: float = 0.28,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, Metrics]:
    """PPO-clip (Schulman et al. 2017) with the behaviour policy as the old policy.

    r = exp(logp - logp_behav); objective = min(r*A, clip(r, 1-eps_lo, 1+eps_hi)*A), and with
    dual-clip (Ye et al. 2020) max(objective, c*A) for A < 0 so a huge ratio on a bad token cannot
    produce an unbounded step.
    """
    weights = _uniform(logp) if weights is None else weights
    ratio = torch.exp(logp - logp_behav)
    objective, was_clipped = _ppo_clip_objective(ratio, adv, eps_lo, eps_hi, dual_clip_c)
    loss = -(objective * weights).sum()
    return loss, {"clip_frac": _wmean(was_clipped, weights), "ratio_mean": _wmean(ratio, weights)}


def tis_loss(
    logp: Tensor,
    logp_old: Tensor,
    logp_behav: Tensor,
    adv: Tensor,
    weights: Tensor | None = None,
    *,
    eps_lo: float = 0.2,
    eps_hi: float = 0.28,
    cap: float = 2.0,
) -> tuple[Tensor, Metrics]:
    """Truncated importance sampling (Yao et al. 2025): PPO-clip against the trainer's proximal
    policy, times `w = sg(min(exp(logp_old - logp_behav), C))` to correct for the sampler's
    mismatch (a different engine, or stale weights) without letting one token's weight explode.
    """
    weights = _uniform(logp) if weights is None else weights
    is_weight = torch.exp(logp_old - logp_behav).clamp(max=cap).detach()
    ratio = torch.exp(logp - logp_old)
    objective, was_clipped = _ppo_clip_objective(ratio, adv, eps_lo, eps_hi)
    loss = -(is_weight * objective * weights).sum()
    return loss, {
        "clip_frac": _wmean(was_clipped, weights),
        "is_weight_mean": _wmean(is_weight, weights),
        "is_weight_capped_frac": _wmean(is_weight >= cap, weights),
    }


def decoupled_ppo_loss(
    logp: Tensor,
    logp_old: Tensor,
    logp_behav: Tensor,
    adv: Tensor,
    weights: Tensor | None = None,
    *,
    eps_lo: float = 0.2,
    eps_hi: float = 0.28,
    behav_cap: float | None = 5.0,
    reject: bool = False,
) -> tuple[Tensor, Metrics]:
    """Decoupled PPO (Hilton et al. 2022; AReaL): the trust region is taken around the proximal
    policy, `u = exp(logp - logp_old)`, and the off-policyness of the behaviour policy is
    corrected by `w = sg(exp(logp_old - logp_behav))`:  w * min(u*A, clip(u, 1-eps, 1+eps_hi)*A).

    `behav_cap` bounds w (None = unbounded): clamped to the cap, or with `reject=True` a token over
    the cap gets weight 0 (AReaL's choice: a token the sampler found far less likely than the
    trainer does is treated as unusable rather than down-weighted). Clamped, the form equals TIS;
    the difference is intent and defaults: the weight here corrects staleness (cap 5), TIS's
    corrects engine mismatch (cap 2).
    """
    weights = _uniform(logp) if weights is None else weights
    behav_weight = torch.exp(logp_old - logp_behav).detach()
    over_cap = torch.zeros_like(behav_weight, dtype=torch.bool)
    if behav_cap is not None:
        over_cap = behav_weight > behav_cap
        capped = torch.zeros_like(behav_weight) if reject else torch.full_like(behav_weight, behav_cap)
        behav_weight = torch.where(over_cap, capped, behav_weight)
    ratio = torch.exp(logp - logp_old)
    objective, was_clipped = _ppo_clip_objective(ratio, adv, eps_lo, eps_hi)
    loss = -(behav_weight * objective * weights).sum()
    return loss, {
        "clip_frac": _wmean(was_clipped, weights),
        "is_weight_mean": _wmean(behav_weight, weights),
        "is_weight_capped_frac": _wmean(over_cap, weights),
    }


def cispo_loss(
    logp: Tensor,
    logp_behav: Tensor,
    adv: Tensor,
    weights: Tensor | None = None,
    *,
    eps_lo: float | None = None,
    eps_hi: float = 0.28,
) -> tuple[Tensor, Metrics]:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, not the update.

    objective = sg(clip(r, 1-eps_lo, 1+eps_hi)) * A * logp with r = exp(logp - logp_behav). Every
    token keeps a gradient (PPO-clip zeroes it for clipped tokens); only its weight is bounded.
    MiniMax uses no lower bound (eps_lo=None).
    """
    weights = _uniform(logp) if weights is None else weights
    ratio = torch.exp(logp - logp_behav).detach()
    lo = None if eps_lo is None else 1.0 - eps_lo
    is_weight = torch.clamp(ratio, min=lo, max=1.0 + eps_hi)
    loss = -(is_weight * adv * logp * weights).sum()
    return loss, {
        "clip_frac": _wmean(is_weight != ratio, weights),
        "is_weight_mean": _wmean(is_weight, weights),
    }


def topr_loss(
    logp: Tensor,
    logp_behav: Tensor,
    adv: Tensor,
    reward: Tensor,
    weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """TOPR, tapered off-policy REINFORCE (Le Roux et al. 2025).

    Sequences with reward R >= 0 get the plain REINFORCE term A * logp (no importance weight, so
    good off-policy samples are learned at full strength); sequences with R < 0 get
    sg(clip(exp(logp - logp_behav), 0, 1)) * A * logp, which tapers the push-down on tokens the
    current policy already finds less likely than the sampler did.
    """
    weights = _uniform(logp) if weights is None else weights
    truncated = torch.exp(logp - logp_behav).detach().clamp(0.0, 1.0)
    negative = reward < 0
    is_weight = torch.where(negative, truncated, torch.ones_like(truncated))
    loss = -(is_weight * adv * logp * weights).sum()
    return loss, {"negative_frac": _wmean(negative, weights), "is_weight_mean": _wmean(is_weight, weights)}


def gspo_loss(
    logp: Tensor,
    logp_behav: Tensor,
    adv: Tensor,
    seq_ids: Tensor,
    weights: Tensor | None = None,
    *,
    eps_lo: float = 3e-4,
    eps_hi: float = 4e-4,
) -> tuple[Tensor, Metrics]:
    """GSPO (Qwen, 2025): one importance ratio per sequence, the geometric mean of its tokens'.

    s_i = exp(mean_t(logp - logp_behav)) over the tokens of sequence i, then PPO-clip on s_i with the
    sequence advantage. The sequence objective is broadcast to its tokens and aggregated with
    `weights`: sequence-mean weights give the paper's 1/G sum; token weights weigh by length.
    `seq_ids[k]` is the index (0..S-1) of token k's sequence; `adv` is constant within a sequence.
    """
    weights = _uniform(logp) if weights is None else weights
    num_seqs = int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0
    log_ratio = logp - logp_behav
    sums = torch.zeros(num_seqs, dtype=log_ratio.dtype).index_add(0, seq_ids, log_ratio)
    counts = torch.zeros(num_seqs, dtype=log_ratio.dtype).index_add(0, seq_ids, torch.ones_like(log_ratio))
    seq_ratio = torch.exp(sums / counts.clamp(min=1.0))
    objective, was_clipped = _ppo_clip_objective(seq_ratio[seq_ids], adv, eps_lo, eps_hi)
    loss = -(objective * weights).sum()
    return loss, {
        "clip_frac": _wmean(was_clipped, weights),
        "ratio_mean": _wmean(seq_ratio[seq_ids], weights),
    }


def kl_k3(logp: Tensor, logp_ref: Tensor, weights: Tensor | None = None) -> tuple[Tensor, Metrics]:
    """KL(pi_theta || pi_ref) with Schulman's k3 estimator: exp(ref - logp) - (ref - logp) - 1.

    Unbiased and always >= 0 per token, unlike the plain log-ratio. Added to the loss times beta.
    """
    weights = _uniform(logp) if weights is None else weights
    delta = logp_ref - logp
    per_token = torch.exp(delta) - delta - 1.0
    loss = (per_token * weights).sum()
    return loss, {"kl": loss.detach()}


def entropy_bonus(entropy: Tensor, weights: Tensor | None = None) -> tuple[Tensor, Metrics]:
    """Maximise the policy's entropy (the returned loss is -entropy), added times a coefficient."""
    weights = _uniform(entropy) if weights is None else weights
    mean_entropy = (entropy * weights).sum()
    return -mean_entropy, {"entropy": mean_entropy.detach()}


LOSSES_NEEDING_PROXIMAL = frozenset({"tis", "decoupled_ppo"})
