"""The sandbox interface env authors use: run untrusted code with limits, get a result back.

    pool = create_pool(backend="auto", size=4)
    async with pool, pool.acquire() as sandbox:
        result = await sandbox.run(["python3", "main.py"], files={"main.py": code}, timeout=5)

Backends (Docker warm pool, namespace process sandbox) implement `Sandbox` and `SandboxPool`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

LimitName = Literal["timeout", "memory", "output"]


@dataclass
class ExecResult:
    exit_code: int | None  # None when the process was killed before it exited on its own; -N: signal N
    stdout: str
    stderr: str
    duration: float  # seconds, wall clock
    timed_out: bool = False
    memory_exceeded: bool = False
    output_truncated: bool = False
    # Files named in `run(collect=...)` that existed after the run (each capped at max_output_bytes).
    files: dict[str, bytes] = field(default_factory=dict)
    # Set when the sandbox itself failed (its runner died, e.g. killed by the OOM killer); the
    # sandbox is then discarded, and the failure is reported here rather than raised.
    sandbox_error: str | None = None

    @property
    def limit_hit(self) -> bool:
        return self.timed_out or self.memory_exceeded or self.output_truncated

    @property
    def limit(self) -> LimitName | None:
        """Which limit stopped the program, if any (memory first: it often also causes the others)."""
        if self.memory_exceeded:
            return "memory"
        if self.timed_out:
            return "timeout"
        if self.output_truncated:
            return "output"
        return None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.limit_hit and self.sandbox_error is None


class Sandbox(ABC):
    """One isolated place to run code; its work dir is private to whoever holds it.

    A sandbox whose last run hit a limit or broke is `tainted`: its pool replaces it instead of
    handing it to the next user.
    """

    tainted: bool = False

    @abstractmethod
    async def run(
        self,
        command: list[str],
        *,
        stdin: str | bytes | None = None,
        files: dict[str, str | bytes] | None = None,
        timeout: float = 10.0,
        max_output_bytes: int = 1 << 20,
        collect: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Write `files` into the work dir, run `command` there, and return what happened.

        `max_output_bytes` caps stdout and stderr together; the program is killed when it is
        exceeded. `collect` names work-dir files to return in `ExecResult.files`.
        """

    @abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Read a file from the work dir (relative path)."""


class SandboxPool(ABC):
    """A set of ready sandboxes; `acquire()` lends one and resets (or replaces) it on return."""

    @abstractmethod
    async def start(self) -> None:
        """Reap leftovers of crashed runs and bring the pool up to its size."""

    @abstractmethod
    async def close(self) -> None:
        """Destroy every sandbox of this pool. Idempotent."""

    @abstractmethod
    def acquire(self) -> AbstractAsyncContextManager[Sandbox]:
        """`async with pool.acquire() as sandbox:`; waits while every sandbox is lent out."""

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


__all__ = ["ExecResult", "LimitName", "Sandbox", "SandboxPool"]
