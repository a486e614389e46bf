"""What the sandbox test modules share: when a Docker case may skip and when it must fail."""

from __future__ import annotations

import os

import pytest

from agentrl.sandbox.docker_backend import engine_available


def require_backend(backend: str) -> None:
    """Skip Docker cases only where no engine runs and CI did not ask for Docker."""
    if backend == "docker" and not engine_available():
        if os.environ.get("AGENTRL_REQUIRE_DOCKER"):
            pytest.fail("AGENTRL_REQUIRE_DOCKER is set but no Docker engine answers")
        pytest.skip("no Docker engine (set AGENTRL_REQUIRE_DOCKER=1 to make this a failure)")
