"""`ServerProcess`: the one handle on a policy server: start, push(weights, version), url, close.

Training, evaluation, the tests and the CLI all start servers through it, and every weight
update goes through `push`, which carries the trainer's version (the server stamps exactly that
number on tokens; see agentrl/serving/engine_api.py). A server restarted with `version=N`
continues the trainer's count.

Why a separate process rather than uvicorn in a thread of the trainer: the embedded engine's
decode loop of a small model is Python-bound, so sharing the trainer's GIL would serialise
generation with the trainer's Python work (the env manager, the loss bookkeeping). A child
process has its own interpreter and its own torch thread pool, which is what lets rollout and
training overlap on a 2-core machine. The traffic is real HTTP on loopback either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from agentrl.errors import AgentRLError, PolicyError
from agentrl.generation import POLICY_VERSION_HEADER

if TYPE_CHECKING:
    import torch

API_KEY_ENV = "AGENTRL_API_KEY"  # generation routes (agentrl serve --api-key)
ADMIN_KEY_ENV = "AGENTRL_ADMIN_KEY"  # weight and session routes (agentrl serve --admin-key)


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
        version: int = 0,
        api_key: str | None = None,
        admin_key: str | None = None,
    ) -> None:
        """`api_key` / `admin_key` (default: $AGENTRL_API_KEY / $AGENTRL_ADMIN_KEY) are handed to the
        server (`agentrl serve --api-key/--admin-key`), and `push` authenticates with the admin key
        (the API key when there is no admin key)."""
        self.model_dir = Path(model_dir)
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_path) if log_path else None
        self.threads = threads
        self.extra_args = extra_args or []
        self.startup_timeout = startup_timeout
        self.version = version  # the version the server stamps; follows every successful push
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None
        self.admin_key = admin_key or os.environ.get(ADMIN_KEY_ENV) or None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._deadline = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerProcess:
        """Start the server and wait (blocking) until it answers /health."""
        self._spawn()
        self._wait_ready()
        return self

    async def astart(self) -> ServerProcess:
        """`start` for a running event loop: the wait for readiness does not block the loop.

        The child is still spawned from the calling (main) thread: the kernel's parent-death
        signal is tied to the thread that forked it.
        """
        self._spawn()
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                self._raise_if_failed()
                try:
                    if (await http.get(f"{self.url}/health")).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)

    def _spawn(self) -> None:
        self._deadline = time.monotonic() + self.startup_timeout
        command = [
            sys.executable, "-c", "from agentrl.cli import main; main()", "serve", str(self.model_dir),
            "--host", self.host, "--port", str(self.port), "--policy-version", str(self.version),
            *self.extra_args,
        ]  # fmt: skip
        if self.threads:
            command += ["--threads", str(self.threads)]
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
        env = {**os.environ}
        for name, key in ((API_KEY_ENV, self.api_key), (ADMIN_KEY_ENV, self.admin_key)):
            if key:
                env[name] = key
        self._process = subprocess.Popen(
            command,
            env=env,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the trainer, which stops us
            preexec_fn=_die_with_parent,
        )

    def _wait_ready(self) -> None:
        while True:
            self._raise_if_failed()
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)

    def _raise_if_failed(self) -> None:
        """During startup: stop and raise if the child exited or the startup timeout passed."""
        assert self._process is not None
        reason = None
        if self._process.poll() is not None:
            log = f"; see {self.log_path}" if self.log_path else ""
            reason = f"policy server exited with code {self._process.returncode} during startup{log}"
        elif time.monotonic() > self._deadline:
            reason = f"policy server at {self.url} not ready after {self.startup_timeout:.0f}s"
        if reason is not None:
            self.stop()
            raise PolicyError(reason)

    @property
    def returncode(self) -> int | None:
        """The exit code if the server process has ended (e.g. -9 after SIGKILL), else None."""
        return None if self._process is None else self._process.poll()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def restart(self, model_dir: str | Path, version: int) -> ServerProcess:
        """Stop what is left of the server and start it again on `model_dir`, stamped `version`.

        Same host and port, so clients keep their URL; their retries reach the new process.
        """
        self.stop()
        self.model_dir, self.version = Path(model_dir), version
        return await self.astart()

    async def push(self, weights: Mapping[str, torch.Tensor] | str | Path, version: int) -> int:
        """Send new weights stamped `version`: a state dict (as a safetensors body) or a checkpoint dir.

        Returns the version the server now serves; raises `PolicyError` if it refused the push
        (the server then still serves the previous weights).
        """
        try:
            response = await self._post_weights(weights, version)
        except httpx.TransportError as exc:
            message = f"weight push (version {version}) failed: server unreachable ({exc!r})"
            raise PolicyError(message) from exc
        if response.status_code != 200:
            detail = f"HTTP {response.status_code} {response.text[:300]}"
            raise PolicyError(f"weight push (version {version}) refused: {detail}")
        self.version = int(response.json()["version"])
        return self.version

    async def _post_weights(
        self, weights: Mapping[str, torch.Tensor] | str | Path, version: int
    ) -> httpx.Response:
        key = self.admin_key or self.api_key
        auth = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(base_url=self.url, timeout=300.0, headers=auth) as http:
            if isinstance(weights, str | Path):
                body = {"path": str(weights), "version": version}
                return await http.post("/v1/weights/load", json=body)
            else:
                payload = await asyncio.to_thread(_safetensors_body, weights)
                headers = {"content-type": "application/octet-stream", POLICY_VERSION_HEADER: str(version)}
                return await http.post("/v1/weights/state_dict", content=payload, headers=headers)

    def cpu_seconds(self) -> float | None:
        """CPU time the server process has used so far (from /proc: Linux only; else None)."""
        if self._process is None:
            return None
        try:
            fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def close(self) -> None:
        self.stop()

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM, up to `grace` seconds to shut down, then SIGKILL for the whole process group.

        The server is its process group's leader, and the processes it starts stay in the group
        (vLLM's engine core and workers): killing the group, also after a clean exit, means none
        of them outlives the server holding its memory.
        """
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=grace)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
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


def _safetensors_body(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    """Serialize a state dict once per storage: tied weights (lm_head = embeddings) go once."""
    from safetensors.torch import save

    from agentrl.serving.weights import distinct_tensors

    return save(distinct_tensors(state_dict))
