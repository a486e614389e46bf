"""Hostile-code corpus, run on both sandbox backends.

Each case is a program that attacks its sandbox. Every case must be contained (a limit is hit or
the attack fails with a clear result), probes must actually have run (each program prints DONE
after its probes), and the NEXT execution in the same pool must succeed. The pool must also be
back to its full size with nothing left over (tainted sandboxes removed, not leaked), and a
sandbox that hit no limit must be reused, which shows its runner survived the attack.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from agentrl.sandbox import ExecResult, Sandbox, WarmPool, create_pool
from agentrl.sandbox.docker_backend import LABEL, DockerBackend, DockerSandbox
from agentrl.sandbox.process_backend import ProcessSandbox
from tests.sandbox_helpers import require_backend

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPO = Path(__file__).resolve().parents[1]
HOST_SECRET = Path("/tmp/agentrl-hostile-secret.txt")  # world-readable on the host, on purpose


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["process", "docker"])
async def pool(request: pytest.FixtureRequest) -> AsyncIterator[WarmPool]:
    require_backend(request.param)
    HOST_SECRET.write_text("host-secret-7f3a\n")
    HOST_SECRET.chmod(0o644)
    # Small limits so the corpus is quick on 2 shared cores.
    async with create_pool(request.param, size=2, memory_mb=128, pids=32, work_mb=8, tmp_mb=4) as p:
        yield p
    HOST_SECRET.unlink(missing_ok=True)


@dataclass
class Case:
    code: str
    contained: Callable[[ExecResult], bool]
    timeout: float = 2.0


def probes_ran_and_nothing_leaked(r: ExecResult) -> bool:
    return "DONE" in r.stdout and "LEAK" not in r.stdout


CASES: dict[str, Case] = {
    "fork_bomb": Case(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        lambda r: r.timed_out or r.memory_exceeded,
    ),
    "memory_bomb": Case(
        """
        hog = []
        while True:
            hog.append(bytearray(16 << 20))
        """,
        lambda r: r.memory_exceeded and not r.ok,
    ),
    "infinite_loop": Case("while True:\n    pass\n", lambda r: r.timed_out and r.exit_code is None),
    "cpu_spin_in_threads": Case(
        """
        import threading
        def spin():
            while True:
                pass
        # Small stacks: with 8 MiB default stacks, 8 threads can exceed the process backend's
        # address-space limit, and the attack would fail to start instead of spinning.
        threading.stack_size(1 << 18)
        for _ in range(8):
            threading.Thread(target=spin, daemon=True).start()
        threading.Event().wait()
        """,
        lambda r: r.timed_out,
    ),
    "huge_stdout": Case(
        """
        import sys
        while True:
            sys.stdout.write("x" * 65536)
        """,
        lambda r: r.output_truncated and len(r.stdout) <= 100_000,
    ),
    "disk_fill": Case(
        """
        with open("fill.bin", "wb") as f:
            while True:
                f.write(b"\\0" * (1 << 20))
        """,
        lambda r: r.exit_code not in (0, None) and ("No space left" in r.stderr or "too large" in r.stderr),
    ),
    "network": Case(
        """
        import socket
        for addr in [("1.1.1.1", 53), ("8.8.8.8", 443), ("10.0.0.1", 80)]:
            try:
                socket.create_connection(addr, timeout=0.5)
                print("LEAK connected", addr)
            except OSError:
                pass
        try:
            socket.getaddrinfo("deb.debian.org", 80)
            print("LEAK resolved")
        except OSError:
            pass
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(b"x", ("1.1.1.1", 53))
            print("LEAK udp sent")
        except OSError:
            pass
        print("DONE")
        """,
        probes_ran_and_nothing_leaked,
    ),
    "read_host_files": Case(
        f"""
        import os
        for path in ["/etc/shadow", "/root/.bash_history", "{HOST_SECRET}", "{REPO}/pyproject.toml",
                     "/var/run/docker.pid", "/etc/agentrl-nonexistent"]:
            try:
                with open(path) as f:
                    f.read()
                print("LEAK read", path)
            except OSError:
                pass
        for path in ["/root", "{REPO}", "/home"]:
            try:
                if os.listdir(path):
                    print("LEAK listed", path)
            except OSError:
                pass
        print("DONE")
        """,
        probes_ran_and_nothing_leaked,
    ),
    "write_outside_work_dir": Case(
        f"""
        for path in ["/etc/agentrl-pwned", "/usr/agentrl-pwned", "/agentrl-pwned", "/root/agentrl-pwned",
                     "{REPO}/agentrl-pwned", "/var/agentrl-pwned", "/tmp/../agentrl-pwned"]:
            try:
                with open(path, "w") as f:
                    f.write("x")
                print("LEAK wrote", path)
            except OSError:
                pass
        print("DONE")
        """,
        lambda r: probes_ran_and_nothing_leaked(r) and not (REPO / "agentrl-pwned").exists(),
    ),
    "kill_parent": Case(
        """
        import os, signal
        for pid in {os.getppid(), 1}:
            for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        try:
            os.kill(-1, signal.SIGKILL)  # everything this user may signal
        except OSError:
            pass
        print("DONE")
        """,
        lambda r: "DONE" in r.stdout,  # the runner is PID-namespace init: immune to its children
    ),
    "proc_escape": Case(
        f"""
        import os
        def probe(path, kind):
            try:
                if kind == "list":
                    os.listdir(path)
                else:
                    with open(path, "rb") as f:
                        f.read(16)
                print("LEAK", kind, path)
            except OSError:
                pass
        probe("/proc/1/root/etc", "list")
        probe("/proc/1/environ", "read")
        probe("/proc/1/mem", "read")
        probe("/proc/1/cwd", "list")
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                probe(f"/proc/{{pid}}/root{REPO}", "list")
                probe(f"/proc/{{pid}}/root{HOST_SECRET}", "read")
        probe("/proc/self/root{REPO}", "list")
        probe("/proc/sysrq-trigger", "read")
        try:
            with open("/proc/sys/kernel/hostname", "w") as f:
                f.write("pwned")
            print("LEAK wrote hostname")
        except OSError:
            pass
        print("DONE")
        """,
        probes_ran_and_nothing_leaked,
    ),
    "docker_socket": Case(
        """
        import socket
        for path in ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"]:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                print("LEAK connected", path)
            except OSError:
                pass
        print("DONE")
        """,
        probes_ran_and_nothing_leaked,
    ),
}


async def assert_pool_healthy(pool: WarmPool, attacked: Sandbox) -> None:
    """Every sandbox is ready again, and the attacked one was either reused or really removed."""
    for _ in range(300):  # a replaced sandbox is refilled in the background: wait up to 30 s
        if pool.idle == pool.size:
            break
        await asyncio.sleep(0.1)
    assert pool.idle == pool.size, f"pool did not refill: {pool.idle}/{pool.size} ready"
    if isinstance(attacked, DockerSandbox):
        assert isinstance(pool.backend, DockerBackend)
        import docker

        client = docker.from_env()
        try:
            assert client.ping()  # the engine survived
            ours = client.containers.list(all=True, filters={"label": f"{LABEL}.pool={pool.backend.pool_id}"})
        finally:
            client.close()
        # Exactly `size` running containers: a replaced one is gone, not left stopped or running.
        assert len(ours) == pool.size and all(c.status == "running" for c in ours), ours
        assert (attacked.container.id in {c.id for c in ours}) == (not attacked.tainted)
    else:
        assert isinstance(attacked, ProcessSandbox)
        if attacked.tainted:  # destroyed: its namespace's processes and its host dir are gone
            assert attacked._pipe.proc.returncode is not None and not attacked.host_dir.exists()
        else:
            assert attacked._pipe.proc.returncode is None and attacked.host_dir.exists()


@pytest.mark.parametrize("name", list(CASES))
async def test_hostile_program_is_contained_and_pool_stays_healthy(pool: WarmPool, name: str) -> None:
    case = CASES[name]
    replaced = pool.replaced
    async with pool.acquire() as sandbox:
        result = await sandbox.run(
            ["python3", "main.py"],
            files={"main.py": textwrap.dedent(case.code)},
            timeout=case.timeout,
            max_output_bytes=64_000,
        )
        attacked = sandbox
    assert case.contained(result), f"{name} not contained: {result}"
    assert result.duration < case.timeout + 5, result
    if not result.limit_hit:  # reset on release worked, so the runner (the program's parent) is alive
        assert result.sandbox_error is None and pool.replaced == replaced, result
    # The host is fine and the next execution in the same pool succeeds.
    assert HOST_SECRET.read_text() == "host-secret-7f3a\n"
    async with pool.acquire() as sandbox:
        after = await sandbox.run(["python3", "-c", "print(sum(range(10)))"], timeout=10)
    assert after.ok and after.stdout == "45\n", after
    await assert_pool_healthy(pool, attacked)
