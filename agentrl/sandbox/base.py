"""The sandbox interface env authors use: run untrusted code with limits, get a result back.

    async with pool.acquire() as sandbox:
        result = await sandbox.run(["python3", "main.py"], files={"main.py": code}, timeout=5)

Backends (Docker warm pool, namespace process sandbox) implement `Sandbox` and `SandboxPool`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass
class ExecResult:
    exit_code: int | None  # None when the process was killed before it exited on its own
    stdout: str
    stderr: str
    duration: float  # seconds, wall clock
    timed_out: bool = False
    memory_exceeded: bool = False
    output_truncated: bool = False

    @property
    def limit_hit(self) -> bool:
        return self.timed_out or self.memory_exceeded or self.output_truncated

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.limit_hit


class Sandbox(ABC):
    """One isolated place to run code; its work dir is private to whoever holds it."""

    @abstractmethod
    async def run(
        self,
        command: list[str],
        *,
        stdin: str | bytes | None = None,
        files: dict[str, str | bytes] | None = None,
        timeout: float = 10.0,
        max_output_bytes: int = 1 << 20,
    ) -> ExecResult:
        """Write `files` into the work dir, run `command` there, and return what happened."""

    @abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Read a file from the work dir (relative path)."""
