"""Sync vs async training on the same budget: wall-clock to the same success rate, and final success.

    python bench/async_vs_sync.py [--config examples/guess_number.yaml] [--steps 30] [--out runs/bench]
                                  [--env-step-latency SECONDS] [--sync-rollout batch]
                                  [--eval-every N] [--modes sync,async-1,async-2,async-8@80]

Runs the same config once per mode from the same warm-started model (built once and shared); by
default `--mode sync` (max_staleness 0), async with max_staleness 1, and async with max_staleness
2. `--modes` picks others: `async-K` is max_staleness K, `async-K@N` also caps the episodes in
flight at N (`env.concurrency`), the staleness bound and the in-flight cap set apart as
docs/performance.md ("Two knobs") recommends. Each run does the same number of optimizer steps
on the same number of groups per step.

- "train s": training seconds for the same number of steps, the sum of the step times (server
  start, warm start, evaluations and checkpoints excluded); "train x" is sync's over each run's.
  "wall s" is the run's wall-clock from its first rollout, evaluations and checkpoints included.
- "to target s": the first training second at which the moving average (over the last 10
  steps) of the training-batch success rate reaches the target: the common starting level (the
  first full window) plus 80% of the smallest gain any run made by its end, so every run reaches
  it. Noisy: a step's batch is only `groups_per_step` tasks, so read it beside "train x".
- "final success": success on the held-out evaluation seeds after the last step, with the
  config's evaluation sampling (`sampling.eval_temperature`).
- "busy cores": CPU time of trainer + policy server per second of training. Overlap cannot
  make a run faster than the cores sync leaves idle allow: sync at U of N busy cores can at best
  become N/U times faster (printed as the ceiling).

`--env-step-latency S` makes every env step first wait S seconds without using the CPU (an
`asyncio.sleep` in a subclass of the config's env, defined here and used only by this bench):
the shape of agentic envs whose steps wait on a sandbox, a browser or a remote API. The game
logic, the model and everything else are unchanged.

`--sync-rollout batch` runs the sync baseline with the synchronous batch-level rollout
(`env.rollout: batch`: each step's groups in lockstep turns), the baseline the papers compare
against; the default keeps env-level async rollout in every run, so only training overlap differs.

`--eval-every N` also evaluates on the held-out seeds every N steps and prints "held-out s": the
training seconds (sum of step times, evaluations excluded) at which each run's held-out success
first reached, after the warm start, the lowest final held-out success of all runs, so every run
reaches it. Async rollout keeps producing during an evaluation (within its staleness bound and
in-flight cap), a small head start the sync run does not get.

Printed side by side, with each async mode as a ratio to sync.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
from pathlib import Path
from typing import Any

from agentrl_trainers.config import load_config
from agentrl_trainers.loop import RunPaths, TrainingRun, prepare_model
from agentrl_trainers.metrics import read_metrics

import agentrl

WINDOW = 10


def smoothed(records: list[dict]) -> list[tuple[float, float]]:
    """(training seconds so far, moving-average success) per step, from the first full window on."""
    steps = [r for r in records if "success_rate" in r and "learner/loss" in r]
    trained = itertools.accumulate(s["step_seconds"] for s in steps)
    out = []
    for i, seconds in enumerate(trained):
        if i >= WINDOW - 1:
            window = [s["success_rate"] for s in steps[i - WINDOW + 1 : i + 1]]
            out.append((seconds, sum(window) / WINDOW))
    return out


def training_seconds(records: list[dict]) -> float:
    """The sum of the step times: training, without evaluations and checkpoints."""
    return sum(r["step_seconds"] for r in records if "step_seconds" in r)


def register_slow_env(env_id: str, latency: float) -> str:
    """Register a copy of `env_id` whose steps first wait `latency` seconds; return its id."""
    base = type(agentrl.make(env_id))

    async def astep(self: Any, action: str) -> Any:
        await asyncio.sleep(latency)
        return await base.astep(self, action)

    slow = type(f"Slow{base.__name__}", (base,), {"astep": astep})
    slow_id = f"bench/Slow{env_id.split('/')[-1]}"
    agentrl.register(slow_id, slow, override=True)
    return slow_id


def held_out_curve(records: list[dict]) -> list[tuple[float, float]]:
    """(training seconds so far, held-out success) at each evaluation; seconds sum step times only."""
    trained, curve = 0.0, []
    for record in records:
        if "step_seconds" in record:
            trained += record["step_seconds"]
        if "eval_success_rate" in record:
            curve.append((trained, record["eval_success_rate"]))
    return curve


def busy_cores(records: list[dict]) -> float:
    """Mean busy cores over the training steps, weighted by step time."""
    steps = [r for r in records if "cpu_busy_cores" in r]
    seconds = sum(r["step_seconds"] for r in steps)
    return sum(r["cpu_busy_cores"] * r["step_seconds"] for r in steps) / max(seconds, 1e-9)


def parse_mode(spec: str) -> tuple[str, int, int | None]:
    """`sync`, `async-K` or `async-K@N` -> (mode, max_staleness, env.concurrency or None)."""
    if spec == "sync":
        return "sync", 0, None
    name, _, cap = spec.partition("@")
    kind, _, staleness = name.partition("-")
    if kind != "async" or not staleness.isdigit() or int(staleness) < 1 or (cap and not cap.isdigit()):
        raise argparse.ArgumentTypeError(f"mode {spec!r}: expected sync, async-K or async-K@N (K >= 1)")
    return "async", int(staleness), int(cap) if cap else None


def trained_staleness(records: list[dict]) -> str:
    """Mean over steps of each batch's mean staleness, and the largest: how old the trained data was."""
    means = [r["buffer/batch_staleness_mean"] for r in records if "buffer/batch_staleness_mean" in r]
    peaks = [r["buffer/batch_staleness_max"] for r in records if "buffer/batch_staleness_max" in r]
    return f"{sum(means) / len(means):.2f}/{max(peaks):.0f}" if means else "-"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="examples/guess_number.yaml")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: config)")
    parser.add_argument("--out", default="runs/bench_async_vs_sync")
    parser.add_argument("--env-step-latency", type=float, default=0.0, help="seconds each env step waits")
    parser.add_argument("--sync-rollout", choices=("async", "batch"), default="async", help="sync's rollout")
    parser.add_argument(
        "--eval-every", type=int, default=0, help="held-out eval every N steps (0: ends only)"
    )
    parser.add_argument(
        "--modes",
        type=lambda text: {spec: parse_mode(spec) for spec in text.split(",")},
        default="sync,async-1,async-2",
        help="comma-separated: sync, async-K (max_staleness K), async-K@N (and env.concurrency N)",
    )
    args = parser.parse_args()
    if "sync" not in args.modes:
        parser.error("--modes must include sync: every ratio is to it")

    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    base = load_config(args.config, {"out": str(root / "shared")})
    start_dir = prepare_model(base, RunPaths(root / "shared"))  # one warm start for all runs

    slow_env_id = register_slow_env(base.env.id, args.env_step_latency) if args.env_step_latency > 0 else None
    results = {}
    held_out: dict[str, list[tuple[float, float]]] = {}
    for name, (mode, staleness, concurrency) in args.modes.items():
        overrides = {
            "out": str(root / name),
            "mode": mode,
            "buffer.max_staleness": staleness,
            "model.path": str(start_dir),
            "sft.episodes": 0,
            "schedule.eval_every": args.eval_every,
        }
        if name == "sync":
            overrides["env.rollout"] = args.sync_rollout
        if concurrency is not None:
            overrides["env.concurrency"] = concurrency
        if slow_env_id is not None:
            overrides["env.id"] = slow_env_id
        if args.steps:
            overrides["schedule.steps"] = args.steps
        config = load_config(args.config, overrides)
        print(
            f"== {name}: mode={mode} max_staleness={config.effective_max_staleness} "
            f"env.concurrency={config.env.concurrency}",
            flush=True,
        )
        result = TrainingRun(config).run()
        records = read_metrics(root / name / "metrics.jsonl")
        curve = smoothed(records)
        results[name] = (
            result,
            training_seconds(records),
            curve,
            busy_cores(records),
            trained_staleness(records),
        )
        held_out[name] = held_out_curve(records)
        print(
            f"   {result.steps} steps in {result.wall_time:.0f}s (evaluations included); held-out success "
            f"{result.warm_start_success:.1%} -> {result.final_success:.1%}",
            flush=True,
        )

    start = min(curve[0][1] for _, _, curve, _, _ in results.values())
    target = start + 0.8 * min(curve[-1][1] - start for _, _, curve, _, _ in results.values())
    print(f"\ntarget: moving-average training success >= {target:.1%} (start {start:.1%})")
    print(
        f"{'mode':<11} {'steps':>5} {'wall s':>7} {'train s':>7} {'train x':>7} {'to target s':>11} "
        f"{'speedup':>8} {'final':>7} {'vs sync':>8} {'busy cores':>10} {'stale mean/max':>14}"
    )
    sync_result, sync_trained, sync_curve, sync_busy, _ = results["sync"]
    sync_time = next(t for t, s in sync_curve if s >= target)
    for name, (result, trained, curve, busy, stale) in results.items():
        reach = next(t for t, s in curve if s >= target)
        speedup = sync_time / reach if reach > 0 else float("inf")
        delta = 100 * ((result.final_success or 0) - (sync_result.final_success or 0))
        print(
            f"{name:<11} {result.steps:>5} {result.wall_time:>7.0f} {trained:>7.0f} "
            f"{sync_trained / trained:>6.2f}x {reach:>11.0f} {speedup:>7.2f}x "
            f"{result.final_success:>7.1%} {delta:>+7.1f}pt {busy:>10.2f} {stale:>14}"
        )
    if args.eval_every:
        goal = min(curve[-1][1] for curve in held_out.values())
        print(f"\nheld-out target: success >= {goal:.1%} (the lowest final held-out success)")
        sync_reach = next(t for t, s in held_out["sync"] if t > 0 and s >= goal)
        for name, curve in held_out.items():
            reach = next(t for t, s in curve if t > 0 and s >= goal)
            points = " ".join(f"{s:.0%}@{t:.0f}s" for t, s in curve)
            speedup = sync_reach / max(reach, 1e-9)
            print(f"{name:<11} held-out s {reach:>6.0f}  speedup {speedup:.2f}x  [{points}]")
    cores = len(os.sched_getaffinity(0))
    print(
        f"\nsync kept {sync_busy:.2f} of {cores} cores busy: overlapping rollout and training can make "
        f"it at most {cores / sync_busy:.2f}x faster on this machine"
    )


if __name__ == "__main__":
    main()
