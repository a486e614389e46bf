"""Helpers for the code suite tests: Docker detection and deliberately wrong solutions."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from agentrl_code.tasks import Task


def docker_available() -> bool:
    """True when a Docker engine answers and has the sandbox image."""
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(
        ["docker", "image", "inspect", "agentrl-sandbox:latest"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


def require_docker() -> None:
    """Skip without Docker, unless CI demands it (AGENTRL_REQUIRE_DOCKER=1), where it fails."""
    if docker_available():
        return
    if os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1":
        pytest.fail("AGENTRL_REQUIRE_DOCKER=1 but no Docker engine with agentrl-sandbox:latest answers")
    pytest.skip("no Docker engine with the agentrl-sandbox:latest image")


def stub_solution(task: Task) -> str:
    """Defines the entry point and returns None: must fail the task."""
    return f"def {task.entry_point}(*args, **kwargs):\n    return None\n"


OFF_BY_ONE = """
def _nudge(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "?"
    if isinstance(value, list):
        return value + [None]
    if isinstance(value, tuple):
        return value[:-1] if value else (None,)
    if isinstance(value, dict):
        return {**value, "?": None}
    return 0


_reference = {entry}


def {entry}(*args, **kwargs):
    return _nudge(_reference(*args, **kwargs))
"""


def off_by_one_solution(task: Task) -> str:
    """The reference solution with every return value nudged: close to right, but wrong."""
    return task.solution + OFF_BY_ONE.replace("{entry}", task.entry_point)
