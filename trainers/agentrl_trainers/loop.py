"""`agentrl train`: model -> warm start -> policy server -> rollouts -> buffer -> learner -> weights.

One run directory holds everything, so a run can be killed at any moment and resumed:

    OUT/model_init/          the freshly built model (when the config does not name one)
    OUT/sft/                 the warm-started model (with a DONE marker once complete)
    OUT/checkpoints/step_N/  HF model dir + learner_state.pt + state.json (atomic: tmp dir, rename)
    OUT/metrics.jsonl        one record per step (and per evaluation); OUT/tb/ TensorBoard
    OUT/plots/*.png          reward / success vs step and vs wall-clock, written at the end
    OUT/server.log           the policy server's output
    OUT/recovery/            the learner's weights, written when the policy server had to be restarted
    OUT/recording/           the trajectory store: each step's batch, evaluation episodes
                             (`agentrl view OUT`, `agentrl replay OUT --step N`)

Two concurrent parts share one asyncio loop: the producer streams groups from the
`EnvManager` (its seeds come from `StalenessBuffer.admitted`, which pauses rollout while it is
more than `max_staleness` versions ahead) into the buffer; the trainer takes a batch, runs the
optimizer step in a worker thread (torch releases the GIL, so rollout bookkeeping continues),
pushes the new weights to the server over HTTP and bumps the buffer's version. With
`max_staleness=0` (`--mode sync`) the same code degenerates to generate-train-push-repeat.

The learner owns the policy version: every push carries `learner.version`, the server stamps
exactly that number on tokens, and the buffer counts in it too, so there is one count (a resumed
run's server starts at the checkpoint's version).

A policy server that dies mid-run (OOM, SIGKILL) is noticed by a watchdog and restarted from the
learner's current weights at the learner's version, on the same port. The turns that were in
flight are re-sent by the policy client (it retries for `server.startup_timeout` seconds) and so
re-sampled whole; the ledger records a turn only once its answer arrives, so episodes keep exact
tokens. After `server.max_restarts` restarts, or if a restart fails, the run stops with one line
saying what died and how to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.errors import AgentRLError, PolicyError
from agentrl.rollout.evaluate import evaluate_references, evaluate_server
from agentrl.rollout.manager import EnvManager
from agentrl.rollout.stats import RolloutStats
from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.model import CausalLM
from agentrl.serving.process import API_KEY_ENV, ServerProcess
from agentrl.tokenizer import ChatTokenizer
from agentrl.trajectory import TrajectoryGroup
from agentrl_trainers.buffer import StalenessBuffer
from agentrl_trainers.config import TrainConfig
from agentrl_trainers.learner import Learner
from agentrl_trainers.metrics import MetricsWriter, plot_metrics, read_metrics, truncate_after
from agentrl_trainers.recorder import StepRecorder
from agentrl_trainers.sft import copy_tokenizer_files, save_checkpoint_dir, warm_start
from agentrl_trainers.timeline import StepTimeline, plot_timeline

STATE_JSON = "state.json"


@dataclass
class RunPaths:
    """Where each artefact of a run lives."""

    root: Path

    @property
    def model_init(self) -> Path:
        return self.root / "model_init"

    @property
    def sft(self) -> Path:
        return self.root / "sft"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint (its state.json is written last, so it marks completion)."""
        if not self.checkpoints.is_dir():
            return None
        done = sorted(p for p in self.checkpoints.glob("step_*") if (p / STATE_JSON).is_file())
        return done[-1] if done else None


@dataclass
class TrainResult:
    """What a finished run reports (also printed by the CLI)."""

    out: Path
    steps: int
    version: int
    wall_time: float
    warm_start_success: float | None = None
    final_success: float | None = None
    references: dict[str, float] = field(default_factory=dict)  # reference policy -> eval success
    plots: list[Path] = field(default_factory=list)


class BusyCores:
    """How many cores the trainer and server processes kept busy since `start()`.

    Logged per step as `cpu_busy_cores`: it shows how much of the machine each mode uses, and so
    how much room overlapping rollout and training has (sync at U of N busy cores can at best
    become N/U times faster by overlapping; bench/async_vs_sync.py prints that bound).
    """

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.start()

    def _now(self) -> tuple[float, float]:
        return time.perf_counter(), time.process_time() + (self.server.cpu_seconds() or 0.0)

    def start(self) -> None:
        self._start = self._now()

    def read(self) -> float:
        (wall0, cpu0), (wall1, cpu1) = self._start, self._now()
        return (cpu1 - cpu0) / max(wall1 - wall0, 1e-9)


def batch_metrics(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """Reward and success of the trajectories actually trained on."""
    stats = RolloutStats.of(t for g in groups for t in g.trajectories)
    versions = [g.oldest_version for g in groups if g.oldest_version is not None]
    return {
        # the oldest policy version whose tokens are in the batch (the server stamps the learner's)
        "policy/oldest_token_version": float(min(versions)) if versions else float("nan"),
        "reward_mean": stats.reward_mean,
        "success_rate": stats.success_rate,
        "turns_mean": stats.turns_mean,
    }


def prepare_model(config: TrainConfig, paths: RunPaths, log: Any = print) -> Path:
    """The directory RL starts from: the configured model, or a built one, warm-started if asked."""
    if config.model.path is not None:
        base = Path(config.model.path)
        if not (base / "config.json").is_file():
            raise AgentRLError(f"model.path {base} is not a checkpoint directory (no config.json)")
    else:
        base = paths.model_init
        if not (base / "config.json").is_file():
            log(f"building a {config.model.init!r} model in {base}")
            tmp = base.with_name(base.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            init_checkpoint(tmp, config.model.init, seed=config.model.seed)
            os.replace(tmp, base)
    if config.sft.episodes == 0:
        return base
    done = paths.sft / "DONE"
    if done.is_file():
        return paths.sft
    log(f"warm start: SFT on {config.sft.episodes} {config.sft.policy!r} episodes of {config.env.id}")
    tmp = paths.sft.with_name("sft.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    result = asyncio.run(
        warm_start(
            base,
            tmp,
            config.env.id,
            episodes=config.sft.episodes,
            epochs=config.sft.epochs,
            batch_size=config.sft.batch_size,
            lr=config.sft.lr,
            seed_start=config.sft.seed_start,
            env_kwargs=config.env.kwargs,
            max_turns=config.env.max_turns,
            seed=config.seed,
            player=config.sft.policy,
            only_successful=config.sft.successful_only,
        )
    )
    (tmp / "DONE").write_text(json.dumps(result.__dict__) + "\n")
    shutil.rmtree(paths.sft, ignore_errors=True)
    os.replace(tmp, paths.sft)
    log(f"warm start done: loss {result.first_loss:.3f} -> {result.final_loss:.3f} over {result.steps} steps")
    return paths.sft


class PolicyServerDied(AgentRLError):
    """The policy server died and could not be brought back."""


class ServerSupervisor:
    """Keeps the policy server serving the learner's weights: pushes them, restarts it if it dies.

    The lock makes a restart and an optimizer step exclusive: a restarted server is started from
    weights written while no step is changing them, stamped with the learner's version.
    """

    def __init__(
        self, server: ServerProcess, learner: Learner, paths: RunPaths, config: TrainConfig, log: Any
    ) -> None:
        self.server, self.learner, self.paths, self.config, self.log = server, learner, paths, config, log
        self.restarts = 0
        self.train_s = self.push_s = 0.0  # seconds of the last step's optimizer step and weight push
        self._lock = asyncio.Lock()

    async def train_and_push(self, groups: list[TrajectoryGroup]) -> dict[str, float]:
        """One optimizer step, then the new weights to the server at the learner's new version."""
        async with self._lock:
            started = time.perf_counter()
            metrics: dict[str, float] = await asyncio.to_thread(self.learner.train_step, groups)
            self.train_s = time.perf_counter() - started  # the step timeline's train / push split
            try:
                await self.server.push(self.learner.state_dict(), self.learner.version)
            except PolicyError:
                if self.server.returncode is None:
                    raise  # alive and refusing the weights: a bug to report, not to paper over
                await self._restart()  # starts from the weights just trained: nothing to push
            self.push_s = time.perf_counter() - started - self.train_s
        return metrics

    async def watch(self, interval: float = 0.5) -> None:
        """Restart the server whenever its process is found dead (runs until cancelled)."""
        while True:
            await asyncio.sleep(interval)
            if self.server.returncode is not None:
                async with self._lock:
                    if self.server.returncode is not None:  # not already restarted by a push
                        await self._restart()

    async def _restart(self) -> None:
        code, version = self.server.returncode, self.learner.version
        resume = f"resume with: agentrl train <config> --out {self.paths.root} --resume"
        if self.restarts >= self.config.server.max_restarts:
            raise PolicyServerDied(
                f"policy server died (exit code {code}) after {self.restarts} restarts; giving up. "
                f"Its log: {self.server.log_path}. {resume}"
            )
        self.restarts += 1
        self.log(f"policy server died (exit code {code}); restarting it on the learner's weights, v{version}")
        recovery = self.paths.root / "recovery"
        tmp = recovery.with_name("recovery.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        await asyncio.to_thread(save_checkpoint_dir, self.learner.model, self.server.model_dir, tmp)
        shutil.rmtree(recovery, ignore_errors=True)
        os.replace(tmp, recovery)
        try:
            await self.server.restart(recovery, version)
        except PolicyError as exc:
            message = f"policy server died (exit code {code}) and did not restart: {exc}. {resume}"
            raise PolicyServerDied(message) from exc


class TrainingRun:
    """One `agentrl train` invocation (fresh or resumed)."""

    def __init__(self, config: TrainConfig, *, resume: bool = False, progress: Any = None) -> None:
        self.config = config
        self.paths = RunPaths(Path(config.out))
        self.resume = resume
        self.progress = progress  # an object with .log(str) and .update(step, total, metrics)
        self._rollouts = RolloutStats()  # episodes ended since the last step
        self.ray: Any = None  # the Ray backend when `ray.address` is set (agentrl_trainers.ray_backend)
        self._recorder: StepRecorder | None = None

    def _drain_rollouts(self) -> dict[str, float]:
        rollouts, self._rollouts = self._rollouts, RolloutStats()
        return rollouts.as_metrics("rollout/")

    def _log(self, message: str) -> None:
        if self.progress is not None:
            self.progress.log(message)

    def run(self) -> TrainResult:
        if self.config.ray.address is not None:  # rollouts and the policy on a Ray cluster
            from agentrl.ray.cluster import connect

            with connect(self.config.ray.address):
                return self._run()
        return self._run()

    def _run(self) -> TrainResult:
        config, paths = self.config, self.paths
        paths.root.mkdir(parents=True, exist_ok=True)
        latest = paths.latest_checkpoint()
        if latest is not None and not self.resume:
            raise AgentRLError(
                f"{paths.root} already has checkpoints ({latest.name}); pass --resume to continue it "
                "or --out to start a new run elsewhere"
            )
        (paths.root / "config.yaml").write_text(_dump_yaml(config))
        torch.manual_seed(config.seed)
        np.random.seed(config.seed)
        torch.set_num_threads(config.cpu_threads(len(os.sched_getaffinity(0)))[1])  # for the warm start
        start_dir = prepare_model(config, paths, self._log)
        return asyncio.run(self._run_async(start_dir, latest if self.resume else None))

    async def _run_async(self, start_dir: Path, checkpoint: Path | None) -> TrainResult:
        config, paths = self.config, self.paths
        tokenizer_dir = self.tokenizer_dir = start_dir
        model = CausalLM.from_pretrained(checkpoint or start_dir)
        tokenizer = ChatTokenizer(tokenizer_dir)
        learner = Learner(model, config.learner, pad_id=tokenizer.pad_token_id or 0)
        state: dict[str, Any] = {"step": 0, "next_seed": config.schedule.train_seed_start, "wall_time": 0.0}
        if checkpoint is not None:
            learner.load(checkpoint)
            state = json.loads((checkpoint / STATE_JSON).read_text())
            truncate_after(paths.root / "metrics.jsonl", state["step"])
            self._log(f"resumed from {checkpoint.name}: step {state['step']}, version {learner.version}")
        serve_dir = checkpoint or start_dir
        server_threads, trainer_threads = config.cpu_threads(len(os.sched_getaffinity(0)))
        torch.set_num_threads(trainer_threads)
        if config.ray.address is not None:  # replicas + env workers instead of one server + manager
            from agentrl_trainers.ray_backend import RayBackend

            self.ray = RayBackend(config, serve_dir, learner.version)
        server = self.ray or ServerProcess(
            serve_dir,
            host=config.server.host,
            port=config.server.port,
            log_path=paths.root / "server.log",
            threads=server_threads,
            startup_timeout=config.server.startup_timeout,
            version=learner.version,
        )
        writer = MetricsWriter(paths.root)
        if config.record.enabled:
            self._recorder = StepRecorder(paths.root, config.record)
            if checkpoint is not None:
                self._recorder.resumed(state["step"])
        result = TrainResult(out=paths.root, steps=state["step"], version=learner.version, wall_time=0.0)
        await server.astart()  # spawned from the main thread: the server dies with the thread that started it
        self._supervisor = ServerSupervisor(server, learner, paths, config, self._log)
        watchdog = self._watchdog = asyncio.create_task(self._supervisor.watch())
        try:
            await self._train(learner, server, writer, tokenizer_dir, state, result)
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            server.stop()
            writer.close()
            if self._recorder is not None:
                self._recorder.close()
        records = read_metrics(paths.root / "metrics.jsonl")
        result.plots = plot_metrics(records, paths.plots) + plot_timeline(records, paths.plots)
        return result

    async def _train(
        self,
        learner: Learner,
        server: ServerProcess,
        writer: MetricsWriter,
        tokenizer_dir: Path,
        state: dict[str, Any],
        result: TrainResult,
    ) -> None:
        config, schedule = self.config, self.config.schedule
        url = server.url
        ray = self.ray
        policy = (
            None if ray else make_client(url, tokenizer_dir, config, temperature=config.sampling.temperature)
        )
        buffer = StalenessBuffer(
            schedule.groups_per_step,
            config.effective_max_staleness,
            version=learner.version,
            dynamic_filter=config.buffer.dynamic_filter,
            tail_batching=config.buffer.tail_batching,
            group_size=config.env.group_size,
            max_filtered_groups=config.buffer.max_filtered_batches * schedule.groups_per_step or None,
            speculative_groups=config.env.speculative_groups,
        )
        manager = (
            ray.make_rollout(lambda trajectory: self._rollouts.add(trajectory))
            if ray
            else EnvManager(
                config.env.id,
                policy,
                group_size=config.env.group_size,
                redundancy=config.env.redundancy,
                max_concurrency=max(
                    config.env.concurrency,
                    (config.env.group_size + config.env.redundancy)
                    * (
                        schedule.groups_per_step + config.env.speculative_groups
                        if config.env.rollout != "async"
                        else 1
                    ),
                ),
                max_turns=config.env.max_turns,
                step_timeout=config.env.step_timeout,
                episode_timeout=config.env.episode_timeout,
                env_kwargs=config.env.kwargs,
                on_trajectory=lambda trajectory: self._rollouts.add(trajectory),
                rollout=config.env.rollout,
                batch_groups=schedule.groups_per_step,
                speculative_groups=config.env.speculative_groups,
            )
        )
        seeds = _SeedCounter(state["next_seed"], schedule.eval_seed_offset)

        async def produce() -> None:
            async for group in manager.stream(buffer.admitted(seeds)):
                await buffer.put(group)

        if state["step"] == 0 and schedule.eval_episodes > 0:
            result.references = await self._evaluate_references(writer)
            success = await self._evaluate(url, learner.version, writer, 0, 0.0)
            result.warm_start_success = success
        # Wall-clock counts from the first rollout (the warm-start evaluation is not training).
        wall_offset = float(state["wall_time"])
        started = time.perf_counter()

        def wall() -> float:
            return wall_offset + time.perf_counter() - started

        busy = BusyCores(server)
        timeline = StepTimeline(url)
        producer = asyncio.create_task(produce())
        step = state["step"]
        try:
            while step < schedule.steps:
                step_started = time.perf_counter()
                busy.start()
                await timeline.begin()
                batch = buffer.get_batch(schedule.groups_per_step, learner.version)
                groups = await _first(batch, producer, self._watchdog)
                waited = time.perf_counter() - step_started
                metrics = await self._supervisor.train_and_push(groups)
                await buffer.set_version(learner.version)
                step += 1
                step_seconds = time.perf_counter() - step_started
                record = {
                    **batch_metrics(groups),
                    **{f"learner/{k}": v for k, v in metrics.items()},
                    **self._drain_rollouts(),
                    **buffer.metrics(),
                    "version": learner.version,
                    "wall_time": wall(),
                    "step_seconds": step_seconds,
                    "trainer_wait_s": waited,
                    "tokens_per_s": metrics["tokens"] / max(step_seconds, 1e-9),
                    "cpu_busy_cores": busy.read(),
                    "env_steps": manager.stats.env_steps,
                    "policy/resent_requests": float(
                        policy.resent_requests if policy else manager.resampled_turns
                    ),
                    "server_restarts": float(self._supervisor.restarts),
                    **await timeline.end(waited, self._supervisor.train_s, self._supervisor.push_s),
                }
                writer.log(step, record)
                if self._recorder is not None:
                    await asyncio.to_thread(self._recorder.step, step, learner.version - 1, groups, metrics)
                if self.progress is not None:
                    self.progress.update(step, schedule.steps, record)
                if schedule.eval_every and step % schedule.eval_every == 0 and step < schedule.steps:
                    await self._evaluate(url, learner.version, writer, step, wall())
                if step % schedule.checkpoint_every == 0 or step == schedule.steps:
                    await asyncio.to_thread(
                        self._save_checkpoint, learner, tokenizer_dir, step, seeds.next, wall()
                    )
        finally:
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await producer
            await buffer.close()
            await manager.aclose()
            if policy is not None:
                await policy.aclose()
            await timeline.aclose()
        result.steps, result.version = step, learner.version
        result.wall_time = wall()
        if schedule.eval_episodes > 0:
            result.final_success = await self._evaluate(url, learner.version, writer, step, wall())

    async def _evaluate(self, url: str, version: int, writer: MetricsWriter, step: int, wall: float) -> float:
        config = self.config
        hook = self._evaluation_hook(step, version)
        if self.ray:
            report = await self.ray.evaluate(
                config.schedule.eval_episodes, config.schedule.eval_seed_offset, hook
            )
        else:
            report = await evaluate_server(
                url,
                self.tokenizer_dir,
                config.env.id,
                config.schedule.eval_episodes,
                seed_offset=config.schedule.eval_seed_offset,
                temperature=config.sampling.eval_temperature,
                max_tokens=config.sampling.max_tokens,
                env_kwargs=config.env.kwargs,
                max_turns=config.env.max_turns,
                concurrency=config.env.concurrency,
                **client_options(config),
                on_trajectory=hook,
            )
        writer.log(
            step,
            {
                "eval_success_rate": report.success_rate,
                "eval_reward_mean": report.reward_mean,
                "eval_episodes": report.episodes,
                "wall_time": wall,
                "version": version,
            },
        )
        self._log(
            f"eval at step {step} (version {version}): success {report.success_rate:.1%} "
            f"over {report.episodes} held-out episodes"
        )
        return report.success_rate

    def _evaluation_hook(self, step: int, version: int) -> Any:
        recorder = self._recorder
        if recorder is None:
            return None
        return lambda trajectory: recorder.evaluation_episode(step, version, trajectory)

    async def _evaluate_references(self, writer: MetricsWriter) -> dict[str, float]:
        """The env's reference policies on the eval seeds, logged once as `reference/NAME`."""
        config = self.config
        reports = await evaluate_references(
            config.env.id,
            config.schedule.eval_episodes,
            seed_offset=config.schedule.eval_seed_offset,
            env_kwargs=config.env.kwargs,
            max_turns=config.env.max_turns,
        )
        rates = {name: report.success_rate for name, report in reports.items()}
        if rates:
            writer.log(0, {f"reference/{name}": rate for name, rate in rates.items()})
            self._log(
                "reference policies on the eval seeds: " + ", ".join(f"{n} {r:.1%}" for n, r in rates.items())
            )
        return rates

    def _save_checkpoint(
        self, learner: Learner, tokenizer_dir: Path, step: int, next_seed: int, wall: float
    ) -> None:
        """Write checkpoint `step` atomically and keep the two newest."""
        final = self.paths.checkpoint(step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        learner.save(tmp)
        copy_tokenizer_files(tokenizer_dir, tmp)
        state = {"step": step, "version": learner.version, "next_seed": next_seed, "wall_time": wall}
        (tmp / STATE_JSON).write_text(json.dumps(state) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        complete = sorted(p for p in self.paths.checkpoints.glob("step_*") if (p / STATE_JSON).is_file())
        for old in complete[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        self._log(f"checkpoint {final}")


def make_client(url: str, tokenizer_dir: Path, config: TrainConfig, *, temperature: float) -> Any:
    """A `PolicyClient` for the training or evaluation sampling settings."""
    from agentrl.generation import SamplingParams
    from agentrl.rollout.client import PolicyClient

    params = SamplingParams(
        max_tokens=config.sampling.max_tokens, temperature=temperature, top_p=config.sampling.top_p
    )
    return PolicyClient(url, tokenizer_dir, sampling=params, **client_options(config))


def client_options(config: TrainConfig) -> dict[str, Any]:
    """What every policy client of a run needs: retries long enough to ride out a policy-server
    restart (see ServerSupervisor), and the API key the child server got from the environment."""
    return {"retry_for": config.server.startup_timeout + 30.0, "api_key": os.environ.get(API_KEY_ENV)}


class _SeedCounter(Iterator[int]):
    """Training seeds counted up from the start; remembers where it is, for checkpoints."""

    def __init__(self, start: int, limit: int) -> None:
        self.next = start
        self.limit = limit

    def __iter__(self) -> _SeedCounter:
        return self

    def __next__(self) -> int:
        if self.next >= self.limit:
            raise AgentRLError(f"training seeds reached the held-out range at {self.limit}")
        seed, self.next = self.next, self.next + 1
        return seed


async def _first(awaitable: Any, *guards: asyncio.Task[None]) -> Any:
    """Await `awaitable`, but raise at once if a guard task (the rollout producer, the server
    watchdog) ended, else the trainer would wait forever for a batch that cannot come."""
    waiter = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({waiter, *guards}, return_when=asyncio.FIRST_COMPLETED)
    if waiter in done:
        return waiter.result()
    waiter.cancel()
    guard = next(iter(done))
    exc = guard.exception() if not guard.cancelled() else None
    if isinstance(exc, AgentRLError):
        raise exc
    raise AgentRLError(f"rollout stopped: {exc!r}") from exc


def _dump_yaml(config: TrainConfig) -> str:
    import yaml

    buffer = io.StringIO()
    yaml.safe_dump(config.model_dump(mode="json"), buffer, sort_keys=False)
    return buffer.getvalue()
