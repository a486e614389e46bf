"""CLI commands for environments: `agentrl envs list`, `agentrl envs check ID`, `agentrl rollout ID`.

Errors a user can fix (an unknown env id, a bad option) print one clear line and exit with code
2, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from gymnasium.utils.env_checker import check_env
from rich.console import Console
from rich.table import Table

from agentrl import registry
from agentrl.cli.progress import episode_progress
from agentrl.core import Env
from agentrl.errors import AgentRLError, UnknownEnvError
from agentrl.generation import SamplingParams
from agentrl.recording import RecordWriter
from agentrl.rollout.manager import EnvManager, ManagerStats
from agentrl.rollout.protocol import Policy
from agentrl.rollout.scripted import ExpertPolicy, RandomPolicy
from agentrl.rollout.stats import RolloutStats
from agentrl.trajectory import StopReason, Trajectory

console = Console(soft_wrap=True)  # long PASS/FAIL lines stay whole when piped
errors = Console(stderr=True)

envs_app = typer.Typer(help="List and check environments.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.add_typer(envs_app, name="envs")
    app.command("rollout")(rollout)


def _fail(message: str, code: int = 2) -> typer.Exit:
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` options; values are read as YAML scalars (so `size=7` is an int)."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise _fail(f"--env-arg expects KEY=VALUE, got {pair!r}")
        kwargs[key] = yaml.safe_load(value)
    return kwargs


def _make(env_id: str, kwargs: dict[str, Any]) -> Env:
    try:
        return registry.make(env_id, **kwargs)
    except UnknownEnvError as exc:
        raise _fail(str(exc)) from None
    except AgentRLError as exc:
        raise _fail(str(exc), code=1) from None


# -- agentrl envs list ----------------------------------------------------------------------


@envs_app.command("list")
def list_command() -> None:
    """List every known env id and where it comes from (imports no suite)."""
    installed = {ep.name: ep for ep in metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    table = Table("id", "package", "description")
    described: set[str] = set()
    for env_id in registry.list_envs():
        dist = getattr(installed.get(env_id), "dist", None)
        if dist is not None:  # an installed suite: describe it (once) from its metadata, unimported
            summary = "" if dist.name in described else dist.metadata.get("Summary") or ""
            described.add(dist.name)
            table.add_row(env_id, dist.name, summary)
        else:  # registered in code, so spec() needs no import
            table.add_row(env_id, "(registered in code)", registry.spec(env_id).description)
    if not table.rows:
        console.print("No environments installed. `pip install -e envs/games` adds the games suite.")
        return
    console.print(table)


# -- agentrl envs check ---------------------------------------------------------------------


@envs_app.command("check")
def check_command(
    env_id: Annotated[str, typer.Argument(help="Env id, e.g. games/Sokoban-v0.")],
    episodes: Annotated[int, typer.Option(help="Episodes per rollout.")] = 4,
    max_turns: Annotated[int, typer.Option(help="Turn limit per episode.")] = 100,
    seed: Annotated[int, typer.Option(help="First seed.")] = 0,
    step_timeout: Annotated[float, typer.Option(help="Seconds allowed per env call.")] = 30.0,
    env_arg: Annotated[list[str], typer.Option(help="Constructor argument KEY=VALUE (repeatable).")] = [],  # noqa: B006
) -> None:
    """Run gymnasium's env checker, then short random and expert rollouts. Exit 1 on a failure."""
    kwargs = _parse_env_args(env_arg)
    env = _make(env_id, kwargs)
    ok = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_env(env, skip_render_check=True)
            console.print("[green]PASS[/] gymnasium check_env")
        except Exception as exc:
            ok = False
            console.print(f"[red]FAIL[/] gymnasium check_env: {type(exc).__name__}: {exc}", highlight=False)
    for warning in caught:
        if "spec" not in str(warning.message):  # made without gymnasium.make: expected
            console.print(f"  [yellow]warning:[/] {warning.message}", highlight=False)
    has_expert = type(env).expert_action is not Env.expert_action
    env.close()

    rollouts: list[tuple[str, Policy]] = [("random", RandomPolicy(seed=seed))]
    if has_expert:
        rollouts.append(("expert", ExpertPolicy()))
    else:
        console.print("[yellow]SKIP[/] expert rollout: the env has no expert_action()")
    for name, policy in rollouts:
        manager = EnvManager(
            env_id, policy, max_turns=max_turns, step_timeout=step_timeout, env_kwargs=kwargs
        )
        trajectories = asyncio.run(_collect(manager, range(seed, seed + episodes)))
        reasons = Counter(t.stop_reason.value for t in trajectories)
        failures = [t for t in trajectories if not t.stop_reason.finished]
        stats = RolloutStats.of(trajectories)
        success = stats.success_rate
        summary = (
            f"{name} rollout: {stats.episodes} episodes, success {success:.0%}, "
            f"mean reward {stats.reward_mean:.3f}, stop reasons {dict(reasons)}"
        )
        if name == "expert" and success == 0:
            ok = False
            console.print(f"[red]FAIL[/] {summary}: the expert never succeeded", highlight=False)
        elif failures:
            ok = False
            console.print(f"[red]FAIL[/] {summary}", highlight=False)
            for t in failures[:3]:
                console.print(f"  seed {t.seed}: {t.stop_reason.value}: {t.error}", highlight=False)
        else:
            console.print(f"[green]PASS[/] {summary}", highlight=False)
    if not ok:
        raise typer.Exit(1)


async def _collect(manager: EnvManager, seeds: range) -> list[Trajectory]:
    """Play `seeds`, then close the manager and the policy (a client holds HTTP connections)."""
    try:
        async with manager:
            groups = await manager.run(seeds)
    finally:
        close_policy = getattr(manager.policy, "aclose", None)
        if close_policy is not None:
            await close_policy()
    return [t for g in groups for t in g.trajectories]


# -- agentrl rollout ------------------------------------------------------------------------


def _resolve_policy(
    name: str, seed: int, tokenizer: str | None, max_tokens: int, temperature: float
) -> Policy:
    if name == "random":
        return RandomPolicy(seed=seed)
    if name == "expert":
        return ExpertPolicy()
    if name.startswith(("http://", "https://")):
        try:
            from agentrl.rollout.client import PolicyClient
        except ImportError:
            raise _fail(
                "serving policies from a URL needs agentrl.rollout.client, which this install lacks"
            ) from None
        if tokenizer is None:
            raise _fail("--policy URL needs --tokenizer MODEL_DIR (the directory of the served checkpoint)")
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
        try:
            return PolicyClient(name, tokenizer, sampling=params, api_key=os.environ.get("AGENTRL_API_KEY"))
        except AgentRLError as exc:
            raise _fail(str(exc)) from None
    raise _fail(f"--policy must be 'random', 'expert' or a policy server URL (http://...), got {name!r}")


def rollout(
    env_id: Annotated[str, typer.Argument(help="Env id, e.g. games/Sokoban-v0.")],
    policy: Annotated[str, typer.Option(help="random, expert, or a policy server URL.")] = "random",
    episodes: Annotated[int, typer.Option("-n", "--episodes", help="Episodes to keep.", min=1)] = 64,
    concurrency: Annotated[int, typer.Option(help="Episodes in flight at once.", min=1)] = 256,
    group_size: Annotated[int, typer.Option(help="Episodes per seed (group).", min=1)] = 1,
    redundancy: Annotated[
        int, typer.Option(help="Extra episodes per group; stragglers cancelled.", min=0)
    ] = 0,
    seed: Annotated[int, typer.Option(help="First seed; group i plays seed + i.")] = 0,
    max_turns: Annotated[int | None, typer.Option(help="Turn limit per episode.")] = None,
    step_timeout: Annotated[float | None, typer.Option(help="Seconds allowed per env call.")] = None,
    episode_timeout: Annotated[float | None, typer.Option(help="Seconds allowed per episode.")] = None,
    env_arg: Annotated[list[str], typer.Option(help="Constructor argument KEY=VALUE (repeatable).")] = [],  # noqa: B006
    tokenizer: Annotated[str | None, typer.Option(help="URL policies: the served model's directory.")] = None,
    max_tokens: Annotated[int, typer.Option(help="URL policies: tokens sampled per turn.")] = 256,
    temperature: Annotated[float, typer.Option(help="URL policies: sampling temperature.")] = 1.0,
    record: Annotated[
        Path | None, typer.Option(help="Append every finished episode to a store here (`agentrl view` it).")
    ] = None,
    ray: Annotated[
        str | None, typer.Option(help="Run on Ray env workers: 'local' (a private cluster) or an ADDRESS.")
    ] = None,
    workers: Annotated[
        int, typer.Option(help="With --ray: env-worker actors sharing --concurrency.", min=1)
    ] = 2,
) -> None:
    """Play episodes of an env with a policy and print success, reward and throughput."""
    kwargs = _parse_env_args(env_arg)
    _make(env_id, kwargs).close()  # a bad id or argument fails here, before a client connects
    groups = math.ceil(episodes / group_size)
    width = group_size + redundancy
    if ray is not None:
        from agentrl.cli.ray_rollout import rollout_on_ray

        spec = dict(group_size=group_size, redundancy=redundancy, max_concurrency=max(concurrency, width),
                    max_turns=max_turns, step_timeout=step_timeout, episode_timeout=episode_timeout,
                    env_kwargs=kwargs)  # fmt: skip
        sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature)
        ray_writer = _open_store(record)

        def write(trajectory: Trajectory) -> None:  # delivered groups hold no cancelled episode
            if ray_writer is not None:
                ray_writer.write_episode(trajectory, source="rollout", policy=policy)

        try:
            stats, kept, elapsed = rollout_on_ray(
                env_id,
                spec,
                policy,
                seed,
                tokenizer,
                sampling,
                range(seed, seed + groups),
                ray,
                workers,
                console,
                on_trajectory=write,
            )
        except (AgentRLError, ValueError) as exc:
            raise _fail(str(exc)) from None
        finally:
            if ray_writer is not None:
                ray_writer.close()
        _print_summary(stats, kept, elapsed)
        _print_recorded(ray_writer, record)
        return
    policy_fn = _resolve_policy(policy, seed, tokenizer, max_tokens, temperature)
    try:
        manager = EnvManager(
            env_id,
            policy_fn,
            group_size=group_size,
            redundancy=redundancy,
            max_concurrency=max(concurrency, width),
            max_turns=max_turns,
            step_timeout=step_timeout,
            episode_timeout=episode_timeout,
            env_kwargs=kwargs,
        )
    except UnknownEnvError as exc:
        raise _fail(str(exc)) from None
    except (AgentRLError, ValueError) as exc:
        raise _fail(str(exc)) from None

    progress = episode_progress(console)
    bar = progress.add_task(env_id, total=groups * width)
    writer = _open_store(record)

    def on_trajectory(trajectory: Trajectory) -> None:
        progress.advance(bar)
        if writer is not None and trajectory.stop_reason is not StopReason.CANCELLED:
            writer.write_episode(trajectory, source="rollout", policy=policy)

    manager.on_trajectory = on_trajectory
    started = time.perf_counter()
    try:
        with progress, _fewer_gc_passes():
            kept = asyncio.run(_collect(manager, range(seed, seed + groups)))
    finally:
        if writer is not None:
            writer.close()
    elapsed = time.perf_counter() - started
    _print_summary(manager.stats, kept, elapsed)
    _print_recorded(writer, record)


def _print_recorded(writer: RecordWriter | None, record: Path | None) -> None:
    if writer is not None:
        size = f"{writer.bytes_written / 1e3:.1f} kB"
        console.print(f"recorded to {writer.path} ({size}); browse it with `agentrl view {record}`")


def _open_store(directory: Path | None) -> RecordWriter | None:
    """A writer appending to a new file of the store in `directory` (created if needed)."""
    if directory is None:
        return None
    try:
        return RecordWriter(directory)
    except (AgentRLError, OSError) as exc:
        raise _fail(f"cannot record to {directory}: {exc}") from None


@contextlib.contextmanager
def _fewer_gc_passes() -> Iterator[None]:
    """Collect young objects less often while thousands of episodes hold live Turns.

    With CPython's default thresholds the cyclic GC rescans the growing heap of unfinished
    episodes so often that per-step cost doubles from 64 to 4096 envs (bench/env_manager.py).
    The command owns its process, so it may choose; the setting is restored afterwards.
    """
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def _print_summary(stats: ManagerStats, kept: list[Trajectory], elapsed: float) -> None:
    """The same table in process and on Ray: `stats` is the manager's, or the Ray driver's."""
    summary = RolloutStats.of(kept)
    table = Table("metric", "value", show_header=False)
    table.add_row("episodes (kept)", str(summary.episodes))
    table.add_row("success rate", f"{summary.success_rate:.1%}")
    table.add_row("mean reward", f"{summary.reward_mean:.3f}")
    table.add_row("mean turns", f"{summary.turns_mean:.1f}")
    table.add_row("launched", f"{stats.launched} episodes ({stats.ended} ended, {stats.in_flight} in flight)")
    table.add_row("episodes/s", f"{stats.ended / elapsed:.1f}")
    table.add_row("env-steps/s", f"{stats.env_steps / elapsed:.1f}")
    reasons = ", ".join(f"{r.value}={n}" for r, n in stats.by_reason.items() if n)
    table.add_row("stop reasons", reasons)
    console.print(table)
    failed = [t for t in kept if t.stop_reason in (StopReason.ERROR, StopReason.TIMEOUT)]
    for t in failed[:3]:
        console.print(f"  seed {t.seed}: {t.stop_reason.value}: {t.error}", highlight=False)
