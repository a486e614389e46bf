"""The learner: one optimizer step of an off-policy policy-gradient loss on a batch of groups.

`Learner.train_step(groups)` computes group advantages, packs the exact trajectory tokens into
micro-batches by token count, accumulates the gradient of the configured loss over them, clips the
gradient norm, steps AdamW and bumps `version` (the number the policy server gets with the new
weights). `save`/`load` keep everything a resumed run needs to continue exactly: weights,
optimizer moments, version, step counter and RNG states.

Proximal log-probs (TIS, decoupled PPO): with `minibatches=1` the proximal policy is the current
weights, so `logp.detach()` from the training forward *is* the no-grad recomputation (the weights
do not change until the optimizer step) and saves a forward pass, which matters on a 2-core CPU.
With `minibatches>1` they are recomputed under no_grad before the first update and held fixed.
"""

from __future__ import annotations

import copy
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from agentrl.errors import AgentRLError, InvalidArgumentError
from agentrl.trajectory import TrajectoryGroup
from agentrl_trainers import losses
from agentrl_trainers.batching import (
    MicroBatch,
    Sample,
    aggregation_weights,
    build_samples,
    collate,
    plan_micro_batches,
)
from agentrl_trainers.config import LearnerConfig

STATE_FILE = "learner_state.pt"


class Learner:
    """Owns the model being trained, its AdamW optimizer, and the loss configuration.

    The model is any `nn.Module` with `forward(input_ids[B, T]) -> logits[B, T, V]` (agentrl's
    `CausalLM`); if it has `save_pretrained(dir)`, `save` also exports it there so the checkpoint
    directory can be served and evaluated directly.
    """

    def __init__(self, model: nn.Module, config: LearnerConfig | None = None, *, pad_id: int = 0) -> None:
        self.model = model
        self.config = config or LearnerConfig()
        self.pad_id = pad_id
        self.version = 0
        self.step = 0
        c = self.config
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=c.lr,
            betas=c.betas,
            weight_decay=c.weight_decay,
        )
        self.reference: nn.Module | None = None
        if c.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)

    # ------------------------------------------------------------------ training

    def train_step(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """One policy update on `groups`; returns scalar metrics. Bumps `version` by one."""
        started = time.perf_counter()
        c = self.config
        samples = build_samples(
            groups,
            c.advantage,
            c.credit,
            gamma=c.gamma,
            turn_group_weight=c.turn_group_weight,
            turn_state=c.turn_state,
        )
        if not samples:
            raise InvalidArgumentError(
                "train_step got no trajectory with sampled tokens; the buffer should drop such groups"
            )
        self.model.train()
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = self.current_lr()
        if c.minibatches > 1 and c.loss in losses.LOSSES_NEEDING_PROXIMAL:
            self._compute_proximal(samples)
        chunks = [samples[i :: c.minibatches] for i in range(min(c.minibatches, len(samples)))]
        totals: dict[str, float] = {}
        padded = micro_batches = 0
        for chunk in chunks:
            self.optimizer.zero_grad(set_to_none=True)
            weights = aggregation_weights(chunk, c.aggregation)
            plan = plan_micro_batches(
                [len(s.token_ids) for s in chunk], c.micro_batch_tokens, c.grad_accumulation
            )
            chunk_metrics: dict[str, float] = {}
            for indices in plan:
                batch = collate([chunk[i] for i in indices], [weights[i] for i in indices], self.pad_id)
                padded += batch.input_ids.numel()
                micro_batches += 1
                for key, value in self._accumulate(batch).items():
                    chunk_metrics[key] = chunk_metrics.get(key, 0.0) + value
            params = [p for p in self.model.parameters() if p.requires_grad]
            max_norm = c.max_grad_norm if c.max_grad_norm is not None else math.inf
            chunk_metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            self.optimizer.step()
            for key, value in chunk_metrics.items():
                totals[key] = totals.get(key, 0.0) + value / len(chunks)
        self.optimizer.zero_grad(set_to_none=True)
        for sample in samples:
            sample.proximal_logprobs = None
        self.version += 1
        self.step += 1
        seconds = time.perf_counter() - started
        tokens = sum(s.num_loss_tokens for s in samples)
        return {
            **totals,
            "tokens": float(tokens),
            "padded_tokens": float(padded),
            "sequences": float(len(samples)),
            "micro_batches": float(micro_batches),
            "advantage_abs_mean": float(np.mean([s.advantage_abs_mean for s in samples])),
            "train_seconds": seconds,
            "train_tokens_per_s": sum(len(s.token_ids) for s in samples) / max(seconds, 1e-9),
            "version": float(self.version),
            "lr": self.optimizer.param_groups[0]["lr"],
        }

    def current_lr(self) -> float:
        """The learning rate of the next train step (`self.step` steps done so far)."""
        c = self.config
        if c.warmup_steps == 0:
            return c.lr
        return c.lr * min(1.0, (self.step + 1) / c.warmup_steps)

    def _accumulate(self, batch: MicroBatch) -> dict[str, float]:
        """Forward, loss and backward of one micro-batch; returns its (weighted) metric shares."""
        c = self.config
        logits = self.model(batch.input_ids)
        selected = logits[batch.rows, batch.cols].float()  # [N, V]: only positions predicting loss tokens
        log_norm = torch.logsumexp(selected, dim=-1)
        logp = selected.gather(1, batch.targets[:, None]).squeeze(1) - log_norm
        loss, metrics = self._policy_loss(logp, batch)
        metrics = {"pg_loss": loss.detach(), **metrics}

        # Entropy of the full next-token distribution: with grad only when it is in the loss.
        with torch.set_grad_enabled(c.entropy_coef > 0):
            source = selected if c.entropy_coef > 0 else selected.detach()
            norm = log_norm if c.entropy_coef > 0 else log_norm.detach()
            entropy = norm - (torch.softmax(source, dim=-1) * source).sum(-1)
            entropy_loss, entropy_metrics = losses.entropy_bonus(entropy, batch.weights)
        metrics.update(entropy_metrics)
        if c.entropy_coef > 0:
            loss = loss + c.entropy_coef * entropy_loss

        if self.reference is not None:
            with torch.no_grad():
                ref_selected = self.reference(batch.input_ids)[batch.rows, batch.cols].float()
                ref_logp = ref_selected.gather(1, batch.targets[:, None]).squeeze(1) - torch.logsumexp(
                    ref_selected, dim=-1
                )
            kl_loss, kl_metrics = losses.kl_k3(logp, ref_logp, batch.weights)
            loss = loss + c.kl_coef * kl_loss
            metrics.update(kl_metrics)

        loss.backward()
        metrics["loss"] = loss.detach()
        return {key: float(value) for key, value in metrics.items()}

    def _policy_loss(self, logp: Tensor, batch: MicroBatch) -> tuple[Tensor, losses.Metrics]:
        c = self.config
        behav, adv, w = batch.behav_logprobs, batch.advantages, batch.weights
        if c.loss == "ppo_clip":
            return losses.ppo_clip_loss(
                logp, behav, adv, w, eps_lo=c.clip_eps, eps_hi=c.clip_eps_hi, dual_clip_c=c.dual_clip_c
            )
        if c.loss in losses.LOSSES_NEEDING_PROXIMAL:
            old = batch.proximal_logprobs if batch.proximal_logprobs is not None else logp.detach()
            if c.loss == "tis":
                return losses.tis_loss(
                    logp, old, behav, adv, w, eps_lo=c.clip_eps, eps_hi=c.clip_eps_hi, cap=c.tis_cap
                )
            return losses.decoupled_ppo_loss(
                logp,
                old,
                behav,
                adv,
                w,
                eps_lo=c.clip_eps,
                eps_hi=c.clip_eps_hi,
                behav_cap=c.behav_cap,
                reject=c.behav_reject,
            )
        if c.loss == "cispo":
            return losses.cispo_loss(logp, behav, adv, w, eps_hi=c.clip_eps_hi)
        if c.loss == "topr":
            return losses.topr_loss(logp, behav, adv, batch.rewards, w)
        if c.loss == "gspo":
            return losses.gspo_loss(
                logp, behav, adv, batch.seq_ids, w, eps_lo=c.gspo_eps, eps_hi=c.gspo_eps_hi
            )
        raise InvalidArgumentError(f"Unknown loss {c.loss!r}")

    @torch.no_grad()
    def _compute_proximal(self, samples: list[Sample]) -> None:
        """Log-probs of every loss token under the current weights, held fixed for all minibatches."""
        plan = plan_micro_batches([len(s.token_ids) for s in samples], self.config.micro_batch_tokens)
        for indices in plan:
            chunk = [samples[i] for i in indices]
            batch = collate(chunk, [0.0] * len(chunk), self.pad_id)
            selected = self.model(batch.input_ids)[batch.rows, batch.cols].float()
            logp = selected.gather(1, batch.targets[:, None]).squeeze(1) - torch.logsumexp(selected, dim=-1)
            for row, sample in enumerate(chunk):
                sample.proximal_logprobs = logp[batch.rows == row].clone()

    # ------------------------------------------------------------------ weights and checkpoints

    def state_dict(self) -> dict[str, Tensor]:
        """The model weights, detached, to push to the policy server with `version`."""
        return {name: tensor.detach() for name, tensor in self.model.state_dict().items()}

    def save(self, directory: str | Path) -> Path:
        """Write weights, optimizer, counters, config and RNG states; atomic per file.

        The learner state is written to a temporary file and renamed, so a run killed mid-save
        keeps its previous checkpoint file intact.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        export = getattr(self.model, "save_pretrained", None)
        if callable(export):
            export(directory)
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "reference": self.reference.state_dict() if self.reference is not None else None,
            "version": self.version,
            "step": self.step,
            "config": self.config.model_dump(mode="json"),
            "rng": _rng_state(),
        }
        path = directory / STATE_FILE
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        return path

    def load(self, directory: str | Path) -> None:
        """Restore what `save` wrote, into this learner's model and optimizer."""
        path = Path(directory) / STATE_FILE
        if not path.exists():
            raise AgentRLError(f"No learner checkpoint at {path}")
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state["reference"] is not None:
            if self.reference is None:
                self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.reference.load_state_dict(state["reference"])
        self.version = int(state["version"])
        self.step = int(state["step"])
        _set_rng_state(state["rng"])


def _rng_state() -> dict[str, Any]:
    """Torch, Python and NumPy global RNG states in types `torch.load(weights_only=True)` accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached],
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
