"""Grading cost per submission: the host-judged grader vs the in-sandbox one it replaced.

    python bench/code_grading.py                       # Docker, 4 in flight, 3 rounds of 60 tasks
    python bench/code_grading.py --backend process --rounds 1

Each round grades the 60 reference solutions of the built-in task set once with each grader,
`--concurrency` submissions in flight through one warm pool of that size; a submission's time is
the whole `async with pool.acquire() as sb: await grade(sb, ...)` (reset on release included).
The graders alternate round by round, so both see the same machine load.

- `host-judged`: `agentrl_code.grading` as installed (probes in the sandbox, checks on the host).
- `in-sandbox (baseline)`: the grader at `--baseline-rev` (default 0533e61, the last commit
  before the change), read with `git show` and loaded as a module; its harness judged the tests
  inside the candidate's own interpreter and reported with a nonce.
Every reference solution must pass under both graders; a failure is counted and printed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

from agentrl_code import grading
from agentrl_code.tasks import builtin_tasks

from agentrl.sandbox import create_pool

REPO = Path(__file__).resolve().parents[1]
HARNESS_LINE = 'HARNESS_SOURCE = (resources.files("agentrl_code") / "harness.py").read_text(encoding="utf-8")'


def load_baseline(rev: str) -> Any:
    """The grading module as it was at `rev`, with that revision's harness."""

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:{path}"], capture_output=True, text=True, check=True
        ).stdout

    source = show("envs/code/agentrl_code/grading.py")
    if HARNESS_LINE not in source:
        raise SystemExit(f"{rev}: grading.py does not load its harness the expected way")
    module = types.ModuleType("baseline_grading")
    module.__dict__["BASELINE_HARNESS"] = show("envs/code/agentrl_code/harness.py")
    sys.modules[module.__name__] = module
    source = source.replace(HARNESS_LINE, "HARNESS_SOURCE = BASELINE_HARNESS")
    exec(compile(source, rev, "exec"), module.__dict__)
    return module


async def grade_round(pool: Any, grader: Any, concurrency: int) -> tuple[list[float], list[str]]:
    """Grade every reference solution once; return per-submission seconds and failed task ids."""
    queue: asyncio.Queue = asyncio.Queue()
    for task in builtin_tasks():
        queue.put_nowait(task)
    latencies: list[float] = []
    failed: list[str] = []

    async def worker() -> None:
        while not queue.empty():
            task = queue.get_nowait()
            start = time.perf_counter()
            async with pool.acquire() as sandbox:
                report = await grader.grade(sandbox, task.solution, task.tests)
            latencies.append(time.perf_counter() - start)
            if not report.all_passed:
                failed.append(task.id)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, failed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="docker", choices=["docker", "process"])
    parser.add_argument("--concurrency", type=int, default=4, help="submissions in flight (= pool size)")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the 60 tasks per grader")
    parser.add_argument("--baseline-rev", default="0533e61", help="git revision of the old grader")
    args = parser.parse_args()
    graders = {"in-sandbox (baseline)": load_baseline(args.baseline_rev), "host-judged": grading}
    results: dict[str, list[float]] = {name: [] for name in graders}
    failures: dict[str, list[str]] = {name: [] for name in graders}
    async with create_pool(args.backend, size=args.concurrency) as pool:  # type: ignore[arg-type]
        await grade_round(pool, grading, args.concurrency)  # warm-up: page cache, first use of each sandbox
        for round_index in range(args.rounds):
            for name, grader in graders.items():
                latencies, failed = await grade_round(pool, grader, args.concurrency)
                results[name] += latencies
                failures[name] += failed
            print(f"  round {round_index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    base = results["in-sandbox (baseline)"]
    print(
        f"\ngrading the 60 reference solutions, {args.backend}, {args.concurrency} in flight, "
        f"{args.rounds} rounds per grader (seconds per submission, acquire + grade + release)"
    )
    header = f"{'grader':<24}{'subs':>6}{'fail':>6}{'p50 ms':>9}{'p90 ms':>9}{'mean ms':>9}{'p50 / base':>12}"
    print(header)
    print("-" * len(header))
    for name, latencies in results.items():
        p50 = percentile(latencies, 0.5)
        print(
            f"{name:<24}{len(latencies):>6}{len(failures[name]):>6}{p50 * 1e3:>9.1f}"
            f"{percentile(latencies, 0.9) * 1e3:>9.1f}{statistics.mean(latencies) * 1e3:>9.1f}"
            f"{p50 / percentile(base, 0.5):>11.2f}x"
        )
    for name, failed in failures.items():
        if failed:
            print(f"{name}: reference solutions that failed: {sorted(set(failed))}")


if __name__ == "__main__":
    asyncio.run(main())
