"""Rollout env-steps/s on Ray env workers (1, 2, 4) beside the in-process EnvManager.

    python bench/ray_rollout.py                # FrozenLake, random policy, 2048 episodes at 1024 in flight
    python bench/ray_rollout.py --episodes 512 # quicker

What is measured: the same rollout (env, policy, seeds, concurrency) played by
- `in process`: one EnvManager in this process (with the GC setting `agentrl rollout` uses);
- `ray, W workers`: `RayRollout` with W env-worker actors sharing the same total concurrency, on a
  real two-node loopback cluster (`LoopbackCluster`: two sets of `ray start` processes).
Env-steps/s counts from the first task handed out to the last group received by the driver;
cluster start-up and actor creation are excluded (they are paid once per run). CPU µs/step is
the CPU time of every process doing the rollout (this driver, the env workers, the queue actor;
not Ray's own daemons) over the same interval, per env step: what a step costs, whatever the
wall clock says. Each line is the best of `--repeats` runs by env-steps/s; ratios are against
the in-process line (env-steps/s: higher is faster; CPU per step: higher is costlier).

How to read it on a small machine: every worker is a process competing for the same cores as
the driver and Ray's own daemons. On 2 cores a random policy on FrozenLake costs microseconds
per step, so the Ray lines are not a speedup from parallel hardware: CPU µs/step is what Ray
adds per step (serialising each finished group once, the queue round trips, the extra
processes), and env-steps/s on a machine shared with other jobs also moves with how much of
the contended cores several processes get compared with one. With as many free cores
as workers (or workers on other machines), each worker's event loop runs in parallel, and for
envs whose steps cost real CPU (parsing, simulators, sandboxes) the rollout throughput scales
with the workers until the driver's per-group receive cost or the policy becomes the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time

from agentrl.ray.cluster import LoopbackCluster

ENV = "games/FrozenLake-v0"


async def in_process(episodes: int, concurrency: int) -> tuple[int, float, float]:
    from agentrl.ray.env_worker import ManagerSpec
    from agentrl.rollout.scripted import RandomPolicy

    manager = ManagerSpec(ENV, max_concurrency=concurrency).build(RandomPolicy(seed=0))
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    try:
        started, cpu = time.perf_counter(), time.process_time()
        async with manager:
            await manager.run(range(episodes))
        return manager.stats.env_steps, time.perf_counter() - started, time.process_time() - cpu
    finally:
        gc.set_threshold(*thresholds)


async def on_ray(episodes: int, concurrency: int, workers: int) -> tuple[int, float, float]:
    from agentrl.ray.env_worker import ManagerSpec, PolicySpec
    from agentrl.ray.rollout import RayRollout

    spec = ManagerSpec(ENV, max_concurrency=concurrency)
    async with RayRollout(spec, PolicySpec("random"), workers=workers, cpus_per_worker=0.25) as rollout:
        cpu = time.process_time() + await rollout.cpu_seconds()
        started = time.perf_counter()
        await rollout.run(range(episodes))
        elapsed = time.perf_counter() - started
        cpu = time.process_time() + await rollout.cpu_seconds() - cpu
        assert rollout.stats.launched == rollout.stats.ended == episodes, rollout.stats.as_dict()
        return rollout.stats.env_steps, elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    cluster = LoopbackCluster(nodes=2, cpus_per_node=2)
    os.environ.update(cluster.env)  # before `import ray`: Ray reads its auth settings then
    import ray

    cores = os.cpu_count()
    print(f"{ENV}, random policy, {args.episodes} episodes, {args.concurrency} in flight, {cores} cores")
    rows: list[tuple[str, tuple[int, float, float]]] = []
    local = [asyncio.run(in_process(args.episodes, args.concurrency)) for _ in range(args.repeats)]
    rows.append(("in process (EnvManager)", max(local, key=lambda run: run[0] / run[1])))
    try:
        cluster.start()
        ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
        for workers in args.workers:
            runs = [
                asyncio.run(on_ray(args.episodes, args.concurrency, workers)) for _ in range(args.repeats)
            ]
            name = f"ray, {workers} env worker{'s' * (workers > 1)}"
            rows.append((name, max(runs, key=lambda run: run[0] / run[1])))
    finally:
        ray.shutdown()
        cluster.stop()
    base_rate = rows[0][1][0] / rows[0][1][1]
    base_cost = rows[0][1][2] / rows[0][1][0]
    header = (
        ("env-steps", 10),
        ("env-steps/s", 13),
        ("vs in process", 15),
        ("CPU µs/step", 13),
        ("vs in process", 15),
    )
    print(f"{'backend':<26}" + "".join(f"{title:>{width}}" for title, width in header))
    for name, (steps, seconds, cpu) in rows:
        rate, cost = steps / seconds, cpu / steps
        print(
            f"{name:<26}{steps:>10,}{rate:>13,.0f}{rate / base_rate:>14.2f}x"
            f"{cost * 1e6:>13.1f}{cost / base_cost:>14.2f}x"
        )


if __name__ == "__main__":
    main()
