"""Executions/s and latency of a short Python program: Docker warm pool vs `docker run` vs process.

    python bench/sandbox.py                  # about 2 minutes on 2 cores
    python bench/sandbox.py --quick          # fewer executions, for a smoke run

The same program (`python3 -c PROGRAM`, which prints a checked number) runs in three ways, each
with `--concurrency` executions in flight:
- `docker warm pool`: `agentrl.sandbox` Docker backend; one execution is a whole
  `async with pool.acquire() as sb: await sb.run(...)`, so the reset on release is included.
- `docker run per exec`: one `docker run --rm` CLI call per execution, same image and the same
  limits as a pool container (no network, memory/CPU/pids caps, read-only root with tmpfs work
  dir, no-new-privileges, all capabilities dropped, uid 1000, nofile ulimit).
- `process pool`: `agentrl.sandbox` namespace process backend (no Docker).
Pool start-up is reported but not timed into executions/s; each mode stops after `--execs`
executions or `--seconds`, whichever comes first. A wrong output counts as a failure and is
reported (it would make the figures meaningless). Ratios compare each mode with the warm pool.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agentrl.sandbox import SandboxConfig, create_pool
from agentrl.sandbox.docker_backend import engine_available

PROGRAM = "import sys; print(sum(i * i for i in range(1000)), sys.version_info[0])"
EXPECTED = f"{sum(i * i for i in range(1000))} 3\n"


@dataclass
class Stats:
    mode: str
    latencies: list[float]
    wall: float
    failures: int
    startup: float | None = None  # pool start, seconds (not counted in executions/s)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall if self.wall else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def drive(
    mode: str, one: Callable[[], Awaitable[str]], execs: int, seconds: float, concurrency: int
) -> Stats:
    """Run `one()` up to `execs` times (or for `seconds`), `concurrency` at a time; time each call."""
    latencies: list[float] = []
    failures = 0
    issued = 0
    start = time.perf_counter()
    stop_at = start + seconds

    async def worker() -> None:
        nonlocal issued, failures
        while issued < execs and time.perf_counter() < stop_at:
            issued += 1
            t0 = time.perf_counter()
            out = await one()
            latencies.append(time.perf_counter() - t0)
            if out != EXPECTED:
                failures += 1
                if failures <= 3:
                    print(f"  {mode}: unexpected output {out[:200]!r}", file=sys.stderr)

    async def progress() -> None:
        while True:
            await asyncio.sleep(2.0)
            done = len(latencies)
            elapsed = time.perf_counter() - start
            print(f"  {mode}: {done}/{execs} executions, {elapsed:.0f}s", file=sys.stderr, flush=True)

    ticker = asyncio.create_task(progress())
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        ticker.cancel()
    return Stats(mode, latencies, time.perf_counter() - start, failures)


async def bench_pool(backend: str, args: argparse.Namespace) -> Stats:
    mode = "docker warm pool" if backend == "docker" else "process pool"
    print(f"{mode}: starting {args.concurrency} sandboxes...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    async with create_pool(backend, size=args.concurrency) as pool:  # type: ignore[arg-type]
        startup = time.perf_counter() - t0

        async def one() -> str:
            async with pool.acquire() as sandbox:
                result = await sandbox.run(["python3", "-c", PROGRAM], timeout=10)
            return result.stdout if result.ok else f"FAILED {result}"

        for _ in range(args.concurrency):  # warm-up: first use of each sandbox, page cache
            await one()
        stats = await drive(mode, one, args.execs, args.seconds, args.concurrency)
    stats.startup = startup
    return stats


def docker_run_argv(config: SandboxConfig) -> list[str]:
    """`docker run` with the limits `DockerBackend` gives a pool container (see docker_backend.py)."""
    return [
        "docker", "run", "--rm", "--label", "agentrl.bench=1",
        "--network", "none",
        "--memory", f"{config.memory_mb}m", "--memory-swap", f"{config.memory_mb}m",
        "--cpus", str(config.cpus), "--pids-limit", str(config.pids),
        "--read-only",
        "--tmpfs", f"/work:size={config.work_mb}m,uid=1000,gid=1000,mode=0700",
        "--tmpfs", f"/tmp:size={config.tmp_mb}m,mode=1777",
        "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
        "--user", config.user, "--workdir", "/work",
        "--ulimit", f"nofile={config.open_files}:{config.open_files}",
        config.image, "python3", "-c", PROGRAM,
    ]  # fmt: skip


async def bench_docker_run(args: argparse.Namespace) -> Stats:
    argv = docker_run_argv(SandboxConfig())

    async def one() -> str:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        return out.decode() if proc.returncode == 0 else f"FAILED rc={proc.returncode} {err.decode()}"

    print("docker run per exec: warm-up...", file=sys.stderr, flush=True)
    await one()
    return await drive("docker run per exec", one, args.run_execs, args.seconds, args.concurrency)


def report(results: list[Stats], args: argparse.Namespace) -> None:
    pool = next((s for s in results if s.mode == "docker warm pool"), None)
    print(
        f"\nshort Python program, concurrency {args.concurrency}; ratios relative to the docker warm pool"
        " (exec/s ratio = pool / mode: >1 means the pool is faster)"
    )
    header = (
        f"{'mode':<22}{'execs':>7}{'fail':>6}{'exec/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'start s':>9}{'pool x exec/s':>15}{'p50 / pool p50':>16}"
    )
    print(header)
    print("-" * len(header))
    for s in results:
        p50, p99 = s.percentile(0.5) * 1e3, s.percentile(0.99) * 1e3
        speedup = f"{pool.rate / s.rate:.2f}x" if pool and s.rate else "-"
        p50_ratio = f"{p50 / (pool.percentile(0.5) * 1e3):.2f}x" if pool else "-"
        startup = f"{s.startup:.2f}" if s.startup is not None else "-"
        print(
            f"{s.mode:<22}{len(s.latencies):>7}{s.failures:>6}{s.rate:>9.1f}{p50:>9.1f}{p99:>9.1f}"
            f"{startup:>9}{speedup:>15}{p50_ratio:>16}"
        )
    run = next((s for s in results if s.mode == "docker run per exec"), None)
    if pool:
        p50 = pool.percentile(0.5) * 1e3
        print(f"\ngoal: warm pool p50 < 150 ms: {p50:.1f} ms -> {'met' if p50 < 150 else 'NOT met'}")
    if pool and run:
        ratio = pool.rate / run.rate
        print(
            f"goal: warm pool >= 4x docker-run exec/s: {ratio:.2f}x -> {'met' if ratio >= 4 else 'NOT met'}"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=4, help="executions in flight (= pool size)")
    parser.add_argument("--execs", type=int, default=400, help="max executions per pool mode")
    parser.add_argument("--run-execs", type=int, default=60, help="max executions of `docker run`")
    parser.add_argument("--seconds", type=float, default=35.0, help="time cap per mode")
    parser.add_argument("--quick", action="store_true", help="40/10 executions, 10 s cap per mode")
    parser.add_argument(
        "--modes", default="pool,run,process", help="comma-separated subset of pool,run,process"
    )
    args = parser.parse_args()
    if args.quick:
        args.execs, args.run_execs, args.seconds = 40, 10, 10.0
    modes = set(args.modes.split(","))
    unknown = modes - {"pool", "run", "process"}
    if unknown:
        parser.error(f"unknown mode(s) {sorted(unknown)}; choose from pool, run, process")
    if modes & {"pool", "run"} and not engine_available():
        parser.error("no Docker engine answers: run `bash scripts/setup_docker.sh` or use --modes process")
    results = []
    if "pool" in modes:
        results.append(await bench_pool("docker", args))
    if "run" in modes:
        results.append(await bench_docker_run(args))
    if "process" in modes:
        results.append(await bench_pool("process", args))
    report(results, args)


if __name__ == "__main__":
    asyncio.run(main())
