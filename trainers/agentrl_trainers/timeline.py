"""Where each training step's time went: engine busy, trainer idle, waiting for rollouts.

These are the numbers that say whether a run is rollout-bound or train-bound and how much
overlapping the two could gain, so every run logs them per step (`timeline/*` in
metrics.jsonl), plots them (`plots/timeline.png`) and `agentrl train` prints their means:

- `timeline/engine_busy_frac`: the share of the step's wall-clock the policy engine spent
  computing (stepping its batch or loading weights) rather than waiting for requests; read
  from the server's `/metrics` (`engine.busy_s`). Absent for engines that do not report it.
- `timeline/trainer_idle_frac`: the share of the step the trainer was not in its optimizer
  step (waiting for rollouts plus pushing weights).
- `timeline/rollout_wait_s`: seconds the trainer waited for a full batch of rollouts.
- `timeline/train_s`, `timeline/weight_sync_s`: the optimizer step and the weight push.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

KEYS = ("timeline/engine_busy_frac", "timeline/trainer_idle_frac", "timeline/rollout_wait_s")


class StepTimeline:
    """Measures one step at a time: `await begin()`, then `await end(waited, trained, synced)`."""

    def __init__(self, url: str) -> None:
        self.http = httpx.AsyncClient()
        self.url = url
        self._started = time.perf_counter()
        self._busy: float | None = None

    async def _engine_busy_s(self) -> float | None:
        """The engine's cumulative busy seconds, or None if the server does not report them."""
        try:
            response = await self.http.get(f"{self.url}/metrics", timeout=10.0)
            engine = response.json().get("engine") or {}
        except (httpx.HTTPError, ValueError):
            return None
        busy = engine.get("busy_s")
        return float(busy) if isinstance(busy, int | float) else None

    async def begin(self) -> None:
        self._started = time.perf_counter()
        self._busy = await self._engine_busy_s()

    async def end(self, waited: float, trained: float, synced: float) -> dict[str, float]:
        seconds = max(time.perf_counter() - self._started, 1e-9)
        record = {
            "timeline/rollout_wait_s": waited,
            "timeline/train_s": trained,
            "timeline/weight_sync_s": synced,
            "timeline/trainer_idle_frac": max(0.0, 1.0 - trained / seconds),
        }
        busy = await self._engine_busy_s()
        if busy is not None and self._busy is not None and busy >= self._busy:  # (a restart resets it)
            record["timeline/engine_busy_frac"] = min(1.0, (busy - self._busy) / seconds)
        return record

    async def aclose(self) -> None:
        await self.http.aclose()


def summary(records: Iterable[Mapping[str, Any]]) -> str | None:
    """One line with the step-time-weighted means of the timeline metrics, or None if none."""
    steps = [r for r in records if "timeline/trainer_idle_frac" in r and "step_seconds" in r]
    if not steps:
        return None
    total = sum(r["step_seconds"] for r in steps)

    def mean(key: str) -> float | None:
        have = [r for r in steps if isinstance(r.get(key), int | float)]
        if not have:
            return None
        return sum(r[key] * r["step_seconds"] for r in have) / max(sum(r["step_seconds"] for r in have), 1e-9)

    engine = mean("timeline/engine_busy_frac")
    wait = sum(r["timeline/rollout_wait_s"] for r in steps)
    engine_text = "n/a (engine does not report busy time)" if engine is None else f"{engine:.0%}"
    return (
        f"timeline over {len(steps)} steps ({total:.0f}s): engine busy {engine_text}, "
        f"trainer idle {mean('timeline/trainer_idle_frac'):.0%}, waiting for rollouts {wait:.0f}s "
        f"({wait / max(total, 1e-9):.0%})"
    )


def plot_timeline(records: Iterable[Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Per step, stacked seconds (waiting for rollouts / training / weight sync) and the busy
    fractions of engine and trainer; returns the PNG path (none if no step has the metrics)."""
    steps = [r for r in records if "timeline/trainer_idle_frac" in r]
    if not steps:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["step"] for r in steps]
    wait = [r["timeline/rollout_wait_s"] for r in steps]
    train = [r["timeline/train_s"] for r in steps]
    sync = [r["timeline/weight_sync_s"] for r in steps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.bar(xs, wait, label="waiting for rollouts", color="tab:orange")
    top.bar(xs, train, bottom=wait, label="optimizer step", color="tab:blue")
    stacked = [w + t for w, t in zip(wait, train, strict=True)]
    top.bar(xs, sync, bottom=stacked, label="weight push", color="tab:gray")
    top.set_ylabel("seconds")
    top.legend(loc="upper right", fontsize=8)
    top.set_title("where each step's time went")
    engine = [(r["step"], r["timeline/engine_busy_frac"]) for r in steps if "timeline/engine_busy_frac" in r]
    if engine:
        bottom.plot(*zip(*engine, strict=True), marker=".", label="engine busy")
    bottom.plot(xs, [1 - r["timeline/trainer_idle_frac"] for r in steps], marker=".", label="trainer busy")
    bottom.set_ylim(0, 1.05)
    bottom.set_xlabel("optimizer step")
    bottom.set_ylabel("fraction of step")
    bottom.legend(loc="lower right", fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "timeline.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
