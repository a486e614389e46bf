"""`agentrl replay RUN --step N`: recompute a logged training step from the recording.

The run's store holds, for every step, the trajectories of its batch in the learner's order (a
`batch` record). Replay loads the newest checkpoint saved *before* step N (weights, AdamW
moments, counters), or the run's start model with a fresh optimizer when none is that old,
then runs `Learner.train_step` on the recorded batches of the steps in between and of step N.
Each replayed step's loss and gradient norm are compared with what the run logged.

On a CPU with the same torch thread count the arithmetic is the same sequence of operations on
the same bits, so the default tolerance is zero: replay must match bit for bit. (A run on
another machine, thread count or torch build may need `tolerance`.) Checkpoints are not saved
per step for this: a step between two checkpoints is reached by replaying the recorded steps
before it, which also checks those.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agentrl.errors import AgentRLError
from agentrl.recording import Recording, find_store
from agentrl.serving.model import CausalLM
from agentrl.tokenizer import ChatTokenizer
from agentrl_trainers.config import TrainConfig, load_config
from agentrl_trainers.learner import Learner
from agentrl_trainers.loop import STATE_JSON, RunPaths
from agentrl_trainers.metrics import read_metrics

COMPARED = ("loss", "grad_norm")


class ReplayError(AgentRLError):
    """A step that cannot be replayed (no recording, no batch record, no start point)."""


@dataclass
class StepComparison:
    """One replayed step: the logged and the recomputed values of each compared metric."""

    step: int
    logged: dict[str, float]
    replayed: dict[str, float]

    def difference(self, name: str) -> float:
        return abs(self.replayed[name] - self.logged[name])

    def matches(self, tolerance: float) -> bool:
        return all(self.difference(name) <= tolerance for name in COMPARED)


@dataclass
class ReplayResult:
    step: int
    start: str  # the checkpoint (or start model) the replay began from
    steps: list[StepComparison] = field(default_factory=list)

    @property
    def target(self) -> StepComparison:
        return self.steps[-1]


def replay_step(run_dir: str | Path, step: int, *, threads: int | None = None) -> ReplayResult:
    """Recompute steps up to `step` from the newest earlier checkpoint; compare with the logs."""
    paths = RunPaths(Path(run_dir))
    config_path = paths.root / "config.yaml"
    if not config_path.is_file():
        raise ReplayError(f"{paths.root} is not a training run directory (no config.yaml)")
    config = load_config(config_path)
    store = Recording(find_store(paths.root))
    if step not in store.batches:
        recorded = sorted(store.batches)
        hint = " (record.sample was set, so batches were not recorded whole)" if not recorded else ""
        raise ReplayError(f"step {step} has no recorded batch; replayable steps: {recorded or 'none'}{hint}")
    checkpoint, start_step = _start_point(paths, step)
    model_dir = checkpoint or _start_model(config, paths)
    missing = [s for s in range(start_step + 1, step + 1) if s not in store.batches]
    if missing:
        raise ReplayError(f"replaying step {step} from {model_dir.name} needs the batches of steps {missing}")
    logged = _logged(paths.root / "metrics.jsonl")

    learner = Learner(
        CausalLM.from_pretrained(model_dir),
        config.learner,
        pad_id=ChatTokenizer(model_dir).pad_token_id or 0,
    )
    if checkpoint is not None:
        learner.load(checkpoint)
    result = ReplayResult(step, str(model_dir))
    previous_threads = torch.get_num_threads()
    try:
        for current in range(start_step + 1, step + 1):
            batch = store.batches[current]
            torch.set_num_threads(threads or batch.torch_threads or previous_threads)
            if learner.version != batch.version:
                raise ReplayError(
                    f"step {current} was trained from version {batch.version}, replay is at {learner.version}"
                )
            metrics = learner.train_step(store.batch_groups(current))
            reference = logged.get(current) or {name: batch.learner[name] for name in COMPARED}
            result.steps.append(
                StepComparison(current, reference, {name: float(metrics[name]) for name in COMPARED})
            )
    finally:
        torch.set_num_threads(previous_threads)
    return result


def _start_point(paths: RunPaths, step: int) -> tuple[Path | None, int]:
    """The newest complete checkpoint saved before `step` and its step; (None, 0) for none."""
    best: tuple[Path | None, int] = (None, 0)
    if paths.checkpoints.is_dir():
        for directory in sorted(paths.checkpoints.glob("step_*")):
            state_file = directory / STATE_JSON
            if state_file.is_file():
                saved = int(json.loads(state_file.read_text())["step"])
                if best[1] <= saved < step:
                    best = (directory, saved)
    return best


def _start_model(config: TrainConfig, paths: RunPaths) -> Path:
    """The model the run's first step trained from (what `prepare_model` chose)."""
    if config.model.path is not None:
        directory = Path(config.model.path)
    elif config.sft.episodes > 0:
        directory = paths.sft
    else:
        directory = paths.model_init
    if not (directory / "config.json").is_file():
        raise ReplayError(f"the run's start model {directory} is gone; only steps after a checkpoint replay")
    return directory


def _logged(path: Path) -> dict[int, dict[str, float]]:
    """Step -> the learner's logged loss and grad norm (the last record of a step wins, as on resume)."""
    if not path.is_file():
        return {}
    logged = {}
    for record in read_metrics(path):
        if all(f"learner/{name}" in record for name in COMPARED):
            logged[int(record["step"])] = {name: float(record[f"learner/{name}"]) for name in COMPARED}
    return logged


def describe(comparison: StepComparison) -> str:
    parts = []
    for name in COMPARED:
        logged, replayed = comparison.logged[name], comparison.replayed[name]
        same = "bit-for-bit" if logged == replayed else f"differs by {comparison.difference(name):.3g}"
        parts.append(f"{name} logged {logged!r} replayed {replayed!r} ({same})")
    return f"step {comparison.step}: " + "; ".join(parts)
