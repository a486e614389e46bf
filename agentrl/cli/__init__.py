"""The `agentrl` command line. Each command group lives in its own module and registers itself."""

from __future__ import annotations

import typer

from agentrl.cli import envs, policy, train

app = typer.Typer(
    name="agentrl",
    help="Train LLM agents with reinforcement learning on multi-turn environments.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
for module in (envs, policy, train):
    module.register(app)


def main() -> None:
    app()
