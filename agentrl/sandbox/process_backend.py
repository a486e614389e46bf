"""Process sandboxes for machines with no Docker engine: Linux namespaces + rlimits.

Each sandbox is one long-lived runner (`_runner.py`) started as

    setpriv --reuid=U --regid=U --clear-groups --          # (only when started as root)
      unshare --map-root-user --net --ipc --mount --pid --fork --kill-child --propagation private --
        sh -c PROLOGUE                                    # builds a private root, then execs the runner

What it protects against (pinned by tests/test_sandbox_hostile.py):
- the host filesystem: the sandbox's root is a fresh tmpfs holding read-only bind mounts of /usr,
  /bin, /lib*, /sbin and nothing else (no /etc of the host, /root, /home, the repo, /var/run,
  the Docker socket); `pivot_root` + lazy unmount detaches the old root, so there is no path back
  (a `chroot` could be escaped, a detached root cannot). The root is then remounted read-only;
  the only writable places are the work dir and /tmp, both size-capped tmpfs.
- the host's identity: when agentrl runs as root, the sandbox runs as host uid `config.host_uid`
  (default 64999, should own no files), so even a path that leaked in would be checked against an
  unprivileged uid. Programs run with an empty capability bounding set and no_new_privs.
- the network: a fresh network namespace with only a down loopback (no sockets, no DNS).
- System V IPC and POSIX message queues: a fresh IPC namespace, so shared memory segments and
  queues neither reach the host nor outlive the sandbox.
- other processes: a private PID namespace whose init is the runner; a program sees only its
  sandbox, cannot signal or ptrace the runner (PID-namespace init, non-dumpable), and everything
  it started is SIGKILLed when its run ends.
- resources, per process: RLIMIT_AS (memory), RLIMIT_NPROC (per sandbox user namespace),
  RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE; wall-clock timeout with a kill of the whole namespace's
  processes; output capped while it is read.

What it does NOT protect against: kernel exploits (one shared kernel, no seccomp filter); total
memory of a sandbox (RLIMIT_AS is per process: `pids` processes may each take `memory_mb`); CPU
share between sandboxes (no cgroup: a busy sandbox slows its neighbours until its timeout);
reading world-readable files under /usr. Use the Docker backend where an engine runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import uuid
from pathlib import Path

from agentrl.errors import SandboxError
from agentrl.sandbox._client import RUNNER_SOURCE, Channel, RunnerSandbox
from agentrl.sandbox._shield import finish_despite_cancel
from agentrl.sandbox.config import SandboxConfig
from agentrl.sandbox.pool import Backend

DIR_PREFIX = "agentrl-sandbox-"
CAP_DROP = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]

# Runs as root of the fresh user namespace, inside fresh mount/PID/network namespaces.
# $1 root mount point, $2 work tmpfs MiB, $3 /tmp tmpfs MiB, $4 runner source, $5 runner config.
PROLOGUE = r"""
set -eu
R=$1
mount -t tmpfs -o size=4m,mode=755 sandboxroot "$R"
for d in usr bin sbin lib lib32 lib64 libx32; do
    if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$R/$d"
    elif [ -d "/$d" ]; then mkdir "$R/$d"; mount --rbind "/$d" "$R/$d"; mount -o remount,bind,ro "$R/$d"
    fi
done
mkdir "$R/proc" "$R/dev" "$R/tmp" "$R/work" "$R/etc" "$R/.oldroot"
mount -t proc proc "$R/proc"
for n in null zero full random urandom; do : > "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; done
mount -t tmpfs -o "size=$2m,mode=755" work "$R/work"
mount -t tmpfs -o "size=$3m,mode=1777" tmp "$R/tmp"
printf 'sandbox:x:0:0:sandbox:/work:/bin/sh\n' > "$R/etc/passwd"
printf 'sandbox:x:0:\n' > "$R/etc/group"
cd "$R"
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
mount -o remount,bind,ro /
cd /work
exec python3 -I -S -c "$4" "$5"
"""


class PipeChannel(Channel):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def send_line(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        await self.proc.stdin.drain()

    async def recv_line(self) -> bytes:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line.endswith(b"\n"):
            raise EOFError("runner exited")
        return line

    async def close(self) -> None:
        if self.proc.returncode is None:
            # unshare --kill-child takes the whole namespace down with it. The kill is sent
            # before any await, so a cancelled close still ends the sandbox.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()


class ProcessSandbox(RunnerSandbox):
    def __init__(self, name: str, channel: PipeChannel, host_dir: Path) -> None:
        super().__init__(name, channel)
        self.host_dir = host_dir
        self._pipe = channel

    async def death_reason(self) -> str:
        try:
            log = (self.host_dir / "runner.log").read_text(errors="replace").strip()
        except OSError:
            return ""
        return f": {log[-500:]}" if log else ""

    async def destroy(self) -> None:
        try:
            await self._pipe.close()
        finally:  # also when cancelled while waiting for the killed runner to be reaped
            shutil.rmtree(self.host_dir, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ProcessBackend(Backend):
    name = "process"

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.tmp_root = Path(tempfile.gettempdir())
        mib = 1 << 20
        self.runner_config = json.dumps(
            {
                "work_dir": "/work",
                "tmp_dir": "/tmp",
                "scrub_dirs": ["/tmp"],
                "wrapper": CAP_DROP,
                "rlimits": {
                    "RLIMIT_AS": config.memory_mb * mib,
                    "RLIMIT_NPROC": config.pids,
                    "RLIMIT_FSIZE": config.max_file_mb * mib,
                    "RLIMIT_NOFILE": config.open_files,
                },
            }
        )

    async def prepare(self) -> None:
        missing = [tool for tool in ("unshare", "setpriv", "mount", "pivot_root") if not shutil.which(tool)]
        if missing:
            raise SandboxError(
                f"process sandbox needs util-linux tools on PATH; missing: {', '.join(missing)}"
            )
        # Host dirs of sandboxes whose owner crashed (their namespaces died with the owner's pipes).
        for path in self.tmp_root.glob(DIR_PREFIX + "*"):
            try:
                owner = int(path.name[len(DIR_PREFIX) :].split("-")[0])
            except ValueError:
                continue
            if not _pid_alive(owner):
                shutil.rmtree(path, ignore_errors=True)

    async def shutdown(self) -> None:
        """Nothing backend-wide to release: each sandbox owns its process and host dir."""

    async def create(self) -> ProcessSandbox:
        name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        host_dir = self.tmp_root / f"{DIR_PREFIX}{name}"
        (host_dir / "root").mkdir(parents=True)
        host_dir.chmod(0o755)  # the unprivileged sandbox uid must traverse it to reach its mount point
        drop_uid = (
            [
                "setpriv",
                f"--reuid={self.config.host_uid}",
                f"--regid={self.config.host_uid}",
                "--clear-groups",
                "--",
            ]
            if os.geteuid() == 0
            else []
        )
        argv = [
            *drop_uid,
            "unshare", "--map-root-user", "--net", "--ipc", "--mount", "--pid", "--fork", "--kill-child",
            "--propagation", "private", "--",
            "/bin/sh", "-c", PROLOGUE, "sh", str(host_dir / "root"),
            str(self.config.work_mb), str(self.config.tmp_mb), RUNNER_SOURCE, self.runner_config,
        ]  # fmt: skip
        with open(host_dir / "runner.log", "wb") as log:
            spawning = asyncio.ensure_future(
                asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                    limit=1 << 30,  # one reply line carries a whole run's output, base64-encoded
                )
            )
            try:
                # The spawn is not cancelled half-way: asyncio would then kill `unshare` alone, and
                # a namespace child forked just before (its parent-death signal not yet armed)
                # would live on as an orphan. Once spawned, the whole process group is killed.
                proc = await finish_despite_cancel(spawning)
            except BaseException:
                if spawning.done() and not spawning.cancelled() and spawning.exception() is None:
                    await finish_despite_cancel(PipeChannel(spawning.result()).close())
                shutil.rmtree(host_dir, ignore_errors=True)
                raise
        sandbox = ProcessSandbox(name, PipeChannel(proc), host_dir)
        try:
            await sandbox.check_started()
        except BaseException:  # a failed or cancelled start leaves no process and no host dir
            await sandbox.destroy()
            raise
        return sandbox
