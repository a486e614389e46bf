"""`agentrl eval`: success rate of a checkpoint on held-out seeds, served in a child process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from agentrl.errors import AgentRLError
from agentrl.rollout.evaluate import EvalReport, evaluate_references, evaluate_server, reference_names
from agentrl.serving.process import ServerProcess, resolve_checkpoint

console = Console()


def evaluate_checkpoint(checkpoint: str | Path, env_id: str, episodes: int, **kwargs: Any) -> EvalReport:
    """Serve `checkpoint` (or a run's newest) in a child process for the length of the evaluation."""
    model_dir = resolve_checkpoint(checkpoint)
    with ServerProcess(model_dir) as server:
        return asyncio.run(evaluate_server(server.url, model_dir, env_id, episodes, **kwargs))


def evaluate(
    checkpoint: Annotated[Path, typer.Argument(help="model, checkpoint or run dir (newest checkpoint)")],
    env_id: Annotated[str, typer.Argument()],
    n: Annotated[int, typer.Option("-n", help="episodes, one per held-out seed")] = 100,
    seed_offset: Annotated[int, typer.Option(help="first held-out seed (training stays below)")] = 1_000_000,
    temperature: Annotated[float, typer.Option(help="0 = greedy")] = 0.0,
    max_tokens: Annotated[int, typer.Option(help="tokens per action")] = 24,
    max_turns: Annotated[int | None, typer.Option()] = None,
    sampling_seed: Annotated[
        int | None, typer.Option(help="seeds sampling per episode and turn, so reruns agree")
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="AGENTRL_API_KEY", help="generation key; the child server is started with it too"
        ),
    ] = None,
    references: Annotated[
        bool, typer.Option(help="also play the env's reference policies on the same seeds")
    ] = True,
) -> float:
    """Success rate of a checkpoint on held-out seeds, beside the env's reference policies."""
    try:
        report = evaluate_checkpoint(
            checkpoint, env_id, n, seed_offset=seed_offset, temperature=temperature,
            max_tokens=max_tokens, max_turns=max_turns, sampling_seed=sampling_seed, api_key=api_key,
        )  # fmt: skip
        described = reference_names(env_id) if references else {}
        baselines = asyncio.run(
            evaluate_references(
                env_id, n, seed_offset=seed_offset, max_turns=max_turns, names=list(described)
            )
        )
    except AgentRLError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(code=2) from exc
    if as_json:
        refs = {name: r.success_rate for name, r in baselines.items()}
        console.print_json(
            json.dumps({**report.__dict__, "success_rate": report.success_rate, "references": refs})
        )
    else:
        console.print(
            f"{env_id}: success {report.success_rate:.1%} ({report.successes}/{report.episodes}), "
            f"reward {report.reward_mean:+.3f}, {report.turns_mean:.1f} turns, {report.errors} errors; "
            f"seeds {seed_offset}..{seed_offset + n - 1}, "
            + ("greedy" if temperature == 0 else f"temperature {temperature}, sampling seed {sampling_seed}"),
            soft_wrap=True,
        )
        width = max((len(name) for name in baselines), default=0)
        for name, ref in baselines.items():
            gap = 100 * (report.success_rate - ref.success_rate)
            console.print(
                f"  reference {name:<{width}} {ref.success_rate:6.1%}  model {gap:+5.1f} points"
                f"  ({described[name]})",
                markup=False,
                soft_wrap=True,
            )
    return report.success_rate


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("eval")(evaluate)
