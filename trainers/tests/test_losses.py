"""Each loss against a value worked out by hand from small tensors (arithmetic in the comments)."""

import math

import pytest
import torch
from agentrl_trainers import losses


def _leaf(values):
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def test_ppo_clip_takes_the_pessimistic_branch_and_zeroes_clipped_gradients():
    # ratios 1.5, 0.5, 1.1 against a behaviour log-prob of 0; eps 0.2 / 0.28.
    logp = _leaf([math.log(1.5), math.log(0.5), math.log(1.1)])
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, m = losses.ppo_clip_loss(logp, torch.zeros(3), adv, eps_lo=0.2, eps_hi=0.28)
    # token 0: min(1.5*1, 1.28*1) = 1.28 (clipped); token 1: min(-0.5, 0.8*-1) = -0.8 (clipped);
    # token 2: min(2.2, 2.2) = 2.2.  loss = -(1.28 - 0.8 + 2.2) / 3
    assert loss.item() == pytest.approx(-(1.28 - 0.8 + 2.2) / 3, abs=1e-6)
    assert m["clip_frac"].item() == pytest.approx(2 / 3)
    loss.backward()
    # d(-r*A/3)/dlogp = -r*A/3 on the unclipped token only.
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, -2.2 / 3], abs=1e-6)


def test_ppo_dual_clip_bounds_negative_advantage_terms():
    logp = _leaf([math.log(5.0), math.log(2.0)])
    adv = torch.tensor([-1.0, -1.0])
    loss, m = losses.ppo_clip_loss(logp, torch.zeros(2), adv, eps_lo=0.2, eps_hi=0.28, dual_clip_c=3.0)
    # token 0: min(-5, -1.28) = -5 -> max(-5, 3*-1) = -3; token 1: min(-2, -1.28) = -2 -> max(-2, -3) = -2
    assert loss.item() == pytest.approx(-(-3.0 - 2.0) / 2, abs=1e-6)
    assert m["clip_frac"].item() == pytest.approx(0.5)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -(2.0 * -1.0) / 2], abs=1e-6)


def test_tis_truncates_the_behaviour_weight_at_the_cap():
    logp_old = torch.tensor([0.0, 0.0])
    behav = torch.tensor([-math.log(3.0), math.log(2.0)])  # w = min(3, 2) = 2 and w = 0.5
    logp = _leaf([0.0, math.log(1.5)])  # u = 1.0 and 1.5
    adv = torch.tensor([1.0, 1.0])
    loss, m = losses.tis_loss(logp, logp_old, behav, adv, eps_lo=0.2, eps_hi=0.28, cap=2.0)
    # 2 * min(1, 1) + 0.5 * min(1.5, 1.28) = 2 + 0.64
    assert loss.item() == pytest.approx(-(2.0 + 0.64) / 2, abs=1e-6)
    assert m["is_weight_mean"].item() == pytest.approx((2.0 + 0.5) / 2)
    assert m["is_weight_capped_frac"].item() == pytest.approx(0.5)
    assert m["clip_frac"].item() == pytest.approx(0.5)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-2.0 * 1.0 / 2, 0.0], abs=1e-6)


@pytest.mark.parametrize(("cap", "expected_w0"), [(5.0, 3.0), (2.5, 2.5), (None, 3.0)])
def test_decoupled_ppo_weights_by_proximal_over_behaviour(cap, expected_w0):
    logp_old = torch.tensor([0.0, 0.0])
    behav = torch.tensor([-math.log(3.0), math.log(2.0)])  # w = 3 (capped to `cap`), 0.5
    logp = _leaf([0.0, math.log(1.5)])
    adv = torch.tensor([1.0, 1.0])
    loss, m = losses.decoupled_ppo_loss(logp, logp_old, behav, adv, eps_lo=0.2, eps_hi=0.28, behav_cap=cap)
    # w0 * 1 + 0.5 * 1.28
    assert loss.item() == pytest.approx(-(expected_w0 + 0.64) / 2, abs=1e-6)
    assert m["is_weight_mean"].item() == pytest.approx((expected_w0 + 0.5) / 2, abs=1e-6)


def test_decoupled_ppo_rejects_tokens_over_the_cap_when_asked():
    logp_old = torch.tensor([0.0, 0.0])
    behav = torch.tensor([-math.log(6.0), math.log(2.0)])  # w = 6 (over cap 5) and 0.5
    logp = _leaf([0.0, 0.0])
    adv = torch.tensor([1.0, 1.0])
    loss, m = losses.decoupled_ppo_loss(logp, logp_old, behav, adv, behav_cap=5.0, reject=True)
    assert loss.item() == pytest.approx(-(0.0 * 1.0 + 0.5 * 1.0) / 2, abs=1e-6)  # token 0 rejected
    assert m["is_weight_capped_frac"].item() == pytest.approx(0.5)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -0.5 / 2], abs=1e-6)
    clamped, _ = losses.decoupled_ppo_loss(logp, logp_old, behav, adv, behav_cap=5.0)
    assert clamped.item() == pytest.approx(-(5.0 + 0.5) / 2, abs=1e-6)


def test_decoupled_ppo_clips_the_trust_region_around_the_proximal_policy():
    # u = exp(logp - logp_old) = 0.5 for A = -1: min(-0.5, -0.8) = -0.8, clipped, no gradient.
    logp = _leaf([math.log(0.5)])
    loss, m = losses.decoupled_ppo_loss(logp, torch.zeros(1), torch.zeros(1), torch.tensor([-1.0]))
    assert loss.item() == pytest.approx(0.8, abs=1e-6)
    assert m["clip_frac"].item() == 1.0
    loss.backward()
    assert logp.grad.item() == 0.0


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    logp = _leaf([math.log(0.5), math.log(0.4)])
    behav = torch.tensor([math.log(0.25), math.log(0.8)])  # r = 2 -> 1.28 (capped); r = 0.5 (no floor)
    adv = torch.tensor([1.0, -1.0])
    loss, m = losses.cispo_loss(logp, behav, adv, eps_hi=0.28)
    expected = -(1.28 * 1.0 * math.log(0.5) + 0.5 * -1.0 * math.log(0.4)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["clip_frac"].item() == pytest.approx(0.5)
    loss.backward()
    # gradient is -w*A/2 for both tokens, the clipped one included
    assert logp.grad.tolist() == pytest.approx([-1.28 / 2, 0.5 / 2], abs=1e-6)


def test_cispo_lower_bound_when_given():
    logp = _leaf([math.log(0.4)])
    loss, _ = losses.cispo_loss(logp, torch.tensor([math.log(0.8)]), torch.tensor([1.0]), eps_lo=0.2)
    assert loss.item() == pytest.approx(-0.8 * math.log(0.4), abs=1e-6)  # r = 0.5 raised to 0.8


def test_topr_tapers_only_negative_reward_sequences():
    logp = _leaf([math.log(0.5), math.log(0.4), math.log(0.9)])
    behav = torch.tensor([math.log(0.25), math.log(0.8), math.log(0.3)])  # ratios 2, 0.5, 3
    adv = torch.tensor([0.5, -0.5, -0.5])
    reward = torch.tensor([1.0, -1.0, -1.0])
    loss, m = losses.topr_loss(logp, behav, adv, reward)
    # R >= 0: weight 1 (ratio 2 ignored); R < 0: clip(0.5, 0, 1) = 0.5 and clip(3, 0, 1) = 1
    expected = -(0.5 * math.log(0.5) + 0.5 * -0.5 * math.log(0.4) + 1.0 * -0.5 * math.log(0.9)) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["negative_frac"].item() == pytest.approx(2 / 3)
    assert m["is_weight_mean"].item() == pytest.approx((1 + 0.5 + 1) / 3)


def test_gspo_uses_one_geometric_mean_ratio_per_sequence():
    # sequence 0: log ratios 0.1, 0.3 -> s0 = exp(0.2) = 1.2214, A = +1 -> clipped to 1.0004
    # sequence 1: log ratio -1e-4     -> s1 = exp(-1e-4),        A = -1 -> inside [0.9997, 1.0004]
    behav = torch.tensor([0.0, 0.0, 0.0])
    logp = _leaf([0.1, 0.3, -1e-4])
    adv = torch.tensor([1.0, 1.0, -1.0])
    seq_ids = torch.tensor([0, 0, 1])
    weights = torch.tensor([0.25, 0.25, 0.5])  # sequence-mean aggregation over 2 sequences
    loss, m = losses.gspo_loss(logp, behav, adv, seq_ids, weights, eps_lo=3e-4, eps_hi=4e-4)
    s1 = math.exp(-1e-4)
    assert loss.item() == pytest.approx(-(0.5 * 1.0004 + 0.5 * -s1), abs=1e-6)
    assert m["clip_frac"].item() == pytest.approx(0.5)
    loss.backward()
    # only sequence 1 has a gradient: d(-0.5 * s1 * -1)/dlogp = 0.5 * s1 (ds/dlogp = s / 1 token)
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, 0.5 * s1], abs=1e-5)


def test_kl_k3_is_zero_at_the_reference_and_positive_away_from_it():
    logp = _leaf([math.log(0.5), math.log(0.25)])
    ref = torch.tensor([math.log(0.5), math.log(0.5)])  # ref - logp = 0 and log 2
    loss, m = losses.kl_k3(logp, ref)
    assert loss.item() == pytest.approx((0.0 + (2.0 - math.log(2.0) - 1.0)) / 2, abs=1e-6)
    assert m["kl"].item() == pytest.approx(loss.item())


def test_entropy_bonus_is_the_negated_weighted_entropy():
    loss, m = losses.entropy_bonus(torch.tensor([1.0, 2.0]), torch.tensor([0.25, 0.75]))
    assert loss.item() == pytest.approx(-(0.25 * 1.0 + 0.75 * 2.0))
    assert m["entropy"].item() == pytest.approx(1.75)


def test_weighted_sums_over_micro_batches_equal_the_whole_batch_loss():
    torch.manual_seed(0)
    logp, behav, adv = torch.randn(10) - 1, torch.randn(10) - 1, torch.randn(10)
    weights = torch.full((10,), 0.1)
    whole, _ = losses.ppo_clip_loss(logp, behav, adv, weights)
    parts = sum(
        losses.ppo_clip_loss(logp[s], behav[s], adv[s], weights[s])[0] for s in (slice(0, 4), slice(4, 10))
    )
    assert parts.item() == pytest.approx(whole.item(), abs=1e-6)
