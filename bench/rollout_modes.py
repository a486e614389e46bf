"""Rollout and training schedules side by side on one modelled engine: the papers' speedups, reproduced.

    python bench/rollout_modes.py [--quick] [--profile bench/profiles/h100-7b-assumed.json]
                                  [--out runs/rollout_modes] [--steps 6] [--envs 256]

MODELLED, not measured: the engine is `LatencyEngine` (step times from `--profile`; the default
profile's numbers are assumptions for a 7B model on one H100, stated in the file), the trainer is
`SimulatedLearner` (step time from the profile's `trainer` section) and the envs are `LatencyEnv`
(latency, turns and lengths drawn from the distributions below). Everything else is the real
code: `EnvManager` (rollout="batch" or "async", redundancy), `StalenessBuffer` (max_staleness,
tail batching), `EnginePolicy` and the training loop's order (batch -> step -> weight update ->
version). It all runs on a virtual clock (`agentrl.sim.clock`): time is what the models say, so
8192 envs on 2 shared cores give the figures an idle machine would; the CPU cost of the
manager and buffer themselves counts as zero.

Workloads (group size 8; samples per step = envs, so every mode trains on the same batch):
  agentic  multi-turn: turns lognormal(median 5, sigma 0.5, max 30), env step latency
           lognormal(median 2 s, sigma 1, max 120 s), response lognormal(150 tok, sigma 0.8,
           max 2048), observations lognormal(150 tok, sigma 0.5), first prompt 400 tokens
  agentic-rare   the same with tool calls mostly fast: 0.3 s, 5% of them 30 s
  rlvr     single turn: response lognormal(1000 tok, sigma 0.9, max 16384), verifier latency
           lognormal(median 1 s, sigma 0.8, max 30 s), prompt 300 tokens

Modes (rows), every one a full loop of `--steps` optimizer steps at equal samples per step:
  (a) sync           rollout="batch" (lockstep turns / batch dispatch) + sync training
  (b) env-async      rollout="async" (each env on its own clock) + sync training
  (c) +redundant     (b) with 2 extra episodes per group of 8, the first 8 kept
  (d) queue          RLVR: rollout="async" groups queued one by one vs (a)'s batch dispatch
  (e) +async-train-k (b)/(c)/(d) with max_staleness k = 1, 2, 4 (envs in flight up to
                     (k + 1) x batch, as the admission rule allows)
  (f) tail-batching  RLVR, queue + async training k=2, buffer tail batching on vs off

Columns: trajectories trained per second (= steps/hour x samples per step / 3600), the engine's
busy fraction, the never-idle bound in trajectories/s (finished episodes over the run's engine
work done back to back at the largest batch the profile allows: prefill tokens x prefill cost +
decode tokens / saturated decode tokens per second), the engine's utilisation against that
bound (that work over the elapsed time: 100% = never idle and always a full batch), and the
ratio to (a).

Writes OUT/results.csv, OUT/throughput_vs_envs.png and OUT/throughput_vs_staleness.png.
`--quick` runs the headline rows only at 256 envs (under two minutes) and prints the agentic and
RLVR ratios on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentrl_trainers.buffer import StalenessBuffer
from agentrl_trainers.sim_trainer import SimulatedLearner, TrainerProfile

from agentrl.generation import SamplingParams
from agentrl.rollout.engine_policy import EnginePolicy
from agentrl.rollout.manager import EnvManager
from agentrl.serving.latency_engine import LatencyEngine, LatencyProfile
from agentrl.sim.clock import run_virtual
from agentrl.sim.distributions import Constant, Distribution, LogNormal, RareSlow
from agentrl.sim.env import LatencyEnv, word_ids

DEFAULT_PROFILE = Path(__file__).parent / "profiles" / "h100-7b-assumed.json"


@dataclass(frozen=True)
class Workload:
    name: str
    turns: Distribution
    step_latency: Distribution
    response_tokens: Distribution
    prompt_tokens: Distribution
    observation_tokens: Distribution
    max_tokens: int
    max_turns: int
    group_size: int = 8


AGENTIC = Workload(
    "agentic",
    turns=LogNormal(5, 0.5, cap=30, floor=1),
    step_latency=LogNormal(2.0, 1.0, cap=120),
    response_tokens=LogNormal(150, 0.8, cap=2048, floor=1),
    prompt_tokens=Constant(400),
    observation_tokens=LogNormal(150, 0.5, cap=2000, floor=1),
    max_tokens=2048,
    max_turns=30,
)
AGENTIC_RARE = replace(AGENTIC, name="agentic-rare", step_latency=RareSlow(0.3, 30.0, 0.05))
RLVR = Workload(
    "rlvr",
    turns=Constant(1),
    step_latency=LogNormal(1.0, 0.8, cap=30),
    response_tokens=LogNormal(1000, 0.9, cap=16384, floor=1),
    prompt_tokens=Constant(300),
    observation_tokens=Constant(1),
    max_tokens=16384,
    max_turns=1,
)
WORKLOADS = {w.name: w for w in (AGENTIC, AGENTIC_RARE, RLVR)}


def _scale(dist: Distribution, factor: float) -> Distribution:
    if isinstance(dist, LogNormal):
        return replace(dist, median=dist.median * factor, cap=dist.cap * factor)
    if isinstance(dist, Constant):
        return Constant(max(1.0, dist.value * factor))
    raise TypeError(f"cannot scale {dist!r}")


def scale_tokens(workload: Workload, factor: float) -> Workload:
    """The same workload with every token count times `factor` (for a small model's context)."""
    if factor == 1:
        return workload
    return replace(
        workload,
        response_tokens=_scale(workload.response_tokens, factor),
        prompt_tokens=_scale(workload.prompt_tokens, factor),
        observation_tokens=_scale(workload.observation_tokens, factor),
        max_tokens=max(1, int(workload.max_tokens * factor)),
    )


@dataclass(frozen=True)
class Mode:
    label: str
    rollout: str = "async"
    redundancy: int = 0
    max_staleness: int = 0
    tail_batching: bool = False


SYNC = Mode("(a) sync", rollout="batch")


def modes_for(workload: Workload, staleness: tuple[int, ...]) -> list[Mode]:
    """The rows for one workload (see the module docstring)."""
    if workload.turns == Constant(1):
        rows = [replace(SYNC, label="(a) sync, batch dispatch"), Mode("(d) queue scheduling")]
        rows += [Mode("(c) queue +redundant", redundancy=2)]
        rows += [Mode(f"(e) queue +async-train-{k}", max_staleness=k) for k in staleness]
        rows += [
            Mode(f"(e) queue +redundant +async-train-{k}", redundancy=2, max_staleness=k) for k in staleness
        ]
        rows += [Mode("(f) queue +async-train-2 +tail-batching", max_staleness=2, tail_batching=True)]
        return rows
    rows = [SYNC, Mode("(b) env-async"), Mode("(c) env-async +redundant", redundancy=2)]
    rows += [Mode(f"(e) env-async +async-train-{k}", max_staleness=k) for k in staleness]
    rows += [
        Mode(f"(e) env-async +redundant +async-train-{k}", redundancy=2, max_staleness=k) for k in staleness
    ]
    return rows


@dataclass
class Result:
    workload: str
    mode: Mode
    envs: int
    steps: int
    seconds: float
    trajectories: int
    engine_busy: float
    trainer_busy: float
    ideal_traj_per_s: float
    engine_work_s: float  # the run's engine work at the largest batch the profile allows
    wall_s: float

    @property
    def traj_per_s(self) -> float:
        return self.trajectories / self.seconds

    @property
    def steps_per_hour(self) -> float:
        return 3600 * self.steps / self.seconds

    @property
    def util(self) -> float:
        """Engine time used at full-batch efficiency over elapsed time: 1.0 = never idle, full batches."""
        return self.engine_work_s / self.seconds


async def run_loop(
    workload: Workload,
    mode: Mode,
    envs: int,
    steps: int,
    engine_profile: LatencyProfile,
    trainer: TrainerProfile,
) -> Result:
    """One training run: the real manager and buffer, the modelled engine, envs and learner."""
    loop = asyncio.get_running_loop()
    engine = LatencyEngine(
        engine_profile, response_tokens=workload.response_tokens, eos_token_id=2, token_pool=range(3, 4003)
    )
    await engine.start()
    policy = EnginePolicy(engine, word_ids, sampling=SamplingParams(max_tokens=workload.max_tokens))
    groups_per_step = max(1, envs // workload.group_size)
    width = workload.group_size + mode.redundancy
    env_seeds = itertools.count()

    def make_env() -> LatencyEnv:
        return LatencyEnv(
            step_latency=workload.step_latency,
            turns=workload.turns,
            observation_tokens=workload.observation_tokens,
            prompt_tokens=workload.prompt_tokens,
            seed=next(env_seeds),
        )

    buffer = StalenessBuffer(
        groups_per_step, mode.max_staleness, dynamic_filter=False, tail_batching=mode.tail_batching
    )
    manager = EnvManager(
        make_env,
        policy,
        group_size=workload.group_size,
        redundancy=mode.redundancy,
        max_concurrency=width * groups_per_step * (mode.max_staleness + 1),
        max_turns=workload.max_turns,
        rollout=mode.rollout,  # type: ignore[arg-type]
        batch_groups=groups_per_step,
    )
    learner = SimulatedLearner(trainer)

    async def produce() -> None:
        async for group in manager.stream(buffer.admitted(itertools.count())):
            await buffer.put(group)

    wall = time.perf_counter()
    started = loop.time()
    producer = asyncio.create_task(produce())
    trained = 0
    try:
        for _ in range(steps):
            groups = await buffer.get_batch(groups_per_step, learner.version)
            trained += sum(len(g.trajectories) for g in groups)
            await learner.train_step(groups)
            await engine.update_weights(None, learner.version)
            await buffer.set_version(learner.version)
        seconds = loop.time() - started
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        await buffer.close()
        await manager.aclose()
        await engine.stop()
    stats = engine.stats
    mean_context = stats.decode_context_tokens / max(stats.decode_tokens, 1)
    engine_work = stats.prefilled_tokens * engine_profile.prefill_per_token_s + stats.generated_tokens / (
        engine_profile.saturated_tokens_per_s(mean_context)
    )
    finished = manager.stats.finished
    return Result(
        workload=workload.name,
        mode=mode,
        envs=envs,
        steps=steps,
        seconds=seconds,
        trajectories=trained,
        engine_busy=stats.busy_s / seconds,
        trainer_busy=learner.busy_s / seconds,
        ideal_traj_per_s=finished / max(engine_work, 1e-9),
        engine_work_s=engine_work,
        wall_s=time.perf_counter() - wall,
    )


def simulate(*args: Any) -> Result:
    return run_virtual(run_loop(*args))


FIELDS = [
    "workload",
    "mode",
    "envs",
    "max_staleness",
    "redundancy",
    "tail_batching",
    "steps",
    "modelled_seconds",
    "traj_per_s",
    "steps_per_hour",
    "engine_busy_frac",
    "trainer_busy_frac",
    "ideal_traj_per_s",
    "engine_util",
    "ratio_vs_a",
    "wall_s",
]


def row(result: Result, baseline: Result | None) -> dict[str, Any]:
    m = result.mode
    return {
        "workload": result.workload,
        "mode": m.label,
        "envs": result.envs,
        "max_staleness": m.max_staleness,
        "redundancy": m.redundancy,
        "tail_batching": m.tail_batching,
        "steps": result.steps,
        "modelled_seconds": round(result.seconds, 1),
        "traj_per_s": round(result.traj_per_s, 3),
        "steps_per_hour": round(result.steps_per_hour, 1),
        "engine_busy_frac": round(result.engine_busy, 3),
        "trainer_busy_frac": round(result.trainer_busy, 3),
        "ideal_traj_per_s": round(result.ideal_traj_per_s, 3),
        "engine_util": round(result.util, 3),
        "ratio_vs_a": round(result.traj_per_s / baseline.traj_per_s, 3) if baseline else "",
        "wall_s": round(result.wall_s, 1),
    }


def print_table(title: str, results: list[Result]) -> None:
    baseline = results[0]
    print(f"\n== {title} (MODELLED: {results[0].envs} envs = samples per step, {results[0].steps} steps)")
    head = ("traj/s", "steps/h", "busy", "trainer", "bound", "util", "vs (a)")
    print(f"{'mode':<44} " + " ".join(f"{h:>8}" for h in head))
    for r in results:
        print(
            f"{r.mode.label:<44} {r.traj_per_s:>8.2f} {r.steps_per_hour:>8.1f} {r.engine_busy:>8.0%} "
            f"{r.trainer_busy:>8.0%} {r.ideal_traj_per_s:>8.2f} {r.util:>8.0%} "
            f"{r.traj_per_s / baseline.traj_per_s:>7.2f}x"
        )


def plot(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Throughput vs envs (the sweep's rows) and vs max_staleness (the agentic and RLVR tables'
    async rows without redundancy or tail batching), from result rows (or a results.csv)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def curves(selected: list[dict[str, Any]], x: str) -> dict[str, list[tuple[float, float]]]:
        out: dict[str, list[tuple[float, float]]] = {}
        for r in selected:
            label = f"{r['workload']} {r['mode']}" if x == "envs" else str(r["workload"])
            out.setdefault(label, []).append((float(r[x]), float(r["traj_per_s"])))
        return {k: sorted(v) for k, v in out.items() if len(v) > 1}

    sweep = curves([r for r in rows if r["ratio_vs_a"] == ""], "envs")
    staleness = curves(
        [
            r
            for r in rows
            if r["ratio_vs_a"] != ""
            and r["workload"] in ("agentic", "rlvr")
            and str(r["mode"]).startswith(("(b)", "(d)", "(e)"))
            and int(r["redundancy"]) == 0
            and str(r["tail_batching"]) in ("False", "false")
        ],
        "max_staleness",
    )
    paths = []
    for name, data, xlabel, title, log in (
        ("throughput_vs_envs.png", sweep, "envs (= samples per step)", "throughput vs envs", True),
        (
            "throughput_vs_staleness.png",
            staleness,
            "max_staleness (0 = sync training)",
            "vs max_staleness",
            False,
        ),
    ):
        if not data:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for label, points in data.items():
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
        if log:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("trajectories trained / s")
        ax.set_title(f"{title} (MODELLED engine, envs and trainer)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # tables appear as each finishes, also in a log file
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="headline rows only, 256 envs, < 2 min")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--out", type=Path, default=Path("runs/rollout_modes"))
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    parser.add_argument("--envs", type=int, default=256, help="envs (= samples per step) of the mode tables")
    parser.add_argument(
        "--sweep", default="64,256,1024,4096,8192", help="env counts of the throughput plot ('' = none)"
    )
    parser.add_argument(
        "--token-scale", type=float, default=1.0, help="scale every token count (0.1 fits the CPU tiny model)"
    )
    parser.add_argument("--tables", default="agentic,agentic-rare,rlvr", help="workloads of the mode tables")
    parser.add_argument(
        "--sweep-steps", type=int, default=3, help="optimizer steps per point of the env sweep"
    )
    parser.add_argument("--sweep-modes", default="a,e", help="modes of the env sweep: a, b and/or e")
    parser.add_argument("--replot", nargs="+", type=Path, help="only redraw the plots from these results.csv")
    args = parser.parse_args()
    if args.replot:
        rows_in = [r for path in args.replot for r in csv.DictReader(path.open())]
        args.out.mkdir(parents=True, exist_ok=True)
        print(" ".join(map(str, plot(args.out, rows_in))))
        return

    engine_profile = LatencyProfile.load(args.profile)
    trainer = TrainerProfile.load(args.profile)
    print(f"engine:  {engine_profile.name}\n         {engine_profile.source}")
    print(f"trainer: {trainer.name}\n         {trainer.source}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    tables: dict[str, list[Result]] = {}

    def save() -> None:  # after every table and sweep point, so a long run's figures are never lost
        with (args.out / "results.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)

    if args.quick:
        steps = args.steps or 4
        plan = {
            "agentic": [SYNC, Mode("(e) env-async +async-train-2", max_staleness=2)],
            "rlvr": [
                replace(SYNC, label="(a) sync, batch dispatch"),
                Mode("(e) queue +async-train-2", max_staleness=2),
            ],
        }
    else:
        steps = args.steps or 6
        names = [n for n in args.tables.split(",") if n]
        plan = {name: modes_for(WORKLOADS[name], (1, 2, 4)) for name in names}
    workloads = {name: scale_tokens(w, args.token_scale) for name, w in WORKLOADS.items()}
    for name, modes in plan.items():
        results = [simulate(workloads[name], m, args.envs, steps, engine_profile, trainer) for m in modes]
        tables[name] = results
        print_table(name, results)
        rows.extend(row(r, results[0]) for r in results)
        save()

    if not args.quick and args.sweep:
        sizes = [int(n) for n in args.sweep.split(",")]
        print(f"\n== agentic throughput vs envs (MODELLED, {args.sweep_steps} steps each)")
        sweep_modes = {
            "a": ("(a) sync", SYNC),
            "b": ("(b) env-async", replace(SYNC, rollout="async")),
            "e": ("(e) env-async +async-train-2", replace(SYNC, rollout="async", max_staleness=2)),
        }
        for key in args.sweep_modes.split(","):
            label, mode = sweep_modes[key]
            for n in sizes:
                r = simulate(
                    workloads["agentic"],
                    replace(mode, label=label),
                    n,
                    args.sweep_steps,
                    engine_profile,
                    trainer,
                )
                print(
                    f"{label:<30} {n:>5} envs: {r.traj_per_s:8.2f} traj/s, engine busy {r.engine_busy:.0%}, "
                    f"utilisation {r.util:.0%} of the never-idle bound ({r.wall_s:.0f}s to simulate)"
                )
                rows.append(row(r, None))
                save()
    paths = plot(args.out, rows)
    print(f"\nwrote {args.out / 'results.csv'} {' '.join(map(str, paths))}")

    def headline(name: str) -> tuple[float, float]:
        results = tables[name]
        best = next(
            r
            for r in results
            if r.mode.max_staleness == 2 and r.mode.redundancy == 0 and not r.mode.tail_batching
        )
        return best.traj_per_s / results[0].traj_per_s, best.util

    if "agentic" in tables and "rlvr" in tables:
        agentic, agentic_util = headline("agentic")
        rlvr, rlvr_util = headline("rlvr")
        print(
            f"MODELLED: agentic env-async+async-train-2 {agentic:.2f}x sync (engine at "
            f"{agentic_util:.0%} of the never-idle bound; paper 2.72x); RLVR queue+async-train-2 "
            f"{rlvr:.2f}x sync ({rlvr_util:.0%}; paper 2.24x)"
        )


if __name__ == "__main__":
    main()
