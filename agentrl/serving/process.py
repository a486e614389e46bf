"""Run `agentrl serve` as a child process for the length of a training or evaluation run.

Why a separate process rather than uvicorn in a thread of the trainer: the embedded engine's
decode loop of a small model is Python-bound, so sharing the trainer's GIL would serialise
generation with the trainer's Python work (the env manager, the loss bookkeeping). A child
process has its own interpreter and its own torch thread pool, which is what lets rollout and
training overlap on a 2-core machine. The traffic is real HTTP on loopback either way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agentrl.errors import AgentRLError, PolicyError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """Linux: SIGTERM the server when the trainer dies, even by `kill -9` (no orphan holds the port)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ServerProcess:
    """`agentrl serve MODEL_DIR` in a child process; a context manager that waits for readiness."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: str | Path | None = None,
        threads: int | None = None,
        extra_args: list[str] | None = None,
        startup_timeout: float = 180.0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_path) if log_path else None
        self.threads = threads
        self.extra_args = extra_args or []
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerProcess:
        command = [
            sys.executable, "-c", "from agentrl.cli import main; main()", "serve", str(self.model_dir),
            "--host", self.host, "--port", str(self.port), *self.extra_args,
        ]  # fmt: skip
        if self.threads:
            command += ["--threads", str(self.threads)]
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            command,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the trainer, which stops us
            preexec_fn=_die_with_parent,
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PolicyError(
                    f"policy server exited with code {self._process.returncode} during startup"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise PolicyError(f"policy server at {self.url} not ready after {self.startup_timeout:.0f}s")

    def cpu_seconds(self) -> float | None:
        """CPU time the server process has used so far (from /proc: Linux only; else None)."""
        if self._process is None:
            return None
        try:
            fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def resolve_checkpoint(path: str | Path) -> Path:
    """A model directory from a run directory (its newest checkpoint), a checkpoint or a model dir."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    checkpoints = sorted(p for p in (path / "checkpoints").glob("step_*") if (p / "config.json").is_file())
    if checkpoints:
        return checkpoints[-1]
    for candidate in (path / "sft", path / "model_init"):
        if (candidate / "config.json").is_file():
            return candidate
    raise AgentRLError(f"{path} is neither a model directory nor a run directory with checkpoints")
