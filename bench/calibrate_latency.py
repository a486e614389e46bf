"""Fit the latency model to a measured run of the embedded engine and the real learner, on this machine.

    python bench/calibrate_latency.py [--size tiny] [--out bench/profiles/cpu-tiny-measured.json]
                                      [--engine-threads 1] [--trainer-threads 2] [--quick]

Engine: builds a `--size` model, starts the real `TorchEngine` in this process and times every
decode step and prefill chunk its worker runs (the two methods are wrapped with a timer; nothing
else changes) while waves of requests run at batch sizes 1..64 and prompt lengths 16..1024. Then
least squares:

    decode step = decode_base_s + decode_per_seq_s * batch + decode_per_ctx_token_s * sum(context)
    prefill     = prefill_base_s + prefill_per_token_s * padded new tokens

Trainer: times `Learner.train_step` on synthetic groups of 1k..32k tokens and fits
`step_base_s + step_per_token_s * tokens`.

Writes a profile file (`engine` and `trainer` sections, loaded by `LatencyProfile.load` and
`TrainerProfile.load`) with the fit's error and the load average while measuring: the machine is
shared, so the figures are noisy, and the file says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from agentrl_trainers.config import LearnerConfig
from agentrl_trainers.learner import Learner

from agentrl.generation import SamplingParams
from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.engine import TorchEngine
from agentrl.serving.model import CausalLM
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup, Turn


def timed(samples: list[tuple[float, ...]], method, features):
    """Wrap an engine method so each call appends (features..., cpu seconds, wall seconds).

    CPU seconds are the worker thread's own (`time.thread_time`; with one torch thread all the
    work runs there): what the step costs, which other processes on a shared machine do not
    inflate. Wall seconds are what it took under the load of the moment.
    """

    def wrapper(*args):
        x = features(*args)
        cpu, wall = time.thread_time(), time.perf_counter()
        method(*args)
        samples.append((*x, time.thread_time() - cpu, time.perf_counter() - wall))

    return wrapper


async def measure_engine(model_dir: Path, quick: bool) -> tuple[list, list, int, int]:
    engine = TorchEngine.from_pretrained(model_dir, max_batch=256)
    decode: list[tuple[float, ...]] = []
    prefill: list[tuple[float, ...]] = []
    # decode features: batch, total context (tokens in cache before the step)
    engine._decode = timed(  # type: ignore[method-assign]
        decode, engine._decode, lambda: (len(engine._running), sum(r.cached for r in engine._running))
    )
    engine._prefill_chunk = timed(  # type: ignore[method-assign]
        prefill, engine._prefill_chunk, lambda a, b, width: ((b - a) * width,)
    )
    await engine.start()
    vocab = engine.cfg.vocab_size
    rng = np.random.default_rng(0)
    batches = (1, 8, 64) if quick else (1, 2, 4, 8, 16, 32, 64)
    prompts = (16, 256, 1024) if quick else (16, 64, 256, 512, 1024)
    params = SamplingParams(max_tokens=12 if quick else 32, temperature=1.0)
    for batch in batches:
        for length in prompts:
            jobs = [
                engine.generate(rng.integers(3, vocab, size=length).tolist(), params) for _ in range(batch)
            ]
            await asyncio.gather(*jobs)
    await engine.stop()
    return decode, prefill, engine.max_batch, engine.max_len


def fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Least squares with an intercept, coefficients clipped at 0; returns (coef, mean |rel error|)."""
    design = np.column_stack([np.ones(len(x)), x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    coef = np.clip(coef, 0.0, None)
    predicted = design @ coef
    return coef, float(np.mean(np.abs(predicted - y) / y))


def synthetic_groups(tokens: int, rows: int = 8) -> list[TrajectoryGroup]:
    """One group of `rows` single-turn trajectories with `tokens` tokens in all (half prompt)."""
    per = max(4, tokens // rows)
    trajectories = []
    for i in range(rows):
        prompt = [5 + (i + j) % 50 for j in range(per // 2)]
        action = [5 + (i * 3 + j) % 50 for j in range(per - per // 2)]
        turn = Turn("o", "a", 1.0 * (i % 2), {}, prompt, action, [-3.0] * len(action), [0] * len(action))
        trajectories.append(
            Trajectory(f"e{i}", "bench", "g", 0, turns=[turn], stop_reason=StopReason.TERMINATED)
        )
    return [TrajectoryGroup("g", 0, trajectories)]


def measure_trainer(model_dir: Path, quick: bool) -> list[tuple[float, float, float]]:
    """(tokens, process cpu seconds / torch threads, wall seconds) per `train_step`."""
    model = CausalLM.from_pretrained(model_dir)
    learner = Learner(model, LearnerConfig(micro_batch_tokens=4096))
    samples = []
    sizes = (512, 2048, 8192) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    learner.train_step(synthetic_groups(512))  # warm-up (allocations, first optimizer step)
    threads = torch.get_num_threads()
    for tokens in sizes:
        cpu, wall = time.process_time(), time.perf_counter()
        learner.train_step(synthetic_groups(tokens))
        samples.append((tokens, (time.process_time() - cpu) / threads, time.perf_counter() - wall))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="tiny")
    parser.add_argument(
        "--model", type=Path, default=None, help="an existing checkpoint (default: build --size)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/profiles/cpu-tiny-measured.json"))
    parser.add_argument("--engine-threads", type=int, default=1, help="torch threads timing the engine")
    parser.add_argument("--trainer-threads", type=int, default=1, help="torch threads timing the learner")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or Path(tmp) / "model"
        if args.model is None:
            init_checkpoint(model_dir, args.size)
        load_before = os.getloadavg()[0]
        torch.set_num_threads(args.engine_threads)
        decode, prefill, max_batch, max_len = asyncio.run(measure_engine(model_dir, args.quick))
        torch.set_num_threads(args.trainer_threads)
        trainer = measure_trainer(model_dir, args.quick)
        load_after = os.getloadavg()[0]

    d, p, t = np.array(decode), np.array(prefill), np.array(trainer)
    decode_coef, decode_err = fit(d[:, :2], d[:, 2])
    prefill_coef, prefill_err = fit(p[:, :1], p[:, 1])
    trainer_coef, trainer_err = fit(t[:, :1], t[:, 1])
    decode_slow = float(np.sum(d[:, 3]) / np.sum(d[:, 2]))  # wall over cpu: the load's slowdown
    trainer_slow = float(np.sum(t[:, 2]) / np.sum(t[:, 1]))
    where = f"{os.cpu_count()}-core shared machine, load average {load_before:.1f} -> {load_after:.1f}"
    engine_source = (
        f"measured: fitted to the worker thread's CPU time in {len(decode)} decode steps and "
        f"{len(prefill)} prefill chunks of the real TorchEngine on a {where}"
    )
    trainer_source = (
        f"measured: fitted to the process CPU time per thread of {len(trainer)} Learner.train_step "
        f"calls on a {where}"
    )
    profile = {
        "engine": {
            "name": f"TorchEngine {args.size} (CPU, {args.engine_threads} thread)",
            "source": engine_source,
            "decode_base_s": float(decode_coef[0]),
            "decode_per_seq_s": float(decode_coef[1]),
            "decode_per_ctx_token_s": float(decode_coef[2]),
            "prefill_base_s": float(prefill_coef[0]),
            "prefill_per_token_s": float(prefill_coef[1]),
            "kv_capacity_tokens": max_batch * max_len,
            "max_batch": max_batch,
            "max_len": max_len,
            "weight_sync_s": 0.0,
            "notes": (
                f"fit error (mean |relative|): decode {decode_err:.0%}, prefill {prefill_err:.0%}. "
                f"CPU time, not wall: under the load while measuring, wall-clock was {decode_slow:.2f}x "
                "the CPU time (wall_over_cpu; scale by it to predict a run under that load). The "
                "embedded engine grows its KV cache on demand, so its capacity is max_batch * max_len. "
                "Weight sync is not measured here (the training loop times it per step)."
            ),
            "wall_over_cpu": decode_slow,
        },
        "trainer": {
            "name": f"Learner {args.size} (CPU, {args.trainer_threads} thread)",
            "source": trainer_source,
            "step_base_s": float(trainer_coef[0]),
            "step_per_token_s": float(trainer_coef[1]),
            "notes": f"fit error (mean |relative|): {trainer_err:.0%}; wall was {trainer_slow:.2f}x CPU time",
            "wall_over_cpu": trainer_slow,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile, indent=2) + "\n")
    print(json.dumps(profile, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
