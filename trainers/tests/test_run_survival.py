"""Runs that survive their parts: a killed policy server is restarted, a filter that starves the
trainer stops the run with a reason instead of a silent wait.
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

BASE = {
    "mode": "async",
    "env": {"id": "games/GuessNumber-v0", "group_size": 4, "max_turns": 4},
    "sampling": {"max_tokens": 10},
    "buffer": {"max_staleness": 1, "dynamic_filter": False},
    "schedule": {"steps": 8, "groups_per_step": 2, "checkpoint_every": 4, "eval_episodes": 0},
    "sft": {"episodes": 8},
}


def _train(tmp_path: Path, config: dict) -> tuple[subprocess.Popen[bytes], Path]:
    run = tmp_path / "run"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**config, "out": str(run)}))
    command = [sys.executable, "-c", "from agentrl.cli import main; main()", "train", str(path)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), run


def _server_pids(parent: int) -> list[int]:
    """Children of `parent` running `agentrl serve` (from /proc: no extra dependency)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"serve" in cmdline:
            pids.append(int(entry.name))
    return pids


def _steps(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [r for r in read_metrics(path) if "learner/loss" in r] if path.is_file() else []


def test_a_policy_server_killed_mid_run_is_restarted_and_the_run_completes(tmp_path: Path) -> None:
    train, run = _train(tmp_path, BASE)
    deadline = time.monotonic() + 300
    while len(_steps(run)) < 2:
        assert train.poll() is None, train.stdout.read().decode()[-3000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no second step within 300 s"
        time.sleep(0.2)
    (first_server,) = _server_pids(train.pid)
    os.kill(first_server, signal.SIGKILL)

    output, _ = train.communicate(timeout=400)
    text = output.decode()
    assert train.returncode == 0, text[-3000:]
    assert "policy server died (exit code -9); restarting it" in text
    records = _steps(run)
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [r["version"] for r in records] == list(range(1, 9))  # monotone, no gap, no reset
    assert records[-1]["server_restarts"] == 1
    # Every batch holds tokens at most max_staleness versions old: the restarted server stamps
    # the learner's version, not a fresh count from 0.
    assert all(r["policy/oldest_token_version"] >= r["step"] - 2 for r in records)
    # Turns in flight when the server died were re-sent (and so re-sampled whole), not lost.
    assert records[-1]["policy/resent_requests"] > 0
    assert records[-1]["buffer/dropped_incomplete"] == 0
    assert (run / "recovery" / "config.json").is_file()
    assert not _server_pids(train.pid)


def test_a_filter_that_drops_every_group_ends_the_run_with_a_reason(tmp_path: Path) -> None:
    """An untrained model never answers in the game's format: every episode of a group gets the
    same (penalty) reward, dynamic_filter drops every group, and the run must say so and stop."""
    config = {
        **BASE,
        "env": {"id": "games/GuessNumber-v0", "group_size": 2, "max_turns": 2},
        "sft": {"episodes": 0},
        "buffer": {"max_staleness": 0, "dynamic_filter": True, "max_filtered_batches": 2},
    }
    train, _ = _train(tmp_path, config)
    output, _ = train.communicate(timeout=300)
    text = " ".join(output.decode().split())  # the console wraps long lines
    assert train.returncode == 2, text[-3000:]
    assert "training stalled: buffer.dynamic_filter dropped the last 4 groups in a row" in text
    assert "Traceback" not in text
