"""Find the installed trainer and let it add its commands (`train`, `sft`, ...) to `agentrl`.

The training stack is a separate distribution (`agentrl-trainers`, in `trainers/` of this
repository) so that env authors and rollout users never install torch. A trainer package
declares an entry point in the `agentrl.trainers` group whose value is a function taking the
Typer app and registering commands on it, exactly as env suites declare `agentrl.envs` entry
points:

    [project.entry-points."agentrl.trainers"]
    default = "agentrl_trainers.cli:register"

With several trainers installed, `AGENTRL_TRAINER=NAME` picks one (default: the one named
`default`, else the first by name). With none, `train` and `sft` still appear and say what to
install.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

import typer

from agentrl.errors import AgentRLError

GROUP = "agentrl.trainers"
INSTALL_HINT = "pip install agentrl-trainers (from a checkout of agentrl: pip install ./trainers)"


class TrainerNotInstalled(AgentRLError):
    """No distribution provides an `agentrl.trainers` entry point."""


def installed_trainers() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def choose_trainer(available: dict[str, EntryPoint]) -> EntryPoint | None:
    wanted = os.environ.get("AGENTRL_TRAINER")
    if wanted:
        if wanted not in available:
            names = ", ".join(sorted(available)) or "none"
            raise TrainerNotInstalled(f"AGENTRL_TRAINER={wanted!r} is not installed (installed: {names})")
        return available[wanted]
    if not available:
        return None
    return available.get("default") or available[min(available)]


def _missing(command: str) -> Callable[[], None]:
    def missing() -> None:
        typer.echo(f"error: `agentrl {command}` needs a trainer; none is installed. {INSTALL_HINT}", err=True)
        raise typer.Exit(code=2)

    missing.__doc__ = f"(needs a trainer: {INSTALL_HINT})"
    return missing


def register(app: typer.Typer) -> None:
    """Let the chosen trainer register its commands, or add ones that explain what is missing."""
    entry = choose_trainer(installed_trainers())
    if entry is None:
        for command in ("train", "sft"):
            app.command(command, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})(
                _missing(command)
            )
        return
    entry.load()(app)
