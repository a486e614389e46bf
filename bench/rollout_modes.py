"""Rollout and training schedules side by side on one modelled engine: the papers' speedups, reproduced.

    python bench/rollout_modes.py [--quick] [--profile bench/profiles/h100-7b-assumed.json]
                                  [--out runs/rollout_modes] [--steps 20] [--envs 256]

MODELLED, not measured: the engine is `LatencyEngine` (step times from `--profile`; the default
profile's numbers are assumptions for a 7B model on one H100, stated in the file), the trainer is
`SimulatedLearner` (step time from the profile's `trainer` section) and the envs are `LatencyEnv`
(latency, turns and lengths drawn from the distributions below). Everything else is the real
code: `EnvManager` (rollout="batch", "rounds" or "async", redundancy, tail batching),
`StalenessBuffer` (max_staleness, tail batching), `EnginePolicy` and the training loop's order
(batch -> step -> weight update -> version). It all runs on a virtual clock
(`agentrl.sim.clock`): time is what the models say, so 8192 envs on 2 shared cores give the
figures an idle machine would; the CPU cost of the manager and buffer themselves counts as zero.

Workloads (group size 8; samples per step = envs, so every mode trains on the same batch):
  agentic  multi-turn: turns lognormal(median 5, sigma 0.5, max 30), env step latency
           lognormal(median 2 s, sigma 1, max 120 s), response lognormal(150 tok, sigma 0.8,
           max 2048), observations lognormal(150 tok, sigma 0.5), first prompt 400 tokens
  agentic-rare   the same with tool calls mostly fast: 0.3 s, 5% of them 30 s
  rlvr     single turn: response lognormal(1000 tok, sigma 0.9, max 16384), verifier latency
           lognormal(median 1 s, sigma 0.8, max 30 s), prompt 300 tokens
  rlvr-prompt    the same with the length set mostly by the prompt: each task draws a factor
           lognormal(1, sigma 0.8, max 16) that all its samples (and re-rolls) share, times a
           per-sample lognormal(1000 tok, sigma 0.4): the same total spread, hard prompts long

Modes (rows), every one a full loop of `--steps` optimizer steps at equal samples per step:
  (a) sync           rollout="batch" (lockstep turns / batch dispatch) + sync training
  (b) env-async      rollout="async" (each env on its own clock) + sync training
  (c) +redundant     (b) with 2 extra episodes per group of 8, the first 8 kept
  (d) queue          RLVR: rollout="async" groups queued one by one vs (a)'s batch dispatch
  (e) +async-train-k (b)/(c)/(d) with max_staleness k = 1, 2, 4 (envs in flight up to
                     (k + 1) x batch, as the admission rule allows); and k = 8 with at most 1.25
                     batches in flight (the in-flight cap apart from the bound, as AReaL's
                     max_concurrent_rollouts; env.concurrency in a training config)
  (f) tail-batching  rollout-side tail batching (RollPacker), synchronous training: rollout in
                     rounds, one per step, each episode on its own clock inside its round
                     (rollout="rounds"); a short round launches eta = 1.25 times the prompts and
                     the responses per prompt (25% more groups, 2 more episodes per group of 8),
                     keeps the first 8 responses of the first groups to complete, and re-rolls the
                     cut-off groups together in a long round that speculates on nothing
                     (env.speculative_groups + env.redundancy). Compared with (a), and with (c),
                     which launches the same extra responses but defers no prompt

Columns, every rate over the steady window (from the end of step `--warmup` to the end of the
last step, so a pipeline's start-up and the rollouts still in flight at the end count against no
mode): trajectories trained per second (= steps/hour x samples per step / 3600), the engine's
busy fraction, the never-idle bound in trajectories/s (episodes finished in the window over the
work they needed, done back to back at the largest batch the profile allows: their prompt and
observation tokens prefilled once x prefill cost + their sampled tokens / saturated decode tokens
per second), util = throughput over that bound, which is "full" (that work over the elapsed
time: 1 = never idle, always a full batch, nothing recomputed or thrown away) x "kept" (trained
over finished episodes: below 1 when groups are dropped as stale), the trained groups' staleness
(mean/max), and the ratio to (a); the CSV adds `wasted_frac` (engine work no finished episode
needed). After the tables, one verdict per target of the issue: which rows meet it, or by how
much each falls short, and why.

Writes OUT/results.csv, OUT/throughput_vs_envs.png and OUT/throughput_vs_staleness.png
(`--tail-sweep`: OUT/rlvr_tail_sweep.csv and .png; `--tail-grid`: OUT/tail_grid.csv, (f) over
eta on prompts x responses; `--in-flight-sweep`: OUT/in_flight_sweep.csv, the in-flight cap x
max_staleness; `--repeat N`: the headline rows over N seeds, mean and sd).
`--quick` runs the headline rows only at 256 envs, 12 steps (under two minutes) and prints the
agentic and RLVR ratios on its last line.
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

import numpy as np
from agentrl_trainers.buffer import StalenessBuffer
from agentrl_trainers.sim_trainer import SimulatedLearner, TrainerProfile

from agentrl.generation import SamplingParams
from agentrl.rollout.engine_policy import EnginePolicy
from agentrl.rollout.manager import EnvManager
from agentrl.serving.latency_engine import LatencyEngine, LatencyProfile
from agentrl.sim.clock import run_virtual
from agentrl.sim.distributions import Constant, Distribution, LogNormal, RareSlow
from agentrl.sim.env import LatencyEnv, word_ids
from agentrl.trajectory import Trajectory

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
    # each task's response-length factor, shared by all its samples (None: lengths per request)
    prompt_factor: Distribution | None = None


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
# RLVR with the length set by the prompt: the same total spread as `rlvr` (sigma sqrt(0.8^2 +
# 0.4^2) = 0.89 vs 0.9), four fifths of its variance between prompts: some prompts are hard and
# every sample of them runs long, the case tail batching is built for.
RLVR_PROMPT = replace(
    RLVR,
    name="rlvr-prompt",
    response_tokens=LogNormal(1000, 0.4, cap=16384, floor=1),
    prompt_factor=LogNormal(1.0, 0.8, cap=16.0),
)
WORKLOADS = {w.name: w for w in (AGENTIC, AGENTIC_RARE, RLVR, RLVR_PROMPT)}


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
    tail_extra: float = 0.0  # rollout-side tail batching: extra groups per batch, share of a step
    # episodes in flight at most, in batches (a step's episodes); None: as many as admission allows,
    # (max_staleness + 1) batches. AReaL's two knobs: staleness bounds the oldest data trained,
    # this bounds how much is in flight (and so the mean staleness and each episode's share).
    in_flight: float | None = None


SYNC = Mode("(a) sync", rollout="batch")
# AReaL's two knobs apart: a loose staleness bound for the stragglers, a tight cap on what is in flight
CAPPED = Mode("(e) env-async +async-train-8, 1.25 batches in flight", max_staleness=8, in_flight=1.25)
CAPPED_QUEUE = replace(CAPPED, label=CAPPED.label.replace("env-async", "queue"))  # the same, RLVR's name
# RollPacker's eta = 1.25 on prompts (extra groups) and on responses per prompt (2 per group of 8)
TAIL = Mode("(f) rounds +tail-batching eta 1.25", rollout="rounds", redundancy=2, tail_extra=0.25)


def modes_for(workload: Workload, staleness: tuple[int, ...]) -> list[Mode]:
    """The rows for one workload (see the module docstring)."""
    if workload.turns == Constant(1):
        rows = [replace(SYNC, label="(a) sync, batch dispatch"), Mode("(d) queue scheduling")]
        rows += [Mode("(c) queue +redundant", redundancy=2)]
        rows += [Mode(f"(e) queue +async-train-{k}", max_staleness=k) for k in staleness]
        rows += [
            Mode(f"(e) queue +redundant +async-train-{k}", redundancy=2, max_staleness=k) for k in staleness
        ]
        rows += [CAPPED_QUEUE, TAIL]
        return rows
    rows = [SYNC, Mode("(b) env-async"), Mode("(c) env-async +redundant", redundancy=2)]
    rows += [Mode(f"(e) env-async +async-train-{k}", max_staleness=k) for k in staleness]
    rows += [
        Mode(f"(e) env-async +redundant +async-train-{k}", redundancy=2, max_staleness=k) for k in staleness
    ]
    rows += [CAPPED, TAIL]
    return rows


@dataclass(frozen=True)
class Mark:
    """Cumulative counters at the end of an optimizer step (or at the start, step 0)."""

    time: float
    trained: int  # trajectories trained so far
    finished: int  # episodes the envs ended (terminated/truncated), trained or not
    needed_prefill: int  # tokens the finished episodes needed prefilled (each once)
    needed_decode: int  # tokens the finished episodes sampled
    prefilled: int  # engine counters: what it did, recomputation and cancelled requests included
    generated: int
    decode_tokens: int
    decode_context: int
    engine_busy_s: float
    trainer_busy_s: float
    staleness: tuple[int, ...] = ()  # of each group trained at this step (trainer version - oldest token)


@dataclass
class Result:
    """One run. Rates are taken over the steady window: from the end of step `warmup` to the end
    of the last step, so the start-up of a pipeline (and, for async, the rollouts still in flight
    when the run stops) does not count against any mode."""

    workload: str
    mode: Mode
    envs: int
    steps: int
    warmup: int
    marks: list[Mark]
    engine_profile: LatencyProfile
    wall_s: float

    @property
    def _window(self) -> tuple[Mark, Mark]:
        return self.marks[self.warmup], self.marks[-1]

    @property
    def seconds(self) -> float:
        first, last = self._window
        return last.time - first.time

    @property
    def run_seconds(self) -> float:
        return self.marks[-1].time

    @property
    def traj_per_s(self) -> float:
        """Trajectories trained per second in the steady window."""
        first, last = self._window
        return (last.trained - first.trained) / self.seconds

    @property
    def run_traj_per_s(self) -> float:
        """The same over the whole run, start-up included."""
        return self.marks[-1].trained / self.run_seconds

    @property
    def steps_per_hour(self) -> float:
        return 3600 * (self.steps - self.warmup) / self.seconds

    @property
    def engine_busy(self) -> float:
        first, last = self._window
        return (last.engine_busy_s - first.engine_busy_s) / self.seconds

    @property
    def trainer_busy(self) -> float:
        first, last = self._window
        return (last.trainer_busy_s - first.trainer_busy_s) / self.seconds

    def _work_s(self, prefilled: int, sampled: int) -> float:
        """Seconds of engine work at the largest batch the profile allows: prefill tokens x
        prefill cost + sampled tokens / saturated decode tokens per second at the window's mean
        context."""
        first, last = self._window
        profile = self.engine_profile
        decoded = last.decode_tokens - first.decode_tokens
        mean_context = (last.decode_context - first.decode_context) / max(decoded, 1)
        decode_rate = profile.saturated_tokens_per_s(mean_context)
        return prefilled * profile.prefill_per_token_s + sampled / decode_rate

    @property
    def engine_work_s(self) -> float:
        """The work the window's finished episodes needed, at full batch: their prompt and
        observation tokens prefilled once, their sampled tokens. What else the engine did
        (recomputing a preempted or evicted context, the tokens of cancelled or cut-off
        episodes) is not in it, so it counts against utilisation, not in the bound."""
        first, last = self._window
        return self._work_s(
            last.needed_prefill - first.needed_prefill, last.needed_decode - first.needed_decode
        )

    @property
    def wasted_frac(self) -> float:
        """Share of the engine's work, at full batch, that no finished episode needed."""
        first, last = self._window
        spent = self._work_s(last.prefilled - first.prefilled, last.generated - first.generated)
        return max(0.0, 1 - self.engine_work_s / max(spent, 1e-9))

    @property
    def ideal_traj_per_s(self) -> float:
        """The never-idle bound: episodes the window finished over the work they needed at full
        batch, i.e. the trajectories/s of an engine that is never idle, always runs a full batch
        and does nothing else."""
        first, last = self._window
        return (last.finished - first.finished) / max(self.engine_work_s, 1e-9)

    @property
    def util(self) -> float:
        """Throughput as a fraction of the never-idle bound (trained over finished x full-batch work
        over elapsed time): below 1 for idle engine time, batches below full, and finished
        episodes that were never trained (stale drops, groups still waiting)."""
        return self.traj_per_s / self.ideal_traj_per_s

    @property
    def kept_frac(self) -> float:
        """Trained over finished episodes in the window: below 1 when finished groups are dropped
        (stale past max_staleness) or still wait in the buffer."""
        first, last = self._window
        return (last.trained - first.trained) / max(last.finished - first.finished, 1)

    @property
    def full_batch_frac(self) -> float:
        """The window's engine work at full batch over its elapsed time (util = this x kept_frac)."""
        return self.engine_work_s / self.seconds

    @property
    def _trained_staleness(self) -> list[int]:
        """Staleness of each group trained in the window (0 = on-policy)."""
        return [s for m in self.marks[self.warmup + 1 :] for s in m.staleness]

    @property
    def staleness_mean(self) -> float:
        trained = self._trained_staleness
        return sum(trained) / max(len(trained), 1)

    @property
    def staleness_max(self) -> int:
        return max(self._trained_staleness, default=0)

    @property
    def rollout_s_per_step(self) -> float:
        """Seconds per step the trainer was not training (waiting for rollouts, weight sync)."""
        return (1 - self.trainer_busy) * self.seconds / (self.steps - self.warmup)

    @property
    def train_s_per_step(self) -> float:
        return self.trainer_busy * self.seconds / (self.steps - self.warmup)


async def run_loop(
    workload: Workload,
    mode: Mode,
    envs: int,
    steps: int,
    engine_profile: LatencyProfile,
    trainer: TrainerProfile,
    warmup: int,
    seed: int = 0,
) -> Result:
    """One training run: the real manager and buffer, the modelled engine, envs and learner.
    `seed` picks the random draws (response lengths, env latencies, turns); 0 is the tables'."""
    loop = asyncio.get_running_loop()
    engine = LatencyEngine(
        engine_profile,
        response_tokens=workload.response_tokens,
        eos_token_id=2,
        token_pool=range(3, 4003),
        prompt_factor=workload.prompt_factor,
        seed=seed,
    )
    await engine.start()
    policy = EnginePolicy(engine, word_ids, sampling=SamplingParams(max_tokens=workload.max_tokens))
    groups_per_step = max(1, envs // workload.group_size)
    width = workload.group_size + mode.redundancy
    speculative = max(1, round(mode.tail_extra * groups_per_step)) if mode.tail_extra else 0
    env_seeds = itertools.count(seed * 1_000_000)

    def make_env() -> LatencyEnv:
        return LatencyEnv(
            step_latency=workload.step_latency,
            turns=workload.turns,
            observation_tokens=workload.observation_tokens,
            prompt_tokens=workload.prompt_tokens,
            task_prompts=workload.prompt_factor is not None,
            seed=next(env_seeds),
        )

    buffer = StalenessBuffer(
        groups_per_step, mode.max_staleness, dynamic_filter=False, speculative_groups=speculative
    )
    needed = [0, 0]  # tokens the finished episodes needed: prefilled once, sampled

    def count_needed(trajectory: Trajectory) -> None:
        if trajectory.stop_reason.finished:
            turns = trajectory.turns
            # each turn prefills its new tokens, and the previous turn's last sampled token
            needed[0] += sum(len(t.prompt_token_ids) for t in turns) + max(len(turns) - 1, 0)
            needed[1] += sum(len(t.action_token_ids) for t in turns)

    manager = EnvManager(
        make_env,
        policy,
        group_size=workload.group_size,
        redundancy=mode.redundancy,
        max_concurrency=round(
            width
            * (groups_per_step + speculative)
            * (mode.max_staleness + 1 if mode.in_flight is None else mode.in_flight)
        ),
        max_turns=workload.max_turns,
        rollout=mode.rollout,  # type: ignore[arg-type]
        batch_groups=groups_per_step,
        speculative_groups=speculative,
        on_trajectory=count_needed,
    )
    learner = SimulatedLearner(trainer)

    async def produce() -> None:
        async for group in manager.stream(buffer.admitted(itertools.count())):
            await buffer.put(group)

    def mark(staleness: tuple[int, ...] = ()) -> Mark:
        stats = engine.stats
        return Mark(
            loop.time() - started,
            trained,
            manager.stats.finished,
            needed[0],
            needed[1],
            stats.prefilled_tokens,
            stats.generated_tokens,
            stats.decode_tokens,
            stats.decode_context_tokens,
            stats.busy_s,
            learner.busy_s,
            staleness,
        )

    wall = time.perf_counter()
    started = loop.time()
    producer = asyncio.create_task(produce())
    trained = 0
    marks = [mark()]
    try:
        for _ in range(steps):
            groups = await buffer.get_batch(groups_per_step, learner.version)
            trained += sum(len(g.trajectories) for g in groups)
            staleness = tuple(learner.version - (g.oldest_version or 0) for g in groups)
            await learner.train_step(groups)
            await engine.update_weights(None, learner.version)
            await buffer.set_version(learner.version)
            marks.append(mark(staleness))
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        await buffer.close()
        await manager.aclose()
        await engine.stop()
    return Result(
        workload=workload.name,
        mode=mode,
        envs=envs,
        steps=steps,
        warmup=warmup,
        marks=marks,
        engine_profile=engine_profile,
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
    "tail_extra",
    "in_flight_batches",
    "steps",
    "warmup_steps",
    "modelled_seconds",
    "traj_per_s",
    "run_traj_per_s",
    "steps_per_hour",
    "engine_busy_frac",
    "trainer_busy_frac",
    "ideal_traj_per_s",
    "engine_util",
    "full_batch_frac",
    "kept_frac",
    "wasted_frac",
    "staleness_mean",
    "staleness_max",
    "ratio_vs_a",
    "wall_s",
]


def repeat(
    seeds: int, envs: int, steps: int, warmup: int, engine_profile: LatencyProfile, trainer: TrainerProfile
) -> list[str]:
    """The headline rows over `seeds` random draws: how far a ratio moves with the draws alone."""
    lines = [
        f"\n== the headline rows over {seeds} seeds (MODELLED, {envs} envs, {steps} steps): mean, sd, range"
    ]
    print(lines[0])
    for name in ("agentic", "rlvr"):
        workload = WORKLOADS[name]
        rows = [Mode("(e) async-train-2", max_staleness=2), CAPPED]
        ratios: dict[str, list[float]] = {m.label: [] for m in rows}
        utils: dict[str, list[float]] = {m.label: [] for m in rows}
        for seed in range(seeds):
            base = simulate(workload, SYNC, envs, steps, engine_profile, trainer, warmup, seed)
            for m in rows:
                r = simulate(workload, m, envs, steps, engine_profile, trainer, warmup, seed)
                ratios[m.label].append(r.traj_per_s / base.traj_per_s)
                utils[m.label].append(r.util)
        for label in ratios:
            x, u = np.array(ratios[label]), np.array(utils[label])
            lines.append(
                f"{name} {label}: {x.mean():.2f}x sd {x.std(ddof=1):.2f} ({x.min():.2f}-{x.max():.2f}); "
                f"util {u.mean():.1%} sd {u.std(ddof=1):.1%} ({u.min():.1%}-{u.max():.1%})"
            )
            print(lines[-1])
    return lines


def write_csv(path: Path, rows: list[dict[str, Any]], extra_fields: tuple[str, ...] = ()) -> None:
    """Result rows (FIELDS, then `extra_fields`) as a CSV file."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*FIELDS, *extra_fields])
        writer.writeheader()
        writer.writerows(rows)


def row(result: Result, baseline: Result | None) -> dict[str, Any]:
    m = result.mode
    return {
        "workload": result.workload,
        "mode": m.label,
        "envs": result.envs,
        "max_staleness": m.max_staleness,
        "redundancy": m.redundancy,
        "tail_extra": m.tail_extra,
        "in_flight_batches": m.in_flight if m.in_flight is not None else m.max_staleness + 1,
        "steps": result.steps,
        "warmup_steps": result.warmup,
        "modelled_seconds": round(result.run_seconds, 1),
        "traj_per_s": round(result.traj_per_s, 3),
        "run_traj_per_s": round(result.run_traj_per_s, 3),
        "steps_per_hour": round(result.steps_per_hour, 1),
        "engine_busy_frac": round(result.engine_busy, 3),
        "trainer_busy_frac": round(result.trainer_busy, 3),
        "ideal_traj_per_s": round(result.ideal_traj_per_s, 3),
        "engine_util": round(result.util, 3),
        "full_batch_frac": round(result.full_batch_frac, 3),
        "kept_frac": round(result.kept_frac, 3),
        "wasted_frac": round(result.wasted_frac, 3),
        "staleness_mean": round(result.staleness_mean, 2),
        "staleness_max": result.staleness_max,
        "ratio_vs_a": round(result.traj_per_s / baseline.traj_per_s, 3) if baseline else "",
        "wall_s": round(result.wall_s, 1),
    }


def print_table(title: str, results: list[Result]) -> None:
    first = results[0]
    print(
        f"\n== {title} (MODELLED: {first.envs} envs = samples per step, {first.steps} steps, rates over "
        f"steps {first.warmup + 1}-{first.steps})"
    )
    head = ("traj/s", "steps/h", "busy", "trainer", "bound", "util", "=full", "x kept", "stale", "vs (a)")
    print(f"{'mode':<52} " + " ".join(f"{h:>8}" for h in head))
    for r in results:
        stale = f"{r.staleness_mean:.1f}/{r.staleness_max}"
        print(
            f"{r.mode.label:<52} {r.traj_per_s:>8.2f} {r.steps_per_hour:>8.1f} {r.engine_busy:>8.0%} "
            f"{r.trainer_busy:>8.0%} {r.ideal_traj_per_s:>8.2f} {r.util:>8.1%} {r.full_batch_frac:>8.1%} "
            f"{r.kept_frac:>8.1%} {stale:>8} {r.traj_per_s / first.traj_per_s:>7.2f}x"
        )


# The issue's targets (the papers' figures): see docs/performance.md, "Targets".
AGENTIC_TARGET = 2.72  # ROLL Flash, agentic: env-level async vs the synchronous baseline
UTIL_TARGET = 0.90  # ... with the engine at >= 90% of the never-idle bound
RLVR_TARGET = 2.24  # ROLL Flash, RLVR: queue scheduling + async vs the synchronous baseline
LOOP_TARGET = 2.0  # async training >= 2x sync in optimizer steps/h at equal samples per step
TAIL_TARGET = 2.03  # RollPacker: tail batching (with its other parts) vs veRL, the low end of 2.03-2.56x


def _find(results: list[Result], prefix: str, staleness: int, redundancy: int = 0) -> Result | None:
    return next(
        (
            r
            for r in results
            if r.mode.label.startswith(prefix)
            and r.mode.max_staleness == staleness
            and r.mode.redundancy == redundancy
            and not r.mode.tail_extra
        ),
        None,
    )


def _short(value: float, target: float) -> str:
    return "meets it" if value >= target else f"short by {1 - value / target:.1%}"


def _target_lines(
    title: str, base: Result, rows: list[Result], ratio_target: float, util_target: float | None = None
) -> list[str]:
    """The verdict on one speedup target (and utilisation target, if any) over `rows` vs `base`."""
    with_util = util_target is not None
    met = [
        r
        for r in rows
        if r.traj_per_s / base.traj_per_s >= ratio_target and (util_target is None or r.util >= util_target)
    ]
    desc = ", ".join(
        f"{r.mode.label} {r.traj_per_s / base.traj_per_s:.2f}x" + (f" at {r.util:.1%}" if with_util else "")
        for r in met
    )
    lines = [f"target {title}: " + (f"MET by {desc}" if met else "NOT MET")]
    for r in rows:
        if r not in met:
            ratio = r.traj_per_s / base.traj_per_s
            util = f"util {r.util:.1%}" + (
                f" ({_short(r.util, util_target)})" if util_target is not None else ""
            )
            lines.append(f"    {r.mode.label}: {ratio:.2f}x ({_short(ratio, ratio_target)}), {util}")
    return lines


def verdicts(tables: dict[str, list[Result]]) -> list[str]:
    """One line per target: which rows meet it, or by how much the closest falls short, and why."""
    lines = []
    if "agentic" in tables:
        results = tables["agentic"]
        rows = [r for r in results[1:] if r.mode.rollout == "async"]
        title = f"agentic (env-level async >= {AGENTIC_TARGET}x sync, util >= {UTIL_TARGET:.0%})"
        lines += _target_lines(title, results[0], rows, AGENTIC_TARGET, UTIL_TARGET)
    for name in ("rlvr", "rlvr-prompt"):
        if name not in tables:
            continue
        results = tables[name]
        base = results[0]
        rows = [r for r in results[1:] if r.mode.rollout == "async" and r.mode.max_staleness > 0]
        lines += _target_lines(
            f"RLVR, {name} (queue scheduling + async >= {RLVR_TARGET}x sync)", base, rows, RLVR_TARGET
        )
        lines.append(
            f"    why: sync batch dispatch runs at {base.util:.1%} of its never-idle bound "
            f"({base.ideal_traj_per_s:.2f} traj/s), so a mode at 100% of that bound is at most "
            f"{1 / base.util:.2f}x; (e)'s ratio = its util / sync's util x the ratio of the two bounds"
        )
    for name, results in tables.items():
        tail = next((r for r in results if r.mode.tail_extra), None)
        if tail is None:
            continue
        ratio = tail.traj_per_s / results[0].traj_per_s
        lines.append(
            f"(f) {name}: tail batching ({tail.mode.tail_extra:.0%} extra groups, "
            f"{tail.mode.redundancy} extra responses per group, long rounds) vs (a), both sync: "
            f"{results[0].traj_per_s:.2f} -> {tail.traj_per_s:.2f} traj/s = {ratio:.2f}x "
            f"(RollPacker {TAIL_TARGET}-2.56x: {_short(ratio, TAIL_TARGET)}), util {results[0].util:.1%} "
            f"-> {tail.util:.1%}"
        )
        same_responses = next(
            (
                r
                for r in results
                if r.mode.redundancy == tail.mode.redundancy
                and not r.mode.max_staleness
                and not r.mode.tail_extra
            ),
            None,
        )
        if same_responses is not None:
            lines.append(
                f"    the prompt part alone: vs {same_responses.mode.label} (the same extra responses, no "
                f"prompt deferred, no long round) {tail.traj_per_s / same_responses.traj_per_s:.2f}x"
            )
    for name, prefix in (("agentic", "(b)"), ("rlvr", "(d)")):
        results = tables.get(name, [])
        sync, rollout_only, full = results[:1], _find(results, prefix, 0), _find(results, "(e)", 2)
        if not sync or rollout_only is None or full is None:
            continue
        system = full.steps_per_hour / sync[0].steps_per_hour
        isolated = full.steps_per_hour / rollout_only.steps_per_hour
        rollout_s, train_s = rollout_only.rollout_s_per_step, rollout_only.train_s_per_step
        overlap = (rollout_s + train_s) / max(rollout_s, train_s)
        lines.append(
            f"target full loop, {name} (async >= {LOOP_TARGET:.0f}x sync, optimizer steps/h, equal "
            "samples/step): "
            f"system (a) -> (e)-2: {sync[0].steps_per_hour:.1f} -> {full.steps_per_hour:.1f} steps/h = "
            f"{system:.2f}x ({_short(system, LOOP_TARGET)}); training only, {prefix} -> (e)-2 on the same "
            f"rollout: {rollout_only.steps_per_hour:.1f} -> {full.steps_per_hour:.1f} = {isolated:.2f}x "
            f"({_short(isolated, LOOP_TARGET)})"
        )
        lines.append(
            f"    pure-overlap bound of the training-only comparison: (R + T) / max(R, T) with {prefix}'s "
            f"R = {rollout_s:.1f} s rollout wait and T = {train_s:.1f} s training per step = {overlap:.2f}x "
            f"(never above 2x); measured {isolated:.2f}x: the rest is the batch barrier async training "
            f"also removes (the next step's rollouts start before this step's stragglers end)"
        )
        capped = next((r for r in results if r.mode.in_flight is not None), None)
        if capped is not None:
            system = capped.steps_per_hour / sync[0].steps_per_hour
            isolated = capped.steps_per_hour / rollout_only.steps_per_hour
            lines.append(
                f"    with {capped.mode.label}: system {system:.2f}x ({_short(system, LOOP_TARGET)}), "
                f"training only {isolated:.2f}x ({_short(isolated, LOOP_TARGET)})"
            )
    return lines


def _uncapped(r: dict[str, Any]) -> bool:
    """A row with as many episodes in flight as admission allows (max_staleness + 1 batches)."""
    allowed = int(r["max_staleness"]) + 1
    return float(r.get("in_flight_batches") or allowed) == allowed


def plot(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Throughput vs envs (the sweep's rows) and vs max_staleness (the agentic and RLVR tables'
    async rows without redundancy, tail batching or in-flight cap), from result rows (or a
    results.csv)."""
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
            and float(r.get("tail_extra") or 0) == 0
            and _uncapped(r)
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


TAIL_SWEEP_MODES = (
    replace(SYNC, label="(a) sync, batch dispatch"),
    Mode("(e) queue +async-train-2", max_staleness=2),
    Mode("(e) queue +redundant +async-train-2", redundancy=2, max_staleness=2),
)


def tail_sweep(
    sigmas: list[float],
    sizes: list[int],
    steps: int,
    warmup: int,
    engine_profile: LatencyProfile,
    trainer: TrainerProfile,
    token_scale: float,
) -> list[dict[str, Any]]:
    """RLVR's ratio to (a) as the response-length tail (lognormal sigma) and the batch change:
    what bounds it is how much of its never-idle bound the sync baseline reaches."""
    rows = []
    print(
        f"\n== RLVR vs response-length tail and envs (MODELLED, {steps} steps, rates over "
        f"{warmup + 1}-{steps})"
    )
    for sigma in sigmas:
        tokens = RLVR.response_tokens
        assert isinstance(tokens, LogNormal)
        workload = scale_tokens(replace(RLVR, response_tokens=replace(tokens, sigma=sigma)), token_scale)
        for n in sizes:
            results = [
                simulate(workload, m, n, steps, engine_profile, trainer, warmup) for m in TAIL_SWEEP_MODES
            ]
            base = results[0]
            for r in results:
                rows.append(row(r, base) | {"response_sigma": sigma})
            print(
                f"sigma {sigma:.1f} {n:>5} envs: sync {base.traj_per_s:.2f} traj/s at {base.util:.1%} of its "
                "bound; "
                + "; ".join(
                    f"{r.mode.label} {r.traj_per_s / base.traj_per_s:.2f}x at {r.util:.1%}"
                    for r in results[1:]
                )
            )
    return rows


def in_flight_sweep(
    caps: list[float],
    staleness: list[int],
    envs: int,
    steps: int,
    warmup: int,
    engine_profile: LatencyProfile,
    trainer: TrainerProfile,
    token_scale: float,
) -> list[dict[str, Any]]:
    """Async training with the in-flight cap apart from the staleness bound (agentic and RLVR):
    the cap sets how many episodes share the engine (so how long each takes, and the mean
    staleness), the bound only which stragglers are still kept."""
    rows = []
    print(
        f"\n== in-flight cap x max_staleness (MODELLED, {envs} envs, {steps} steps): "
        "ratio to (a), util, staleness mean/max"
    )
    for name in ("agentic", "rlvr"):
        workload = scale_tokens(WORKLOADS[name], token_scale)
        base = simulate(workload, SYNC, envs, steps, engine_profile, trainer, warmup)
        for k in staleness:
            cells = []
            for cap in caps:
                mode = Mode(f"(e) async-train-{k}, {cap:g} batches in flight", max_staleness=k, in_flight=cap)
                r = simulate(workload, mode, envs, steps, engine_profile, trainer, warmup)
                rows.append(row(r, base))
                cells.append(
                    f"{cap:g}: {r.traj_per_s / base.traj_per_s:.2f}x {r.util:.1%} "
                    f"stale {r.staleness_mean:.1f}/{r.staleness_max}"
                )
            print(f"{name} max_staleness {k}: " + "; ".join(cells))
    return rows


TAIL_GRID_PROMPTS = (1.0, 1.03, 1.0625, 1.125, 1.25, 1.5)  # 1.0: no prompt deferred, no long round
TAIL_GRID_RESPONSES = (1.0, 1.25, 1.5)


def tail_grid(
    names: list[str],
    envs: int,
    steps: int,
    warmup: int,
    engine_profile: LatencyProfile,
    trainer: TrainerProfile,
    token_scale: float,
) -> list[dict[str, Any]]:
    """(f) over RollPacker's over-provisioning: eta on prompts (extra groups per short round) x
    eta on responses (extra episodes per group), each vs (a). The eta_prompts = 1 column defers
    nothing, so the grid separates what deferring prompts to long rounds buys from what racing
    extra responses buys."""
    rows = []
    print(f"\n== (f) tail batching over eta (MODELLED, {envs} envs, {steps} steps): ratio to (a) sync")
    for name in names:
        workload = scale_tokens(WORKLOADS[name], token_scale)
        base = simulate(workload, SYNC, envs, steps, engine_profile, trainer, warmup)
        print(f"{name}: eta responses " + " ".join(f"{r:>6}" for r in TAIL_GRID_RESPONSES))
        for eta_p in TAIL_GRID_PROMPTS:
            cells = []
            for eta_r in TAIL_GRID_RESPONSES:
                mode = Mode(
                    f"(f) rounds, eta prompts {eta_p:g} responses {eta_r:g}",
                    rollout="rounds",
                    redundancy=round((eta_r - 1) * workload.group_size),
                    tail_extra=eta_p - 1,
                )
                r = simulate(workload, mode, envs, steps, engine_profile, trainer, warmup)
                rows.append(row(r, base) | {"eta_prompts": eta_p, "eta_responses": eta_r})
                cells.append(f"{r.traj_per_s / base.traj_per_s:5.2f}x")
            print(f"  eta prompts {eta_p:<6g}  " + " ".join(cells))
    return rows


def plot_tail_sweep(out: Path, rows: list[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (mode, envs), points in sorted(
        _series(rows, ("mode", "envs"), "response_sigma", "ratio_vs_a").items()
    ):
        if mode.startswith("(a)"):
            continue
        style = "-" if "redundant" not in mode else "--"
        left.plot(*zip(*points, strict=True), style, marker="o", label=f"{mode}, {envs} envs")
    left.axhline(RLVR_TARGET, color="grey", lw=0.8, ls=":", label=f"ROLL Flash {RLVR_TARGET}x")
    left.set_xlabel("response-length lognormal sigma (median 1000 tokens)")
    left.set_ylabel("traj/s over (a) sync")
    left.set_title("RLVR ratio to sync (MODELLED)")
    for (mode, envs), points in sorted(
        _series(rows, ("mode", "envs"), "response_sigma", "engine_util").items()
    ):
        if mode.startswith("(a)") or mode == "(e) queue +async-train-2":
            right.plot(*zip(*points, strict=True), marker="o", label=f"{mode}, {envs} envs")
    right.set_xlabel("response-length lognormal sigma")
    right.set_ylabel("fraction of the never-idle bound")
    right.set_title("engine utilisation (MODELLED)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "rlvr_tail_sweep.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _series(
    rows: list[dict[str, Any]], keys: tuple[str, ...], x: str, y: str
) -> dict[tuple[Any, ...], list[tuple[float, float]]]:
    out: dict[tuple[Any, ...], list[tuple[float, float]]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append((float(r[x]), float(r[y])))
    return {k: sorted(v) for k, v in out.items()}


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # tables appear as each finishes, also in a log file
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="headline rows only, 256 envs, < 2 min")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--out", type=Path, default=Path("runs/rollout_modes"))
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    parser.add_argument(
        "--warmup", type=int, default=4, help="steps left out of the rates (pipeline start-up)"
    )
    parser.add_argument("--envs", type=int, default=256, help="envs (= samples per step) of the mode tables")
    parser.add_argument(
        "--sweep", default="64,256,1024,4096,8192", help="env counts of the throughput plot ('' = none)"
    )
    parser.add_argument(
        "--token-scale", type=float, default=1.0, help="scale every token count (0.1 fits the CPU tiny model)"
    )
    parser.add_argument(
        "--tables", default="agentic,agentic-rare,rlvr,rlvr-prompt", help="workloads of the mode tables"
    )
    parser.add_argument(
        "--sweep-steps", type=int, default=6, help="optimizer steps per point of the env sweep"
    )
    parser.add_argument("--sweep-modes", default="a,e", help="modes of the env sweep: a, b and/or e")
    parser.add_argument(
        "--tail-sweep",
        default="",
        help="RLVR response-length sigmas to sweep, e.g. 0.5,0.7,0.9,1.1,1.3 (OUT/rlvr_tail_sweep.csv, .png)",
    )
    parser.add_argument("--tail-sweep-envs", default="64,256,1024", help="env counts of the tail sweep")
    parser.add_argument(
        "--tail-grid",
        default="",
        help="workloads of the (f) grid over eta on prompts x responses, e.g. rlvr,rlvr-prompt",
    )
    parser.add_argument(
        "--in-flight-sweep",
        default="",
        help="in-flight caps (in batches) to sweep at --in-flight-staleness, e.g. 1,1.1,1.25,1.5,2,3",
    )
    parser.add_argument("--in-flight-staleness", default="2,4,8", help="max_staleness values of that sweep")
    parser.add_argument(
        "--no-chunked-prefill",
        action="store_true",
        help="run the profile's engine with prefills as steps of their own (the default before 2026-11-25)",
    )
    parser.add_argument(
        "--repeat", type=int, default=0, help="run the headline rows over this many seeds (mean, sd)"
    )
    parser.add_argument("--replot", nargs="+", type=Path, help="only redraw the plots from these results.csv")
    args = parser.parse_args()
    if args.replot:
        rows_in = [r for path in args.replot for r in csv.DictReader(path.open())]
        args.out.mkdir(parents=True, exist_ok=True)
        print(" ".join(map(str, plot(args.out, rows_in))))
        return

    engine_profile = LatencyProfile.load(args.profile)
    if args.no_chunked_prefill:
        engine_profile = replace(engine_profile, chunked_prefill=False)
    trainer = TrainerProfile.load(args.profile)
    print(f"engine:  {engine_profile.name} (chunked prefill: {engine_profile.chunked_prefill})")
    print(f"         {engine_profile.source}")
    print(f"trainer: {trainer.name}\n         {trainer.source}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    tables: dict[str, list[Result]] = {}

    def save() -> None:  # after every table and sweep point, so a long run's figures are never lost
        write_csv(args.out / "results.csv", rows)

    if args.quick:
        steps = args.steps or 12
        plan = {
            "agentic": [
                SYNC,
                Mode("(b) env-async"),
                Mode("(e) env-async +async-train-2", max_staleness=2),
                Mode("(e) env-async +async-train-4", max_staleness=4),
                Mode("(e) env-async +redundant +async-train-2", redundancy=2, max_staleness=2),
                CAPPED,
                TAIL,
            ],
            "rlvr": [
                replace(SYNC, label="(a) sync, batch dispatch"),
                Mode("(d) queue scheduling"),
                Mode("(e) queue +async-train-2", max_staleness=2),
                Mode("(e) queue +redundant +async-train-2", redundancy=2, max_staleness=2),
                CAPPED_QUEUE,
                TAIL,
            ],
        }
    else:
        steps = args.steps or 20
        names = [n for n in args.tables.split(",") if n]
        plan = {name: modes_for(WORKLOADS[name], (1, 2, 4)) for name in names}
    warmup = min(args.warmup, steps - 1)  # at least one step left in the rates' window
    workloads = {name: scale_tokens(w, args.token_scale) for name, w in WORKLOADS.items()}
    for name, modes in plan.items():
        results = [
            simulate(workloads[name], m, args.envs, steps, engine_profile, trainer, warmup) for m in modes
        ]
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
                    min(args.warmup, args.sweep_steps // 2),
                )
                print(
                    f"{label:<30} {n:>5} envs: {r.traj_per_s:8.2f} traj/s, engine busy {r.engine_busy:.0%}, "
                    f"utilisation {r.util:.0%} of the never-idle bound ({r.wall_s:.0f}s to simulate)"
                )
                rows.append(row(r, None))
                save()
    if not args.quick and args.tail_sweep:
        sweep_rows = tail_sweep(
            [float(v) for v in args.tail_sweep.split(",")],
            [int(n) for n in args.tail_sweep_envs.split(",")],
            steps,
            warmup,
            engine_profile,
            trainer,
            args.token_scale,
        )
        write_csv(args.out / "rlvr_tail_sweep.csv", sweep_rows, ("response_sigma",))
        print(f"wrote {args.out / 'rlvr_tail_sweep.csv'} {plot_tail_sweep(args.out, sweep_rows)}")
    if not args.quick and args.repeat > 1:
        repeat(args.repeat, args.envs, steps, warmup, engine_profile, trainer)
    if not args.quick and args.in_flight_sweep:
        cap_rows = in_flight_sweep(
            [float(v) for v in args.in_flight_sweep.split(",")],
            [int(v) for v in args.in_flight_staleness.split(",")],
            args.envs,
            steps,
            warmup,
            engine_profile,
            trainer,
            args.token_scale,
        )
        write_csv(args.out / "in_flight_sweep.csv", cap_rows)
        print(f"wrote {args.out / 'in_flight_sweep.csv'}")
    if not args.quick and args.tail_grid:
        grid_rows = tail_grid(
            [n for n in args.tail_grid.split(",") if n],
            args.envs,
            steps,
            warmup,
            engine_profile,
            trainer,
            args.token_scale,
        )
        write_csv(args.out / "tail_grid.csv", grid_rows, ("eta_prompts", "eta_responses"))
        print(f"wrote {args.out / 'tail_grid.csv'}")
    paths = plot(args.out, rows)
    print(f"\nwrote {args.out / 'results.csv'} {' '.join(map(str, paths))}")

    def headline(name: str, mode: Mode) -> str:
        results = tables[name]
        r = next(
            r
            for r in results
            if r.mode.max_staleness == mode.max_staleness
            and r.mode.in_flight == mode.in_flight
            and not r.mode.redundancy
            and not r.mode.tail_extra
        )
        return f"{r.traj_per_s / results[0].traj_per_s:.2f}x sync at {r.util:.1%} of the never-idle bound"

    print()
    for line in verdicts(tables):
        print(line)
    if "agentic" in tables and "rlvr" in tables:
        two = Mode("", max_staleness=2)
        print(
            f"MODELLED: agentic env-async+async-train-2 {headline('agentic', two)}, async-train-8 with "
            f"{CAPPED.in_flight:g} batches in flight {headline('agentic', CAPPED)} (paper 2.72x at 90%); "
            f"RLVR queue+async-train-2 {headline('rlvr', two)}, -8 capped {headline('rlvr', CAPPED)} "
            "(paper 2.24x)"
        )


if __name__ == "__main__":
    main()
