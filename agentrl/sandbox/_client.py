"""Host side of the runner protocol (see `_runner.py`), shared by both backends.

A backend supplies a `Channel` (how bytes reach the runner: a Docker attach socket, or the pipes
of a namespaced process) and a way to tell why a dead runner died; everything else (encoding,
limits, tainting) lives here once.
"""

from __future__ import annotations

import asyncio
import base64
import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandbox.base import ExecResult, Sandbox

RUNNER_SOURCE = (Path(__file__).with_name("_runner.py")).read_text()
# Slack on top of a run's own timeout for the runner to kill, reap and reply.
REPLY_GRACE_S = 10.0


class Channel(ABC):
    """A line-oriented, ordered byte channel to one runner."""

    @abstractmethod
    async def send_line(self, line: bytes) -> None: ...

    @abstractmethod
    async def recv_line(self) -> bytes:
        """The next reply line; raises `EOFError` when the runner is gone."""

    @abstractmethod
    async def close(self) -> None: ...


def _text(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _b64(data: str | bytes) -> str:
    return base64.b64encode(_text(data)).decode("ascii")


class RunnerSandbox(Sandbox):
    """A sandbox driven through its resident runner; one request at a time."""

    def __init__(self, name: str, channel: Channel) -> None:
        self.name = name
        self.tainted = False
        self._channel = channel
        self._lock = asyncio.Lock()

    async def _request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        async with self._lock:
            try:
                await self._channel.send_line(json.dumps(payload).encode() + b"\n")
                line = await asyncio.wait_for(self._channel.recv_line(), timeout)
            except (TimeoutError, EOFError, OSError) as exc:
                self.tainted = True
                why = await self.death_reason()
                raise SandboxError(
                    f"sandbox {self.name} stopped answering ({type(exc).__name__}){why}"
                ) from exc
            except BaseException:
                # Cancelled (or interrupted) mid-request: the runner may still be working on it,
                # and its late reply would answer the next request. Only a fresh sandbox is safe.
                self.tainted = True
                raise
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise SandboxError(f"sandbox {self.name}: {reply.get('error')}")
        return reply

    async def death_reason(self) -> str:
        """Extra words on why the runner died (e.g. ': OOM-killed'); empty when unknown."""
        return ""

    async def ping(self) -> None:
        await self._request({"op": "ping"}, timeout=30.0)

    async def check_started(self) -> None:
        """Ping a freshly started runner; destroy the sandbox (and re-raise) if it does not answer,
        so a failed start leaves no container or process behind."""
        try:
            await self.ping()
        except SandboxError:
            await self.destroy()
            raise

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
        if not isinstance(command, list) or not command or not all(isinstance(p, str) for p in command):
            raise SandboxError(f"command must be a non-empty list of strings, got {command!r}")
        if timeout <= 0 or max_output_bytes <= 0:
            raise SandboxError(
                f"timeout and max_output_bytes must be positive, got {timeout}, {max_output_bytes}"
            )
        payload = {
            "op": "run",
            "cmd": command,
            "stdin": _b64(stdin or b""),
            "files": {path: _b64(data) for path, data in (files or {}).items()},
            "timeout": timeout,
            "max_output": max_output_bytes,
            "collect": collect or [],
            "env": env or {},
        }
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            reply = await self._request(payload, timeout + REPLY_GRACE_S)
        except SandboxError as exc:
            if not self.tainted:  # the runner answered with an error: bad request, not a dead sandbox
                raise
            oom = "OOM" in str(exc)
            return ExecResult(
                None, "", "", loop.time() - started, memory_exceeded=oom, sandbox_error=str(exc)
            )
        result = ExecResult(
            exit_code=reply["exit_code"],
            stdout=base64.b64decode(reply["stdout"]).decode("utf-8", errors="replace"),
            stderr=base64.b64decode(reply["stderr"]).decode("utf-8", errors="replace"),
            duration=reply["duration"],
            timed_out=reply["timed_out"],
            memory_exceeded=reply["memory_exceeded"],
            output_truncated=reply["output_truncated"],
            files={path: base64.b64decode(data) for path, data in reply["files"].items()},
        )
        if result.limit_hit:
            self.tainted = True  # a program that hit a limit may have left the sandbox in a bad state
        return result

    async def read_file(self, path: str) -> bytes:
        reply = await self._request({"op": "read", "path": path}, timeout=30.0)
        return base64.b64decode(reply["data"])

    async def reset(self, timeout: float) -> None:
        """Kill leftovers and wipe the work dir and /tmp, so the next holder starts clean."""
        await self._request({"op": "reset"}, timeout=timeout)

    async def destroy(self) -> None:
        """Stop the runner and release what backs the sandbox. Idempotent, never raises."""
        await self._channel.close()
