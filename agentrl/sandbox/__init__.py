"""Sandboxed code execution: a warm pool of Docker containers, or namespaced processes.

    from agentrl.sandbox import create_pool

    async with create_pool(backend="auto", size=4) as pool:
        async with pool.acquire() as sandbox:
            result = await sandbox.run(["python3", "main.py"], files={"main.py": code}, timeout=5)

`backend="auto"` picks Docker when an engine answers and the namespace process backend otherwise.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ValidationError

from agentrl.errors import ConfigError
from agentrl.sandbox.base import ExecResult, LimitName, Sandbox, SandboxPool
from agentrl.sandbox.config import SandboxConfig
from agentrl.sandbox.pool import PoolStats, WarmPool

BackendName = Literal["auto", "docker", "process"]


def create_pool(backend: BackendName = "auto", size: int = 4, **limits: Any) -> WarmPool:
    """Build (not start) a pool of `size` sandboxes; `limits` are `SandboxConfig` fields.

    Start it with `await pool.start()` or `async with pool:`.
    """
    try:
        config = SandboxConfig(size=size, **limits)
    except ValidationError as exc:
        raise ConfigError(f"invalid sandbox settings: {exc}") from exc
    if backend == "auto":
        from agentrl.sandbox.docker_backend import engine_available

        backend = "docker" if engine_available() else "process"
    if backend == "docker":
        from agentrl.sandbox.docker_backend import DockerBackend

        return WarmPool(DockerBackend(config), config)
    if backend == "process":
        from agentrl.sandbox.process_backend import ProcessBackend

        return WarmPool(ProcessBackend(config), config)
    raise ConfigError(f"unknown sandbox backend {backend!r}; choose 'auto', 'docker' or 'process'")


__all__ = [
    "ExecResult",
    "LimitName",
    "PoolStats",
    "Sandbox",
    "SandboxConfig",
    "SandboxPool",
    "WarmPool",
    "create_pool",
]
