"""Episodes/s and env-step latency of the web envs under `EnvManager`, expert vs random policy.

    python envs/web/bench/rollout_latency.py [-n 256] [--concurrency 64]

`agentrl rollout` prints throughput; this also prints the distribution of per-step env time
(`Turn.env_seconds`: parse, HTTP round trips to the shared server, rendering) so the numbers in
envs/web/README.md can be reproduced. Timings depend on machine load: compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from agentrl.rollout.manager import EnvManager
from agentrl.rollout.scripted import ExpertPolicy, RandomPolicy
from agentrl.trajectory import Trajectory


async def measure(env_id: str, policy_name: str, episodes: int, concurrency: int) -> dict[str, float]:
    policy = ExpertPolicy() if policy_name == "expert" else RandomPolicy(seed=0)
    done: list[Trajectory] = []
    manager = EnvManager(env_id, policy, max_concurrency=concurrency, on_trajectory=done.append)
    await manager.run(range(1))  # start the shared server outside the timed part
    done.clear()
    started = time.perf_counter()
    await manager.run(range(episodes))
    elapsed = time.perf_counter() - started
    await manager.aclose()
    steps = sorted(turn.env_seconds for t in done for turn in t.turns)
    return {
        "episodes/s": len(done) / elapsed,
        "steps/s": len(steps) / elapsed,
        "p50 step ms": 1000 * statistics.median(steps),
        "p95 step ms": 1000 * steps[int(0.95 * (len(steps) - 1))],
        "success": sum(t.success for t in done) / len(done),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    print(f"{'env':<14}{'policy':<8}{'episodes/s':>11}{'steps/s':>9}{'p50 ms':>8}{'p95 ms':>8}{'success':>9}")
    for env_id in ("web/Shop-v0", "web/Wiki-v0"):
        for policy in ("expert", "random"):
            row = asyncio.run(measure(env_id, policy, args.episodes, args.concurrency))
            print(
                f"{env_id:<14}{policy:<8}{row['episodes/s']:>11.1f}{row['steps/s']:>9.1f}"
                f"{row['p50 step ms']:>8.1f}{row['p95 step ms']:>8.1f}{row['success']:>9.0%}"
            )


if __name__ == "__main__":
    main()
