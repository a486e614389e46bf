"""`agentrl rollout --ray ADDRESS`: every episode accounted for, and no token, no cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

AGENTRL = [sys.executable, "-c", "from agentrl.cli import main; main()"]


def _rollout(address: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    command = [*AGENTRL, "rollout", "games/FrozenLake-v0", "--policy", "random", "--ray", address, *extra]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_rollout_of_4096_episodes_on_two_workers_accounts_for_every_episode(ray_cluster) -> None:
    done = _rollout(
        ray_cluster.address,
        {**os.environ, **ray_cluster.env},
        "-n",
        "4096",
        "--concurrency",
        "4096",
        "--workers",
        "2",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"episodes \(kept\)\s*│\s*4096", done.stdout), done.stdout
    assert re.search(r"launched\s*│\s*4096 episodes \(4096 ended, 0 in flight\)", done.stdout), done.stdout
    reasons = dict(re.findall(r"(\w+)=(\d+)", done.stdout.split("stop reasons", 1)[1]))
    assert sum(map(int, reasons.values())) == 4096 and set(reasons) <= {"terminated", "truncated"}


def test_a_driver_without_the_token_is_refused_with_a_clear_error(ray_cluster, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(tmp_path)}
    done = _rollout(ray_cluster.address, env, "-n", "4")
    assert done.returncode == 2
    assert "token authentication" in done.stderr and "docs/ray.md" in done.stderr, done.stderr[-2000:]
