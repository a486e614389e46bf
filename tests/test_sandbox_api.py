"""The sandbox API on both backends: I/O, files in and out, reset on release, limits, taint, config errors."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox import WarmPool, create_pool
from agentrl.sandbox.docker_backend import LABEL, DockerBackend
from tests.sandbox_helpers import require_backend

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["process", "docker"])
async def pool(request: pytest.FixtureRequest) -> AsyncIterator[WarmPool]:
    require_backend(request.param)
    async with create_pool(request.param, size=2) as p:
        yield p


async def test_run_passes_stdin_and_files_and_returns_output(pool: WarmPool) -> None:
    code = "\n".join(
        [
            "import sys",
            "name = sys.stdin.read().strip()",
            "print(f'hello {name}')",
            "print('warn', file=sys.stderr)",
        ]
    )
    async with pool.acquire() as sandbox:
        result = await sandbox.run(["python3", "pkg/main.py"], files={"pkg/main.py": code}, stdin="world\n")
    assert result.ok and result.exit_code == 0 and result.limit is None
    assert result.stdout == "hello world\n" and result.stderr == "warn\n"
    assert 0 < result.duration < 5


async def test_files_come_back_through_collect_and_read_file(pool: WarmPool) -> None:
    code = "open('out.txt', 'w').write('42')\nopen('data.bin', 'wb').write(bytes(range(256)))\n"
    async with pool.acquire() as sandbox:
        result = await sandbox.run(["python3", "-c", code], collect=["out.txt", "missing.txt"])
        assert result.files == {"out.txt": b"42"}
        assert await sandbox.read_file("data.bin") == bytes(range(256))
        with pytest.raises(SandboxError, match="escapes the work dir"):
            await sandbox.read_file("../etc/passwd")


async def test_release_resets_the_work_dir_tmp_and_shm(pool: WarmPool) -> None:
    for _ in range(pool.size + 1):  # every sandbox of the pool, at least once more after its first use
        async with pool.acquire() as sandbox:
            result = await sandbox.run(
                [
                    "python3",
                    "-c",
                    "import os; shm = os.path.isdir('/dev/shm')"
                    "; print(sorted(os.listdir('.')), sorted(os.listdir('/tmp')),"
                    " sorted(os.listdir('/dev/shm')) if shm else [])"
                    "; open('leftover', 'w').write('x'); open('/tmp/leftover', 'w').write('x')"
                    "; shm and open('/dev/shm/leftover', 'w').write('x')",
                ]
            )
            assert result.stdout == "[] [] []\n", result


async def test_release_removes_shared_memory_and_message_queues(pool: WarmPool) -> None:
    code = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True)"
        "; print(sum(len(open(f'/proc/sysvipc/{k}').read().splitlines()) - 1 for k in ('shm', 'msg', 'sem')))"
        "; libc.shmget(0x5eed, 4096, 0o1666); libc.msgget(0x5eed, 0o1666); libc.semget(0x5eed, 1, 0o1666)"
    )
    for _ in range(pool.size + 1):  # what one holder leaves, the next does not find
        async with pool.acquire() as sandbox:
            result = await sandbox.run(["python3", "-c", code])
        assert result.ok and result.stdout == "0\n", result


async def test_background_processes_do_not_outlive_their_run(pool: WarmPool) -> None:
    async with pool.acquire() as sandbox:
        start = await sandbox.run(["sh", "-c", "(sleep 30 &) ; echo started"])
        assert start.ok and start.stdout == "started\n"
        # `ps` may be absent from a minimal image: count processes through /proc instead.
        count = "import os; print(sum(p.isdigit() for p in os.listdir('/proc')))"
        after = await sandbox.run(["python3", "-c", count])
    assert after.stdout.strip() == "2", after  # the runner and this python3, nothing left behind


async def test_exit_codes_and_missing_commands_are_results(pool: WarmPool) -> None:
    async with pool.acquire() as sandbox:
        failed = await sandbox.run(["python3", "-c", "raise SystemExit(3)"])
        missing = await sandbox.run(["no-such-program"])
    assert failed.exit_code == 3 and not failed.ok and not failed.limit_hit
    assert missing.exit_code == 127 and "no-such-program" in missing.stderr


async def test_a_sandbox_that_hit_a_limit_is_replaced_not_reused(pool: WarmPool) -> None:
    replaced = pool.replaced
    async with pool.acquire() as sandbox:
        result = await sandbox.run(["sleep", "10"], timeout=0.5)
        tainted_name = sandbox.name  # type: ignore[attr-defined]
    assert result.timed_out and result.limit == "timeout" and result.exit_code is None
    assert 0.5 <= result.duration < 3
    assert pool.replaced == replaced + 1
    for _ in range(pool.size):
        async with pool.acquire() as sandbox:
            assert sandbox.name != tainted_name  # type: ignore[attr-defined]
            assert (await sandbox.run(["true"])).ok


async def test_sandboxes_run_concurrently(pool: WarmPool) -> None:
    async def sleeper() -> float:
        async with pool.acquire() as sandbox:
            return (await sandbox.run(["sleep", "1"])).duration

    loop = asyncio.get_running_loop()
    start = loop.time()
    durations = await asyncio.gather(*(sleeper() for _ in range(pool.size)))
    assert all(d >= 1 for d in durations)
    assert loop.time() - start < 1.9  # both 1 s sleeps overlapped


async def test_bad_arguments_are_clear_errors(pool: WarmPool) -> None:
    async with pool.acquire() as sandbox:
        with pytest.raises(SandboxError, match="non-empty list"):
            await sandbox.run("python3 main.py")  # type: ignore[arg-type]
        with pytest.raises(SandboxError, match="positive"):
            await sandbox.run(["true"], timeout=0)


async def test_unknown_setting_names_the_field() -> None:
    with pytest.raises(ConfigError, match="memroy_mb"):
        create_pool("process", memroy_mb=64)
    with pytest.raises(ConfigError, match="unknown sandbox backend"):
        create_pool("podman")  # type: ignore[arg-type]


async def test_acquire_before_start_is_an_error() -> None:
    pool = create_pool("process", size=1)
    with pytest.raises(SandboxError, match="not started"):
        async with pool.acquire():
            pass


async def test_docker_start_reaps_containers_of_dead_owners() -> None:
    require_backend("docker")
    import docker

    client = docker.from_env()
    dead_pid = 2**22 + 12345  # above pid_max: no live process can have it
    orphan = client.containers.create(
        "agentrl-sandbox:latest",
        command=["sleep", "60"],
        labels={
            LABEL: "1",
            f"{LABEL}.host": socket.gethostname(),
            f"{LABEL}.pid": str(dead_pid),
            f"{LABEL}.pid_start": "1",
            f"{LABEL}.pool": "crashed",
        },
    )
    try:
        async with create_pool("docker", size=1) as pool:
            assert isinstance(pool.backend, DockerBackend)
            ours = {"label": f"{LABEL}.pool={pool.backend.pool_id}"}
            assert len(client.containers.list(all=True, filters=ours)) == 1  # not mistaken for an orphan
        assert client.containers.list(all=True, filters={"label": f"{LABEL}.pool=crashed"}) == []
        assert client.containers.list(all=True, filters=ours) == []  # close() removed its own
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            orphan.remove(force=True)
        client.close()
