"""The trainer's commands: `agentrl train`, `agentrl sft` (warm start).

They reach the `agentrl` command through the `agentrl.trainers` entry-point group (see
`register`), so a different trainer package can provide its own `train` the same way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentrl.errors import AgentRLError

console = Console()


class RichProgress:
    """Step bar plus the numbers that say whether training works: reward, success, speed, staleness."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[stats]}"),
            console=console,
        )
        self.task = self.bar.add_task("train", total=None, stats="starting")

    def log(self, message: str) -> None:
        self.bar.console.log(message)

    def update(self, step: int, total: int, metrics: dict[str, Any]) -> None:
        stats = (
            f"reward {metrics['reward_mean']:+.2f}  success {metrics['success_rate']:.0%}  "
            f"{metrics['tokens_per_s']:.0f} tok/s  "
            f"staleness {metrics.get('buffer/batch_staleness_mean', 0.0):.1f}  v{metrics['version']}"
        )
        self.bar.update(self.task, completed=step, total=total, stats=stats)

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.bar.stop()


def _fail(exc: Exception) -> typer.Exit:
    console.print(f"[red]error:[/red] {exc}")
    return typer.Exit(code=2)


def train(
    config: Annotated[Path, typer.Argument(help="YAML config (see examples/)")],
    mode: Annotated[str | None, typer.Option(help="sync | async (overrides the config)")] = None,
    max_staleness: Annotated[int | None, typer.Option(help="async ratio, in policy versions")] = None,
    resume: Annotated[bool, typer.Option(help="continue from the newest checkpoint in --out")] = False,
    out: Annotated[Path | None, typer.Option(help="run directory (overrides the config)")] = None,
    steps: Annotated[int | None, typer.Option(help="optimizer steps (overrides the config)")] = None,
    ray: Annotated[
        str | None, typer.Option(help="run on Ray: local | auto | HOST:PORT (overrides ray.address)")
    ] = None,
) -> None:
    """Train an agent with RL: build/load the model, warm-start, serve it, roll out, learn."""
    from agentrl_trainers.config import load_config
    from agentrl_trainers.loop import TrainingRun
    from agentrl_trainers.metrics import read_metrics
    from agentrl_trainers.timeline import summary as timeline_summary

    overrides: dict[str, Any] = {}
    for key, value in (("mode", mode), ("buffer.max_staleness", max_staleness), ("out", out),
                       ("schedule.steps", steps), ("ray.address", ray)):  # fmt: skip
        if value is not None:
            overrides[key] = str(value) if isinstance(value, Path) else value
    try:
        cfg = load_config(config, overrides)
        with RichProgress() as progress:
            result = TrainingRun(cfg, resume=resume, progress=progress).run()
    except AgentRLError as exc:
        raise _fail(exc) from exc
    console.print(
        f"done: {result.steps} steps, version {result.version}, {result.wall_time:.0f}s of training; "
        f"held-out success {_pct(result.warm_start_success)} (start) -> {_pct(result.final_success)} (end)"
    )
    timeline = timeline_summary(read_metrics(result.out / "metrics.jsonl"))
    if timeline is not None:
        console.print(timeline)
    if result.references:
        refs = ", ".join(f"{name} {rate:.1%}" for name, rate in result.references.items())
        console.print(f"reference policies on the same seeds: {refs}")
    console.print(f"metrics: {result.out / 'metrics.jsonl'}  plots: {', '.join(map(str, result.plots))}")


def sft(
    env_id: Annotated[str, typer.Argument(help="env whose scripted expert provides the data")],
    out: Annotated[Path, typer.Argument(help="directory to write the warm-started model to")],
    model: Annotated[Path | None, typer.Option(help="start from this model dir")] = None,
    size: Annotated[str, typer.Option(help="size to build when --model is not given")] = "tiny",
    episodes: Annotated[int, typer.Option(help="expert episodes")] = 128,
    epochs: Annotated[int, typer.Option()] = 1,
    batch_size: Annotated[int, typer.Option()] = 8,
    lr: Annotated[float, typer.Option()] = 1e-3,
    seed_start: Annotated[int, typer.Option(help="first seed of the expert episodes")] = 2_000_000,
) -> None:
    """Warm start: supervised training on an env's scripted expert, in the RL token layout."""
    from agentrl.serving.checkpoint import init_checkpoint
    from agentrl_trainers.sft import warm_start

    try:
        base = model
        if base is None:
            base = out.with_name(out.name + "_init")
            init_checkpoint(base, size)
        job = warm_start(
            base, out, env_id, episodes=episodes, epochs=epochs, batch_size=batch_size, lr=lr,
            seed_start=seed_start,
        )  # fmt: skip
        result = asyncio.run(job)
    except AgentRLError as exc:
        raise _fail(exc) from exc
    console.print(
        f"SFT on {result.episodes} expert episodes ({result.tokens} action tokens, {result.steps} steps): "
        f"loss {result.first_loss:.3f} -> {result.final_loss:.3f}; model written to {out}"
    )


def replay(
    run: Annotated[Path, typer.Argument(help="the run directory (OUT of `agentrl train`)")],
    step: Annotated[int, typer.Option(help="the training step to recompute", min=1)],
    tolerance: Annotated[float, typer.Option(help="allowed |replayed - logged|; 0: exact", min=0)] = 0.0,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: as recorded)", min=1)] = None,
) -> None:
    """Rebuild step N's batch from the recording and recompute its loss and gradient norm."""
    from agentrl_trainers.replay import describe, replay_step

    try:
        result = replay_step(run, step, threads=threads)
    except AgentRLError as exc:
        raise _fail(exc) from exc
    console.print(f"replayed from {result.start}", highlight=False)
    for comparison in result.steps:
        ok = comparison.matches(tolerance)
        mark = "[green]MATCH[/]" if ok else "[red]MISMATCH[/]"
        console.print(f"{mark} {describe(comparison)}", highlight=False)
    if not all(c.matches(tolerance) for c in result.steps):
        raise typer.Exit(code=1)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def register(app: typer.Typer) -> None:
    """Add the trainer's commands to the `agentrl` app (the `agentrl.trainers` entry point)."""
    app.command("train")(train)
    app.command("sft")(sft)
    app.command("replay")(replay)
