"""`--resume` after `kill -9`: the run continues from its last checkpoint and finishes.

The step counter, the policy version, the optimizer state and the RNG come back from the
checkpoint; the metrics of steps after it (lost work) are dropped and redone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from agentrl_trainers.metrics import read_metrics

from agentrl.recording import Recording

CONFIG = {
    "mode": "async",
    "env": {"id": "games/GuessNumber-v0", "group_size": 4, "max_turns": 5},
    "sampling": {"max_tokens": 10},
    "buffer": {"max_staleness": 1, "dynamic_filter": False},
    "schedule": {"steps": 6, "groups_per_step": 2, "checkpoint_every": 2, "eval_episodes": 0},
    "sft": {"episodes": 8},
}


def _train(config: Path, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", "from agentrl.cli import main; main()", "train", str(config), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_kill_9_then_resume_finishes_with_the_step_counter_continuing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "out": str(run)}))

    first = _train(config)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints/step_000002/state.json").exists():
        assert first.poll() is None, first.stdout.read().decode()[-3000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = max(r["step"] for r in read_metrics(run / "metrics.jsonl") if "learner/loss" in r)
    assert 2 <= killed_at < 6

    second = _train(config, "--resume")
    output, _ = second.communicate(timeout=240)
    text = output.decode()
    assert second.returncode == 0, text[-3000:]
    assert "resumed from step_00000" in text

    records = [r for r in read_metrics(run / "metrics.jsonl") if "learner/loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["version"] for r in records] == [1, 2, 3, 4, 5, 6]
    # The restarted server stamps the learner's versions (it starts at the checkpoint's), so the
    # batches after the resume hold tokens at most max_staleness versions behind.
    for r in records[killed_at:]:
        assert r["policy/oldest_token_version"] >= r["step"] - 2
    walls = [r["wall_time"] for r in records]
    assert walls == sorted(walls)  # wall-clock carries across the restart
    assert (run / "checkpoints/step_000006/state.json").is_file()

    # The trajectory store survived the kill: the resumed run cut any torn record and appended,
    # every step's batch reads back whole, and each holds the loss the metrics log has for it.
    store = Recording(run / "recording")
    assert sorted(store.batches) == [1, 2, 3, 4, 5, 6]
    assert [store.batches[r["step"]].learner["loss"] for r in records] == [r["learner/loss"] for r in records]
    assert all(len(store.batch_groups(step)) == 2 for step in store.batches)
    # Episodes recorded for steps the resume redid are superseded; the current ones are exactly
    # the batches' (no step listed twice in the viewer).
    current = {s["key"] for s in store.current() if s["source"] == "train"}
    assert current == {key for b in store.batches.values() for g in b.groups for key in g.episodes}
    resumed_at = int(text.split("resumed from step_")[1][:6])
    assert all(s["step"] > resumed_at for s in store.summaries if s["superseded"])
