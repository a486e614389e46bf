"""Env-steps/s of EnvManager vs gymnasium's SyncVectorEnv / AsyncVectorEnv on a trivial env.

    python bench/env_manager.py            # 64, 1024, 4096 envs
    python bench/env_manager.py --quick    # fewer steps, for a smoke run

What is compared, at each env count N:
- `manager (instant env)`: EnvManager with an instant policy and an env whose `astep` never
  suspends; measures the manager's own per-step cost (records every Turn, message, timing).
- `manager (yielding env)`: the env awaits `asyncio.sleep(0)` each step, like an env doing I/O,
  so all N episodes really interleave on the loop.
- `bare asyncio (yielding)`: N tasks doing the same reset/step/policy loop with no manager and no
  recording: the floor that asyncio itself sets; the gap to the line above is manager overhead.
- `manager (yielding, gc tuned)`: the same with `gc.set_threshold(50_000, 20, 20)`. At
  thousands of envs, the live Turns of unfinished episodes make CPython's cyclic GC rescan a
  large heap; with GC off the manager's cost per step is flat from 64 to 4096 envs. A training
  process may choose this setting; the library does not change process-wide GC behind a
  user's back.
- `SyncVectorEnv` / `AsyncVectorEnv`: gymnasium's vector envs on the equivalent gymnasium env
  (same episode length, constant reward, autoreset). AsyncVectorEnv spawns one process per env,
  so it runs at N=64 only.

Each figure is the best of `--repeats` runs of about 2**18 env-steps. Ratios are env-steps/s
relative to SyncVectorEnv at the same N (higher is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from agentrl import Env, PolicyInput
from agentrl.rollout.manager import EnvManager

EPISODE_LENGTH = 32


class TrivialTextEnv(Env):
    """Ends after `EPISODE_LENGTH` steps with reward 1 per step; optionally yields each step."""

    def __init__(self, yields: bool) -> None:
        self.yields = yields

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t = 0
        return "0", {}

    async def astep(self, action: str):
        if self.yields:
            await asyncio.sleep(0)
        self.t += 1
        return "0", 1.0, self.t >= EPISODE_LENGTH, False, {}


class TrivialGymEnv(gymnasium.Env):
    """The same env for gymnasium's vector envs: Discrete observations and actions."""

    observation_space = spaces.Discrete(2)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return 0, {}

    def step(self, action: Any):
        self.t += 1
        return 0, 1.0, self.t >= EPISODE_LENGTH, False, {}


async def instant_policy(request: PolicyInput) -> str:
    return "0"


def bench_manager(n: int, episodes_per_env: int, yields: bool) -> tuple[float, int]:
    async def main() -> tuple[float, int]:
        manager = EnvManager(lambda: TrivialTextEnv(yields), instant_policy, max_concurrency=n)
        started = time.perf_counter()
        async for _ in manager.stream(range(n * episodes_per_env)):
            pass  # a consumer that keeps nothing, like a trainer after batching
        elapsed = time.perf_counter() - started
        assert manager.stats.finished == n * episodes_per_env
        await manager.aclose()
        return elapsed, manager.stats.env_steps

    return asyncio.run(main())


def bench_bare_asyncio(n: int, episodes_per_env: int) -> tuple[float, int]:
    steps = 0

    async def worker(env: TrivialTextEnv) -> None:
        nonlocal steps
        for _ in range(episodes_per_env):
            await env.areset()
            done = False
            while not done:
                action = await instant_policy(None)  # type: ignore[arg-type]
                _, _, done, _, _ = await env.astep(action)
                steps += 1

    async def main() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(worker(TrivialTextEnv(yields=True)) for _ in range(n)))
        return time.perf_counter() - started

    return asyncio.run(main()), steps


def bench_vector(make_vector: Callable[..., Any], n: int, vector_steps: int) -> tuple[float, int]:
    envs = make_vector([TrivialGymEnv for _ in range(n)])
    envs.reset(seed=0)
    actions = np.zeros(n, dtype=np.int64)
    started = time.perf_counter()
    for _ in range(vector_steps):
        envs.step(actions)
    elapsed = time.perf_counter() - started
    envs.close()
    return elapsed, n * vector_steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--counts", type=int, nargs="+", default=[64, 1024, 4096])
    parser.add_argument("--quick", action="store_true", help="fewer steps per measurement")
    parser.add_argument("--async-vector-max", type=int, default=64, help="largest N for AsyncVectorEnv")
    args = parser.parse_args()
    episodes_per_env = 1 if args.quick else 4
    rows: list[tuple[int, str, float, int]] = []
    for n in args.counts:
        sync_elapsed, sync_steps = bench_vector(
            SyncVectorEnv, n, vector_steps=max(EPISODE_LENGTH, 2**18 // n)
        )
        rows.append((n, "SyncVectorEnv", sync_elapsed, sync_steps))
        if n <= args.async_vector_max:
            rows.append((n, "AsyncVectorEnv", *bench_vector(AsyncVectorEnv, n, vector_steps=256)))
        rows.append((n, "bare asyncio (yielding)", *bench_bare_asyncio(n, episodes_per_env)))
        rows.append((n, "manager (instant env)", *bench_manager(n, episodes_per_env, yields=False)))
        rows.append((n, "manager (yielding env)", *bench_manager(n, episodes_per_env, yields=True)))
        default_thresholds = gc.get_threshold()
        gc.set_threshold(50_000, 20, 20)
        rows.append((n, "manager (yielding, gc tuned)", *bench_manager(n, episodes_per_env, yields=True)))
        gc.set_threshold(*default_thresholds)

    sync_rate = {n: steps / elapsed for n, name, elapsed, steps in rows if name == "SyncVectorEnv"}
    print(f"\ntrivial env, {EPISODE_LENGTH} steps per episode, instant policy, one asyncio loop\n")
    print(f"{'envs':>6}  {'implementation':<28} {'env-steps/s':>12} {'us/env-step':>12} {'vs Sync':>8}")
    for n, name, elapsed, steps in rows:
        rate = steps / elapsed
        print(f"{n:>6}  {name:<28} {rate:>12,.0f} {1e6 / rate:>12.2f} {rate / sync_rate[n]:>7.2f}x")
    manager_rates = {
        name: {n: steps / elapsed for n, row_name, elapsed, steps in rows if row_name == name}
        for name in ("manager (instant env)", "manager (yielding env)", "manager (yielding, gc tuned)")
    }
    lo, hi = min(args.counts), max(args.counts)
    print()
    for name, rates in manager_rates.items():
        print(f"{name}: us/step at {hi} envs / at {lo} envs = {rates[lo] / rates[hi]:.2f}x")


if __name__ == "__main__":
    main()
