"""Docker sandboxes: a warm pool of locked-down, pre-started containers.

Each container's main process is the runner (`_runner.py`, passed as `python3 -c`), reached
through a Docker attach socket; a run is one JSON line each way over that socket, so it pays no
container start and no `docker exec`. Every container runs with: no network, memory (no swap),
CPU and pids caps, a read-only root with size-capped tmpfs work dir and /tmp, no-new-privileges,
all capabilities dropped, a non-root user. A container whose run hit a limit is removed, not reused.

Crash safety: containers carry labels (`agentrl.sandbox=1`, the pool id, the owner's host, pid
and pid start time); `prepare()` removes containers whose owner process is gone, so a crashed run
leaves nothing behind after the next start. Blocking SDK calls run in a private thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandbox._client import RUNNER_SOURCE, Channel, RunnerSandbox
from agentrl.sandbox._shield import finish_despite_cancel
from agentrl.sandbox.config import SandboxConfig
from agentrl.sandbox.pool import Backend

LABEL = "agentrl.sandbox"


def _start_time(pid: int) -> str:
    """A process's start time in clock ticks since boot: with the pid, identifies it across pid reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_is_alive(labels: dict[str, str]) -> bool:
    """Whether the process that created a container (per its labels) still runs on this host."""
    if labels.get(f"{LABEL}.host") != socket.gethostname():
        return True  # another machine's container (shared engine): not ours to judge
    try:
        pid = int(labels.get(f"{LABEL}.pid", ""))
    except ValueError:
        return False
    started = _start_time(pid)
    return bool(started) and started == labels.get(f"{LABEL}.pid_start")


def engine_available(timeout: float = 3.0) -> bool:
    """Whether a Docker engine answers (used by `create_pool(backend="auto")`)."""
    import docker

    try:
        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no socket, no permission, engine down: all mean "not available"
        return False


class DockerChannel(Channel):
    """The runner's stdin/stdout over an attach socket (Docker's multiplexed stream framing)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._pending = bytearray()  # stdout bytes received but not yet returned as a line
        self.stderr_tail = bytearray()

    async def send_line(self, line: bytes) -> None:
        self.writer.write(line)
        await self.writer.drain()

    async def recv_line(self) -> bytes:
        while True:
            end = self._pending.find(b"\n")
            if end >= 0:
                line = bytes(self._pending[: end + 1])
                del self._pending[: end + 1]
                return line
            try:
                header = await self.reader.readexactly(8)
                stream, size = header[0], struct.unpack(">I", header[4:])[0]
                payload = await self.reader.readexactly(size)
            except asyncio.IncompleteReadError as exc:
                raise EOFError("runner exited") from exc
            if stream == 1:
                self._pending += payload
            else:
                self.stderr_tail = (self.stderr_tail + payload)[-2000:]

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


class DockerSandbox(RunnerSandbox):
    def __init__(self, name: str, channel: DockerChannel, container: Any, backend: DockerBackend) -> None:
        super().__init__(name, channel)
        self.container = container
        self._docker_channel = channel
        self._backend = backend
        self._destroyed = False

    async def death_reason(self) -> str:
        try:
            await self._backend.call(self.container.reload)
            state = self.container.attrs["State"]
        except Exception:  # the container may already be gone; the reason is then unknown
            return ""
        words = ["OOM-killed" if state.get("OOMKilled") else f"container {state.get('Status')}"]
        tail = self._docker_channel.stderr_tail.decode(errors="replace").strip()
        if tail:
            words.append(tail[-300:])
        return ": " + "; ".join(words)

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        # The removal is sent first and awaited to its end even if this task is cancelled, so a
        # cancelled destroy still leaves no container. Closing the socket cannot block.
        removal = self._backend.submit(partial(self.container.remove, force=True))
        self._docker_channel.writer.close()
        # Already removed, or the engine is gone: either way the orphan reaper covers the rest.
        with contextlib.suppress(Exception):
            await finish_despite_cancel(removal)


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, config: SandboxConfig, pool_id: str | None = None) -> None:
        import docker

        self.config = config
        self.pool_id = pool_id or uuid.uuid4().hex[:12]
        self._executor = ThreadPoolExecutor(
            max_workers=config.max_concurrent_creates + 2, thread_name_prefix="agentrl-docker"
        )
        try:
            self.client = docker.from_env(timeout=60)
        except docker.errors.DockerException as exc:
            raise SandboxError(
                f"cannot reach a Docker engine ({exc}); run scripts/setup_docker.sh or use backend='process'"
            ) from exc
        pid = os.getpid()
        self.labels = {
            LABEL: "1",
            f"{LABEL}.pool": self.pool_id,
            f"{LABEL}.host": socket.gethostname(),
            f"{LABEL}.pid": str(pid),
            f"{LABEL}.pid_start": _start_time(pid),
        }
        mib = 1 << 20
        self.runner_config = json.dumps(
            {
                "work_dir": "/work",
                "tmp_dir": "/tmp",
                # Docker gives every container a writable /dev/shm and /dev/mqueue; wiped with
                # /tmp so that nothing a holder leaves there reaches the next holder.
                "scrub_dirs": ["/tmp", "/dev/shm", "/dev/mqueue"],
                "rlimits": {"RLIMIT_FSIZE": config.max_file_mb * mib},
            }
        )

    def submit(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        """Run a blocking SDK call in the backend's threads (a future `asyncio.run` never cancels)."""
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def call(self, fn: Any, *args: Any) -> Any:
        return await self.submit(fn, *args)

    async def prepare(self) -> None:
        import docker

        try:
            await self.call(self.client.images.get, self.config.image)
        except docker.errors.ImageNotFound:
            raise SandboxError(
                f"sandbox image {self.config.image!r} not found; build it with "
                "`bash scripts/setup_docker.sh` (offline) or `docker build sandboxes/`"
            ) from None
        await self.reap_orphans()

    async def reap_orphans(self) -> int:
        """Remove containers of crashed agentrl processes on this host; returns how many."""
        containers = await self.call(partial(self.client.containers.list, all=True, filters={"label": LABEL}))
        dead = [c for c in containers if not owner_is_alive(c.labels)]
        for container in dead:
            with contextlib.suppress(Exception):  # removed concurrently by another reaper: fine
                await self.call(partial(container.remove, force=True))
        return len(dead)

    def _create_blocking(self, name: str) -> tuple[Any, socket.socket]:
        cfg = self.config
        container = self.client.containers.create(
            cfg.image,
            command=["python3", "-I", "-S", "-c", RUNNER_SOURCE, self.runner_config],
            name=name,
            labels=self.labels,
            user=cfg.user,
            working_dir="/work",
            stdin_open=True,
            network_mode="none",
            mem_limit=f"{cfg.memory_mb}m",
            memswap_limit=f"{cfg.memory_mb}m",
            nano_cpus=int(cfg.cpus * 1e9),
            pids_limit=cfg.pids,
            read_only=True,
            tmpfs={
                "/work": f"size={cfg.work_mb}m,uid=1000,gid=1000,mode=0700",
                "/tmp": f"size={cfg.tmp_mb}m,mode=1777",
            },
            security_opt=["no-new-privileges"],
            cap_drop=["ALL"],
            ulimits=[{"Name": "nofile", "Soft": cfg.open_files, "Hard": cfg.open_files}],
        )
        try:
            container.start()
            sock = self.client.api.attach_socket(
                container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
        except Exception:
            container.remove(force=True)
            raise
        raw: socket.socket = getattr(sock, "_sock", sock)  # the SDK wraps the upgraded socket in SocketIO
        raw.settimeout(None)
        return container, raw

    async def create(self) -> DockerSandbox:
        """Start one container; whatever stops this half-way (a failure, a cancellation) removes
        the container, even one the engine finished making after the cancellation."""
        name = f"agentrl-sbx-{self.pool_id}-{uuid.uuid4().hex[:8]}"
        making = self.submit(self._create_blocking, name)
        sandbox: DockerSandbox | None = None
        try:
            container, raw = await finish_despite_cancel(making)
            try:
                reader, writer = await asyncio.open_connection(sock=raw, limit=1 << 30)
            except BaseException:
                raw.close()
                raise
            sandbox = DockerSandbox(container.name, DockerChannel(reader, writer), container, self)
            await sandbox.check_started()
            return sandbox
        except BaseException:
            if sandbox is not None:
                await sandbox.destroy()
            else:  # the engine may hold a container of that name even if `making` failed late
                if making.done() and not making.cancelled() and making.exception() is None:
                    making.result()[1].close()
                with contextlib.suppress(Exception):
                    await finish_despite_cancel(self.submit(self._remove_by_name, name))
            raise

    def _remove_by_name(self, name: str) -> None:
        import docker

        with contextlib.suppress(docker.errors.NotFound):
            self.client.api.remove_container(name, force=True)

    async def shutdown(self) -> None:
        await self.call(self.client.close)
        self._executor.shutdown(wait=False)
