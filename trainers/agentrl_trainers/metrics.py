"""Training metrics: one JSONL record per step, TensorBoard scalars, and PNG plots at the end.

The JSONL file is the source of truth (append-only, so a resumed run continues it); TensorBoard
and the plots are views of the same numbers. Every record carries `step` and `wall_time`
(seconds of training so far, carried across resumes) so plots can use either axis.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

PLOTTED = ("reward_mean", "success_rate", "eval_success_rate")
REFERENCE_PREFIX = "reference/"  # reference policies' eval success, drawn as horizontal lines


class MetricsWriter:
    """Writes scalar metrics to `<dir>/metrics.jsonl` and TensorBoard event files in `<dir>/tb`."""

    def __init__(self, directory: str | Path, *, tensorboard: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.directory / "tb"))

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Record the scalar metrics of one step; non-numeric values go to JSONL only."""
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float) and math.isfinite(value):
                    self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        return record

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def truncate_after(path: str | Path, step: int) -> None:
    """Drop records of steps after `step` (a resumed run redoes them from its checkpoint)."""
    path = Path(path)
    if not path.exists():
        return
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics file; a torn last line (killed mid-write) is skipped."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def plot_metrics(records: Iterable[Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Plot reward and success against step and against wall-clock; return the PNG paths.

    The held-out success panel also shows each reference policy (`reference/NAME` records) as a
    horizontal line, so the model's curve is read against its floor and ceiling.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    references = {
        key.removeprefix(REFERENCE_PREFIX): value
        for r in records
        for key, value in r.items()
        if key.startswith(REFERENCE_PREFIX) and isinstance(value, int | float)
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for axis, label in (("step", "optimizer step"), ("wall_time", "wall-clock (s)")):
        fig, axes = plt.subplots(1, len(PLOTTED), figsize=(5 * len(PLOTTED), 3.6))
        for ax, key in zip(axes, PLOTTED, strict=True):
            points = [(r[axis], r[key]) for r in records if axis in r and isinstance(r.get(key), int | float)]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o" if len(points) < 30 else None, markersize=3, label="model")
            if key == "eval_success_rate" and references:
                for index, (name, rate) in enumerate(sorted(references.items(), key=lambda kv: kv[1])):
                    ax.axhline(rate, color=f"C{index + 1}", linestyle="--", linewidth=1, label=name)
                ax.set_ylim(0, 1.02)
                ax.legend(fontsize=7, loc="best")
            ax.set_xlabel(label)
            ax.set_title(key)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"metrics_vs_{axis}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    if references:
        written.append(_plot_eval_vs_references(records, references, out_dir / "eval_success.png", plt))
    return written


def _plot_eval_vs_references(
    records: list[Mapping[str, Any]], references: dict[str, float], path: Path, plt: Any
) -> Path:
    """Held-out success over training, with each reference policy as a horizontal line."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    points = [(r["step"], r["eval_success_rate"]) for r in records if "eval_success_rate" in r]
    if points:
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", color="C0", label="model (held-out)")
    for index, (name, rate) in enumerate(sorted(references.items(), key=lambda kv: kv[1])):
        ax.axhline(rate, color=f"C{index + 1}", linestyle="--", linewidth=1, label=f"{name} {rate:.0%}")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out success rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plain(value: Any) -> Any:
    """Numbers from numpy/torch become plain floats/ints so JSON and TensorBoard take them."""
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, RuntimeError):
            return str(value)
    return value
