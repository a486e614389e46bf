"""The `agentrl` command line. Each command group lives in its own module and registers itself.

`train` and `sft` come from the installed trainer package (see `trainer_plugin`).
"""

from __future__ import annotations

import typer

from agentrl.cli import envs, evaluate, serve, trainer_plugin, view

app = typer.Typer(
    name="agentrl",
    help="Train LLM agents with reinforcement learning on multi-turn environments.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
for module in (envs, serve, evaluate, view, trainer_plugin):
    module.register(app)


def main() -> None:
    app()
