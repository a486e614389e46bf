"""Sync batch-level vs env-level async rollout with the REAL engine and a real suite env, beside the model.

    python bench/rollout_real.py [--env web/Shop-v0] [--envs 32] [--batches 2]
                                 [--step-latency lognormal:0.5,1,10] [--out runs/rollout_real]
                                 [--profile bench/profiles/cpu-tiny-measured.json]

MEASURED part: a real `agentrl serve` process (the embedded TorchEngine, a freshly built `tiny`
model, 1 torch thread), the real `PolicyClient` over HTTP, the real `EnvManager` and `web/Shop-v0`
(its steps are real HTTP requests to the shop app on loopback). Every env step also waits a
sample of `--step-latency` (an `asyncio.sleep`, no CPU): the shape of a browser or tool call
that takes a while. Mode (a) plays `--batches` batches of `--envs` episodes with rollout="batch";
mode (b) plays the same number of episodes with rollout="async" and `--envs` env slots. Rollout
only: no training (bench/async_vs_sync.py measures training). Printed: trajectories/s of each
and the ratio.

MODELLED part, for the same setting: the same two manager modes on the virtual clock with the
`LatencyEngine` (the profile fitted by bench/calibrate_latency.py on this machine) and a
`LatencyEnv` that resamples what the real run measured (turns per episode, env-step seconds,
response and observation token counts). The profile is CPU time; the real run is on a shared
machine, so the engine's times are scaled by the slowdown measured during the run (the server's
busy seconds over its process CPU seconds). The model plays as many episodes as the real run (a
longer run would spread the drain of async's last episodes thinner and flatter it), averaged over
`--model-repeats` seeds. Printed: predicted trajectories/s of each mode, the ratio, and the
prediction error against the measurement. Also printed for each measured mode: how busy the client
process's CPU was (env manager, envs, HTTP client, tokenizer: work the model does not price).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

import agentrl
from agentrl.generation import SamplingParams
from agentrl.rollout.client import PolicyClient
from agentrl.rollout.engine_policy import EnginePolicy
from agentrl.rollout.manager import EnvManager
from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.latency_engine import LatencyEngine, LatencyProfile
from agentrl.serving.process import ServerProcess
from agentrl.sim import distributions
from agentrl.sim.clock import run_virtual
from agentrl.sim.distributions import Distribution, Empirical
from agentrl.sim.env import LatencyEnv, word_ids
from agentrl.tokenizer import ChatTokenizer
from agentrl.trajectory import TrajectoryGroup

MODES = {"(a) sync batch": "batch", "(b) env-async": "async"}


def waiting_env(env_id: str, latency: Distribution, seed: int, env_kwargs: dict[str, Any]) -> Any:
    """A factory of `env_id` envs whose every step first waits a sample of `latency`."""
    base = type(agentrl.make(env_id, **env_kwargs))
    rng = random.Random(seed)

    async def astep(self: Any, action: str) -> Any:
        await asyncio.sleep(latency.sample(rng))
        return await base.astep(self, action)

    slow = type(f"Waiting{base.__name__}", (base,), {"astep": astep})
    return lambda: slow(**env_kwargs)


async def engine_stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{url}/metrics", timeout=30)).json()["engine"]


def bench_manager(
    make_env: Any, policy: Any, rollout: str, args: argparse.Namespace, **options: Any
) -> EnvManager:
    """The manager the real run and its prediction share: a sync batch is every env slot."""
    return EnvManager(
        make_env,
        policy,
        group_size=args.group_size,
        max_concurrency=args.envs,
        max_turns=args.max_turns,
        rollout=rollout,  # type: ignore[arg-type]
        batch_groups=args.envs // args.group_size,
        **options,
    )


async def measure(
    url: str, tokenizer: ChatTokenizer, make_env: Any, rollout: str, args: argparse.Namespace
) -> tuple[float, float, list[TrajectoryGroup]]:
    """Wall seconds, this (client) process's CPU seconds, and the groups of one measured run."""
    policy = PolicyClient(url, tokenizer, sampling=SamplingParams(max_tokens=args.max_tokens))
    groups_per_batch = args.envs // args.group_size
    manager = bench_manager(make_env, policy, rollout, args, step_timeout=120)
    started, cpu_started = time.perf_counter(), time.process_time()
    groups = await manager.run(range(groups_per_batch * args.batches))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    await manager.aclose()
    await policy.aclose()
    return seconds, cpu_seconds, groups


def workload_from(groups: list[TrajectoryGroup]) -> dict[str, list[float]]:
    trajectories = [t for g in groups for t in g.trajectories]
    turns = [t.turns for t in trajectories]
    return {
        "turns": [len(ts) for ts in turns],
        "env_seconds": [turn.env_seconds for ts in turns for turn in ts],
        "response_tokens": [len(turn.action_token_ids) for ts in turns for turn in ts],
        "first_prompt_tokens": [len(ts[0].prompt_token_ids) for ts in turns if ts],
        "observation_tokens": [len(turn.prompt_token_ids) for ts in turns for turn in ts[1:]],
    }


async def predict(
    profile: LatencyProfile,
    workload: dict[str, list[float]],
    rollout: str,
    args: argparse.Namespace,
    seed: int,
) -> float:
    """Modelled trajectories/s of one mode for the measured workload (virtual clock).

    The same number of episodes as the real run: an async run's throughput includes draining its
    last episodes, a cost a longer run would spread thinner (so it would flatter async).
    """
    engine = LatencyEngine(
        profile,
        response_tokens=Empirical(workload["response_tokens"]),
        eos_token_id=2,
        token_pool=range(3, 500),
        seed=seed,
    )
    await engine.start()
    policy = EnginePolicy(engine, word_ids, sampling=SamplingParams(max_tokens=args.max_tokens))
    seeds = iter(range(seed << 20, (seed + 1) << 20))

    def make_env() -> LatencyEnv:
        return LatencyEnv(
            step_latency=Empirical(workload["env_seconds"]),
            turns=Empirical(workload["turns"]),
            observation_tokens=Empirical(workload["observation_tokens"] or [1]),
            prompt_tokens=Empirical(workload["first_prompt_tokens"]),
            seed=next(seeds),
        )

    groups_per_batch = args.envs // args.group_size
    manager = bench_manager(make_env, policy, rollout, args)
    loop = asyncio.get_running_loop()
    started = loop.time()
    groups = await manager.run(range(groups_per_batch * args.batches))
    seconds = loop.time() - started
    await manager.aclose()
    await engine.stop()
    return sum(len(g.trajectories) for g in groups) / seconds


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--env", default="web/Shop-v0")
    parser.add_argument("--envs", type=int, default=32, help="env slots (= episodes per sync batch)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--step-latency", default="lognormal:0.5,1.0,10", help="extra wait per env step")
    parser.add_argument("--profile", type=Path, default=Path("bench/profiles/cpu-tiny-measured.json"))
    parser.add_argument("--model", type=Path, default=None, help="checkpoint to serve (default: build tiny)")
    parser.add_argument("--out", type=Path, default=Path("runs/rollout_real"))
    parser.add_argument("--model-repeats", type=int, default=8, help="model runs per mode (seeds), averaged")
    args = parser.parse_args()

    latency = distributions.parse(args.step_latency)
    env_kwargs = {"max_turns": args.max_turns, "max_observation_chars": 600}
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or init_checkpoint(Path(tmp) / "tiny", "tiny")
        tokenizer = ChatTokenizer(model)
        server = ServerProcess(model, threads=1, log_path=args.out / "server.log").start()
        try:
            measured: dict[str, float] = {}
            workloads: dict[str, dict[str, list[float]]] = {}
            slowdowns: dict[str, float] = {}
            for label, rollout in MODES.items():
                before, cpu_before = asyncio.run(engine_stats(server.url)), server.cpu_seconds() or 0.0
                make_env = waiting_env(args.env, latency, seed=1, env_kwargs=env_kwargs)
                seconds, client_cpu, groups = asyncio.run(
                    measure(server.url, tokenizer, make_env, rollout, args)
                )
                after, cpu_after = asyncio.run(engine_stats(server.url)), server.cpu_seconds() or 0.0
                trajectories = sum(len(g.trajectories) for g in groups)
                measured[label] = trajectories / seconds
                workloads[label] = workload_from(groups)
                slowdowns[label] = (after["busy_s"] - before["busy_s"]) / max(cpu_after - cpu_before, 1e-9)
                print(
                    f"MEASURED {label}: {trajectories} episodes in {seconds:.1f}s = "
                    f"{measured[label]:.3f} traj/s; "
                    f"engine busy {(after['busy_s'] - before['busy_s']) / seconds:.0%} of the time, "
                    f"wall/CPU of the server {slowdowns[label]:.2f}, "
                    f"client (env manager, envs, HTTP, tokenizer) CPU-busy {client_cpu / seconds:.0%}",
                    flush=True,
                )
        finally:
            server.stop()

    # One workload for the model: both modes' measured samples pooled (they are the same env and policy).
    pooled = {
        k: workloads["(a) sync batch"][k] + workloads["(b) env-async"][k] for k in workloads["(a) sync batch"]
    }
    cpu_profile = LatencyProfile.load(args.profile)
    slowdown = sum(slowdowns.values()) / len(slowdowns)

    def scaled(factor: float) -> LatencyProfile:
        fields = (
            "decode_base_s",
            "decode_per_seq_s",
            "decode_per_ctx_token_s",
            "prefill_base_s",
            "prefill_per_token_s",
        )
        return replace(cpu_profile, **{f: getattr(cpu_profile, f) * factor for f in fields})

    def averaged(profile: LatencyProfile, rollout: str) -> float:
        """Mean over `--model-repeats` seeds: the prediction's own sampling noise, made small."""
        runs = [
            run_virtual(predict(profile, pooled, rollout, args, seed)) for seed in range(args.model_repeats)
        ]
        return sum(runs) / len(runs)

    predicted = {label: averaged(scaled(slowdown), rollout) for label, rollout in MODES.items()}
    unscaled = {label: averaged(cpu_profile, rollout) for label, rollout in MODES.items()}
    a, b = MODES
    print(
        f"\n{args.env}, {args.envs} envs, group {args.group_size}, {args.batches} batches, "
        f"step wait {args.step_latency}"
    )
    print(f"{'mode':<16} {'measured':>9} {'model':>9} {'error':>7} {'model@idle':>10}")
    for label in MODES:
        error = predicted[label] / measured[label] - 1
        print(
            f"{label:<16} {measured[label]:>9.3f} {predicted[label]:>9.3f} {error:>+7.0%} "
            f"{unscaled[label]:>10.3f}"
        )
    print(
        f"ratio (b)/(a): measured {measured[b] / measured[a]:.2f}x, model {predicted[b] / predicted[a]:.2f}x "
        f"(engine times scaled by the measured load slowdown {slowdown:.2f}; at idle-machine CPU times the "
        f"model says {unscaled[b] / unscaled[a]:.2f}x)"
    )
    summary = {
        "env": args.env,
        "envs": args.envs,
        "group_size": args.group_size,
        "batches": args.batches,
        "step_latency": args.step_latency,
        "measured_traj_per_s": measured,
        "model_traj_per_s": predicted,
        "model_idle_traj_per_s": unscaled,
        "slowdown": slowdowns,
        "workload_means": {k: sum(v) / max(len(v), 1) for k, v in pooled.items()},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out / 'summary.json'}")


if __name__ == "__main__":
    main()
