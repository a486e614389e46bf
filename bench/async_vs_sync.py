"""Sync vs async training on the same budget: wall-clock to the same success rate, and final success.

    python bench/async_vs_sync.py [--config examples/guess_number.yaml] [--steps 30] [--out runs/bench]

Runs the same config three times from the same warm-started model (built once and shared):
`--mode sync` (max_staleness 0), async with max_staleness 1, and async with max_staleness 2.
Each run does the same number of optimizer steps on the same number of groups per step.

- "time to target": the first wall-clock second at which the moving average (over 5 steps) of
  the training-batch success rate reaches the target: the common starting level plus 80% of the
  smallest gain any run made by its end (so every run reaches it, and reaching it means having
  learned, not starting there). Wall-clock is training time only (server start, warm start and
  evaluations excluded, and identical across modes anyway).
- "final success": success on the held-out evaluation seeds after the last step, with the
  config's evaluation sampling (`sampling.eval_temperature`).

Printed side by side, with each async mode as a ratio to sync.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from agentrl.config import load_config
from agentrl.metrics import read_metrics
from agentrl.trainer.loop import RunPaths, TrainingRun, prepare_model

WINDOW = 5


def smoothed(records: list[dict]) -> list[tuple[float, float]]:
    """(wall_time, moving-average success) per training step."""
    steps = [r for r in records if "success_rate" in r and "learner/loss" in r]
    out = []
    for i, record in enumerate(steps):
        window = [s["success_rate"] for s in steps[max(0, i - WINDOW + 1) : i + 1]]
        out.append((record["wall_time"], sum(window) / len(window)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="examples/guess_number.yaml")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: config)")
    parser.add_argument("--out", default="runs/bench_async_vs_sync")
    args = parser.parse_args()

    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    base = load_config(args.config, {"out": str(root / "shared")})
    start_dir = prepare_model(base, RunPaths(root / "shared"))  # one warm start for all runs

    modes = {"sync": ("sync", 0), "async-1": ("async", 1), "async-2": ("async", 2)}
    results = {}
    for name, (mode, staleness) in modes.items():
        overrides = {
            "out": str(root / name),
            "mode": mode,
            "buffer.max_staleness": staleness,
            "model.path": str(start_dir),
            "sft.episodes": 0,
            "schedule.eval_every": 0,  # evaluate only before and after, outside the timed steps
        }
        if args.steps:
            overrides["schedule.steps"] = args.steps
        config = load_config(args.config, overrides)
        print(f"== {name}: mode={mode} max_staleness={config.effective_max_staleness}", flush=True)
        result = TrainingRun(config).run()
        curve = smoothed(read_metrics(root / name / "metrics.jsonl"))
        results[name] = (result, curve)
        print(
            f"   {result.steps} steps in {result.wall_time:.0f}s; held-out success "
            f"{result.warm_start_success:.1%} -> {result.final_success:.1%}",
            flush=True,
        )

    start = min(curve[0][1] for _, curve in results.values())
    target = start + 0.8 * min(curve[-1][1] - start for _, curve in results.values())
    print(f"\ntarget: moving-average training success >= {target:.1%} (start {start:.1%})")
    print(
        f"{'mode':<9} {'steps':>5} {'wall s':>7} {'to target s':>11} {'speedup':>8} "
        f"{'final':>7} {'vs sync':>8}"
    )
    sync_result, sync_curve = results["sync"]
    sync_time = next(t for t, s in sync_curve if s >= target)
    for name, (result, curve) in results.items():
        reach = next(t for t, s in curve if s >= target)
        speedup = sync_time / reach if reach > 0 else float("inf")
        delta = 100 * ((result.final_success or 0) - (sync_result.final_success or 0))
        print(
            f"{name:<9} {result.steps:>5} {result.wall_time:>7.0f} {reach:>11.0f} {speedup:>7.2f}x "
            f"{result.final_success:>7.1%} {delta:>+7.1f}pt"
        )


if __name__ == "__main__":
    main()
