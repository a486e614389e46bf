"""Reach a Ray cluster, always with token authentication.

Ray (2.52+) authenticates every control-plane call (GCS, raylets, dashboard, job API) with one
shared bearer token when `RAY_AUTH_MODE=token` is set on every node and every driver. Without it,
anyone who can reach the ports can run code on the cluster. Ray finds the token in
`RAY_AUTH_TOKEN`, else in the file named by `RAY_AUTH_TOKEN_PATH`, else in `~/.ray/auth_token`
(`ray get-auth-token --generate` writes that file). agentrl therefore:

- starts every cluster it owns (`--ray local`, `LoopbackCluster`) with `RAY_AUTH_MODE=token` and a
  fresh random token that only this run knows (an environment variable, or a 0600 file);
- sets `RAY_AUTH_MODE=token` before joining an existing cluster (`--ray auto|ADDRESS`), so a
  cluster that runs without authentication is not joined silently half-secured: Ray refuses, and
  the error says how to start it with a token (docs/ray.md).

Ray reads these settings when `ray` is first imported in a process, so they are set before
that import (a driver that imported `ray` earlier must have them in its environment already).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from agentrl.errors import AgentRLError, InvalidArgumentError
from agentrl.serving.process import free_port

RAY_HINT = 'Ray is not installed: pip install "agentrl[ray]"'
AUTH_ENV = {"RAY_AUTH_MODE": "token"}


class RayUnavailable(AgentRLError):
    """The `ray` package is missing, or the cluster cannot be reached or refused us."""


def import_ray() -> ModuleType:
    """`import ray`, or a clear error naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable(RAY_HINT) from exc
    return ray


@contextlib.contextmanager
def connect(
    address: str, *, num_cpus: int | None = None, object_store_bytes: int | None = None
) -> Iterator[Any]:
    """Connect this process to Ray for the length of the block; yields the `ray` module.

    `address`: "local" starts a private single-node cluster in this process (token generated
    here, dashboard off), torn down on exit; "auto" joins the cluster `ray start` runs on this
    machine; anything else is a cluster address (`HOST:PORT`, or `ray://HOST:10001`).
    """
    if "ray" not in sys.modules:  # Ray reads its auth settings at import
        os.environ.update(AUTH_ENV)
        if address == "local":
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    ray = import_ray()
    if ray.is_initialized():  # an embedding program (a test, a notebook) already connected
        yield ray
        return
    try:
        if address == "local":
            ray.init(
                num_cpus=num_cpus,
                object_store_memory=object_store_bytes,
                include_dashboard=False,
                configure_logging=False,
                log_to_driver=False,
            )
        else:
            ray.init(address=address, configure_logging=False, log_to_driver=False)
    except ray.exceptions.AuthenticationError as exc:
        raise RayUnavailable(
            f"Ray refused the connection to {address!r}: {exc}. agentrl joins clusters only with token "
            "authentication: start every node with RAY_AUTH_MODE=token and the same token, and give "
            "the driver that token (RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH); see docs/ray.md"
        ) from exc
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayUnavailable(f"cannot connect to a Ray cluster at {address!r}: {exc}") from exc
    try:
        yield ray
    finally:
        ray.shutdown()


class LoopbackCluster:
    """A real multi-node Ray cluster on this machine: one `ray start --head` plus more nodes.

    For tests and benches: every node is a separate set of Ray processes (GCS, raylet, object
    store) as on separate machines, sized small (`cpus_per_node` logical CPUs, a 200 MB object
    store each, no dashboard). The token lives in a 0600 file in the cluster's own temp dir.
    `stop()` ends exactly the processes of this cluster (found by that temp dir, and their
    children), never other Ray clusters on the machine.
    """

    def __init__(
        self,
        nodes: int = 2,
        *,
        cpus_per_node: int = 2,
        object_store_bytes: int = 200 * 1024**2,
        dashboard: bool = False,
    ) -> None:
        if nodes < 1:
            raise InvalidArgumentError(f"a cluster needs at least one node, got {nodes}")
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.object_store_bytes = object_store_bytes
        self.dashboard = dashboard
        # Short: Ray's unix socket paths under it must stay below 108 characters.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="agentrl-ray-", dir="/tmp"))
        self.token_path = self.temp_dir / "auth_token"
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)
        self.port = free_port()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a driver needs in its environment to join (before it imports `ray`)."""
        return {**AUTH_ENV, "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def start(self) -> LoopbackCluster:
        common = [
            "--node-ip-address", "127.0.0.1",
            "--num-cpus", str(self.cpus_per_node),
            "--object-store-memory", str(self.object_store_bytes),
            "--temp-dir", str(self.temp_dir),
            "--disable-usage-stats",
        ]  # fmt: skip
        head = ["--head", "--port", str(self.port), f"--include-dashboard={str(self.dashboard).lower()}"]
        try:
            self._ray_start(head + common)
            for _ in range(self.nodes - 1):
                self._ray_start(["--address", self.address, *common])
        except BaseException:
            self.stop()
            raise
        return self

    def _ray_start(self, args: list[str]) -> None:
        done = subprocess.run(
            [_ray_executable(), "start", *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=180,
        )
        if done.returncode != 0:
            raise RayUnavailable(
                f"`ray start {' '.join(args)}` failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )

    def stop(self, grace: float = 3.0) -> None:
        """End every process of this cluster (SIGTERM, then SIGKILL after `grace` s); remove its files."""
        pids = _cluster_processes(str(self.temp_dir))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.2)
        for pid in pids:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def processes(self) -> list[int]:
        """The live processes of this cluster (for leak checks)."""
        return [pid for pid in _cluster_processes(str(self.temp_dir)) if _alive(pid)]

    def __enter__(self) -> LoopbackCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _ray_executable() -> str:
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.is_file() else shutil.which("ray")
    if found is None:
        raise RayUnavailable(RAY_HINT)
    return found


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every process we can read."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        table[int(entry.name)] = (parent, cmdline)
    return table


def _cluster_processes(marker: str) -> list[int]:
    """Processes whose command line names `marker` (the cluster's temp dir), and their descendants."""
    table = _proc_table()
    found = {pid for pid, (_, cmdline) in table.items() if marker in cmdline}
    grew = True
    while grew:
        children = {pid for pid, (parent, _) in table.items() if parent in found} - found
        found |= children
        grew = bool(children)
    found.discard(os.getpid())
    return sorted(found)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a parent that never reaps it counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
