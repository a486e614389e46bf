"""Learner: real optimisation on a tiny CausalLM, exact micro-batching, exact save/load."""

import random

import numpy as np
import pytest
import torch
from agentrl_trainers.batching import build_samples, collate, plan_micro_batches
from agentrl_trainers.learner import Learner, LearnerConfig

from agentrl.serving.model import CausalLM, ModelConfig
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup, Turn

PROMPT = [1, 2, 3]
GOOD = 5
LOSSES = ["ppo_clip", "tis", "decoupled_ppo", "cispo", "topr", "gspo"]


def tiny_model(seed: int = 0) -> CausalLM:
    cfg = ModelConfig(
        vocab_size=16,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
    )
    model = CausalLM(cfg)
    model.init_weights(seed)
    return model


def trajectory(name: str, turns: list[tuple[list[int], list[int], list[float]]], reward: float) -> Trajectory:
    built = [
        Turn(
            "o", "a", prompt_token_ids=p, action_token_ids=a, action_logprobs=lp, action_versions=[0] * len(a)
        )
        for p, a, lp in turns
    ]
    built[-1].reward = reward
    return Trajectory(name, "test/Env-v0", "g", 0, turns=built, stop_reason=StopReason.TERMINATED)


@torch.no_grad()
def next_token_probs(model: CausalLM) -> torch.Tensor:
    return torch.softmax(model(torch.tensor([PROMPT]))[0, -1], dim=-1)


@torch.no_grad()
def sample_groups(model: CausalLM, num_groups: int, group_size: int, gen: torch.Generator):
    """On-policy rollouts of a one-token bandit: reward 1 for token GOOD, with true behaviour log-probs."""
    probs = next_token_probs(model)
    groups = []
    for g in range(num_groups):
        tokens = torch.multinomial(probs, group_size, replacement=True, generator=gen).tolist()
        trajs = [
            trajectory(f"{g}-{i}", [(PROMPT, [t], [float(probs[t].log())])], float(t == GOOD))
            for i, t in enumerate(tokens)
        ]
        groups.append(TrajectoryGroup(f"g{g}", g, trajs))
    return groups


@pytest.mark.parametrize("loss", LOSSES)
def test_training_raises_the_probability_of_the_rewarded_token(loss):
    torch.manual_seed(0)
    model = tiny_model()
    learner = Learner(model, LearnerConfig(loss=loss, lr=3e-2, gspo_eps=0.2, gspo_eps_hi=0.28))
    gen = torch.Generator().manual_seed(1)
    before = next_token_probs(model)[GOOD].item()
    history = [learner.train_step(sample_groups(model, 2, 8, gen)) for _ in range(12)]
    after = next_token_probs(model)[GOOD].item()
    assert after > 3 * before, (before, after)
    assert learner.version == 12 and learner.step == 12
    assert all(m["tokens"] == 16 and m["entropy"] > 0 for m in history)
    assert max(m["grad_norm"] for m in history) > 0


def multi_turn_groups(seed: int = 0) -> list[TrajectoryGroup]:
    """Sequences of varied lengths, several turns each, arbitrary (off-policy) behaviour log-probs."""
    rng = random.Random(seed)
    groups = []
    for g in range(3):
        trajs = []
        for i in range(4):
            turns = []
            for _ in range(rng.randint(1, 3)):
                prompt = [rng.randrange(16) for _ in range(rng.randint(1, 5))]
                action = [rng.randrange(16) for _ in range(rng.randint(1, 4))]
                turns.append((prompt, action, [-rng.uniform(1.5, 3.5) for _ in action]))
            trajs.append(trajectory(f"{g}-{i}", turns, float(rng.random())))
        groups.append(TrajectoryGroup(f"g{g}", g, trajs))
    return groups


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
@pytest.mark.parametrize("loss", ["decoupled_ppo", "gspo"])
def test_micro_batching_by_tokens_gives_the_same_gradient_as_one_batch(aggregation, loss):
    groups = multi_turn_groups()
    results = []
    for budget in (100_000, 24):
        model = tiny_model(seed=3)
        config = LearnerConfig(loss=loss, aggregation=aggregation, max_grad_norm=None, entropy_coef=0.01)
        learner = Learner(model, config.model_copy(update={"micro_batch_tokens": budget}))
        metrics = learner.train_step(groups)
        # After AdamW's first step, exp_avg = (1 - beta1) * gradient: the accumulated gradient itself.
        grads = [learner.optimizer.state[p]["exp_avg"] / 0.1 for p in model.parameters()]
        results.append((metrics, grads))
    (big, big_grads), (small, small_grads) = results
    assert big["micro_batches"] == 1 and small["micro_batches"] > 3
    assert small["padded_tokens"] >= small["tokens"]
    for a, b in zip(big_grads, small_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert small["loss"] == pytest.approx(big["loss"], rel=1e-5, abs=1e-7)


def test_micro_batch_plan_respects_the_token_budget_and_sorts_by_length():
    lengths = [5, 30, 7, 12, 6, 40]
    plan = plan_micro_batches(lengths, max_tokens=36)
    assert sorted(i for batch in plan for i in batch) == list(range(6))
    for batch in plan:
        longest = max(lengths[i] for i in batch)
        assert len(batch) * longest <= 36 or len(batch) == 1  # an over-long sequence rides alone
    assert plan[0] == [5]  # longest first
    assert len(plan_micro_batches(lengths, max_tokens=10_000, min_batches=3)) == 3


def test_save_and_load_continue_exactly(tmp_path):
    config = LearnerConfig(loss="decoupled_ppo", kl_coef=0.05, lr=1e-2)
    learner = Learner(tiny_model(seed=1), config)
    for seed in range(2):
        learner.train_step(multi_turn_groups(seed))
    learner.save(tmp_path / "ckpt")
    saved = {k: v.clone() for k, v in learner.state_dict().items()}
    torch_draw, np_draw, py_draw = torch.rand(3), np.random.rand(), random.random()
    expected = learner.train_step(multi_turn_groups(7))

    restored = Learner(tiny_model(seed=99), config)  # different weights until load
    restored.load(tmp_path / "ckpt")
    assert (restored.version, restored.step) == (2, 2)
    assert (
        torch.equal(torch.rand(3), torch_draw) and np.random.rand() == np_draw and random.random() == py_draw
    )
    got = restored.train_step(multi_turn_groups(7))
    for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy"):
        assert got[key] == expected[key], key
    for a, b in zip(learner.model.state_dict().values(), restored.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    exported = CausalLM.from_pretrained(tmp_path / "ckpt").state_dict()  # servable as is
    assert all(torch.equal(exported[k], saved[k]) for k in saved)
    for a, b in zip(learner.reference.parameters(), restored.reference.parameters(), strict=True):
        assert torch.equal(a, b)  # the KL reference (initial weights) survives the restart too


def test_warmup_ramps_the_learning_rate_linearly_and_survives_a_restart(tmp_path):
    config = LearnerConfig(lr=1e-3, warmup_steps=4)
    learner = Learner(tiny_model(seed=1), config)
    lrs = [learner.train_step(multi_turn_groups(seed))["lr"] for seed in range(3)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4])
    learner.save(tmp_path / "ckpt")
    restored = Learner(tiny_model(seed=1), config)
    restored.load(tmp_path / "ckpt")
    assert [restored.train_step(multi_turn_groups(s))["lr"] for s in (3, 4)] == pytest.approx([1e-3, 1e-3])


def test_proximal_log_probs_are_recomputed_once_for_several_minibatches():
    torch.manual_seed(0)
    model = tiny_model()
    gen = torch.Generator().manual_seed(0)
    groups = sample_groups(model, 4, 4, gen)  # behaviour log-probs = the current weights
    learner = Learner(model, LearnerConfig(loss="decoupled_ppo", minibatches=2, lr=0.1))
    metrics = learner.train_step(groups)
    # Proximal == behaviour for every token, in both minibatches, though the weights moved between them.
    assert metrics["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert learner.version == 1


def test_no_grad_recomputation_equals_the_detached_training_log_probs():
    """Why minibatches=1 skips the proximal forward: under the same weights it gives the same numbers."""
    model = tiny_model()
    learner = Learner(model, LearnerConfig(loss="tis"))
    samples = build_samples(multi_turn_groups(), "grpo")
    learner._compute_proximal(samples)  # the no_grad recomputation used with several minibatches
    batch = collate(samples, [1.0] * len(samples))
    logits = model(batch.input_ids)[batch.rows, batch.cols]
    with_grad = logits.gather(1, batch.targets[:, None]).squeeze(1) - torch.logsumexp(logits, -1)
    assert with_grad.requires_grad
    torch.testing.assert_close(torch.cat([s.proximal_logprobs for s in samples]), with_grad.detach())
    metrics = learner.train_step(multi_turn_groups())
    assert metrics["clip_frac"] == 0.0  # u = exp(logp - sg(logp)) = 1 exactly


def test_bad_batches_get_clear_errors():
    learner = Learner(tiny_model())
    scripted = TrajectoryGroup("g", 0, [Trajectory("e", "x", "g", 0, turns=[Turn("o", "a", reward=1.0)])])
    with pytest.raises(ValueError, match="no trajectory with sampled tokens"):
        learner.train_step([scripted])
    broken = trajectory("b", [([1, 2], [3, 4], [-1.0])], 1.0)  # one log-prob for two tokens
    with pytest.raises(ValueError, match="behaviour log-probs"):
        learner.train_step([TrajectoryGroup("g", 0, [broken])])


def test_config_rejects_unknown_loss_and_fields():
    with pytest.raises(ValueError, match="ppo_clip"):
        LearnerConfig(loss="ppo")
    with pytest.raises(ValueError, match="extra"):
        LearnerConfig(clip_epsilon=0.1)
