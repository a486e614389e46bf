"""A pool leaks nothing however it is interrupted, and its accounting always balances.

On both backends, each case ends by looking for what could be left behind: containers carrying
the pool's label (`docker ps -a`), or namespace processes and host dirs of this test process
(process backend); and by checking `pool.stats()`: created == alive + destroying + destroyed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import WarmPool, create_pool
from agentrl.sandbox.docker_backend import LABEL
from agentrl.sandbox.process_backend import DIR_PREFIX
from tests.sandbox_helpers import require_backend

BACKENDS = ["process", pytest.param("docker", marks=pytest.mark.docker)]
LIMIT_HIT = (["sh", "-c", "sleep 5"], 0.3)  # a run that times out, so its sandbox is replaced


def leftovers(backend: str, pool_id: str | None = None, owner_pid: int | None = None) -> list[str]:
    """What is left of the pool `pool_id` (Docker) or of the sandboxes of `owner_pid` (process)."""
    if backend == "docker":
        found = subprocess.run(
            ["docker", "ps", "-a", "--filter", f"label={LABEL}.pool={pool_id}", "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return [f"container {name}" for name in found]
    marker = f"{DIR_PREFIX}{owner_pid or os.getpid()}-"
    stray = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and marker.encode() in cmdline:
            stray.append(f"process {entry.name}")
    stray += [f"dir {path}" for path in Path("/tmp").glob(marker + "*")]
    return stray


def pool_id(pool: WarmPool) -> str | None:
    return getattr(pool.backend, "pool_id", None)


def assert_all_removed(pool: WarmPool, backend: str) -> None:
    stats = pool.stats()
    assert stats.balanced and stats.alive == stats.creating == stats.destroying == 0, stats
    assert stats.created == stats.destroyed, stats
    assert leftovers(backend, pool_id(pool)) == []


async def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def taint_all(pool: WarmPool) -> None:
    """Lend every sandbox to a run that hits its time limit, so that each is replaced on return."""

    async def one() -> None:
        async with pool.acquire() as sandbox:
            result = await sandbox.run(LIMIT_HIT[0], timeout=LIMIT_HIT[1])
            assert result.timed_out

    await asyncio.gather(*(one() for _ in range(pool.size)))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_close_while_replacements_are_being_created_leaves_nothing(backend: str) -> None:
    require_backend(backend)
    for _ in range(2):  # the leak this pins was reproduced twice in a row
        pool = create_pool(backend, size=3)
        await pool.start()
        await taint_all(pool)
        await wait_until(lambda p=pool: p.stats().creating > 0)  # replacements in flight
        await pool.close()
        assert pool.stats().replaced == 3
        assert_all_removed(pool, backend)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_cancelled_holders_leave_nothing_and_the_pool_recovers(backend: str) -> None:
    require_backend(backend)
    pool = create_pool(backend, size=2)
    await pool.start()
    started = asyncio.Event()

    async def holder() -> None:
        async with pool.acquire() as sandbox:
            started.set()
            await sandbox.run(["sh", "-c", "sleep 30"], timeout=60)

    holders = [asyncio.create_task(holder()) for _ in range(4)]  # two run, two wait to acquire
    await started.wait()
    await asyncio.sleep(0.3)
    for task in holders:
        task.cancel()
    results = await asyncio.gather(*holders, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    # The interrupted runs left their sandboxes mid-request: replaced, never lent again.
    await wait_until(lambda: pool.stats().replaced == 2 and pool.idle == 2)
    stats = pool.stats()
    assert stats.balanced and stats.alive == 2 and stats.destroyed == 2, stats
    if backend == "docker":
        assert len(leftovers(backend, pool_id(pool))) == 2  # exactly the two live ones
    async with pool.acquire() as sandbox:  # the replacements answer their own requests
        result = await sandbox.run(["python3", "-c", "print(6 * 7)"])
    assert result.ok and result.stdout == "42\n", result

    # An exception in the caller while holding: the sandbox goes back, the pool closes clean.
    with pytest.raises(ValueError, match="caller failed"):
        async with pool.acquire():
            raise ValueError("caller failed")
    await pool.close()
    assert_all_removed(pool, backend)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_close_ends_waiting_acquires_and_removes_lent_sandboxes(backend: str) -> None:
    require_backend(backend)
    pool = create_pool(backend, size=1)
    await pool.start()
    lent = asyncio.Event()

    async def holder() -> str:
        async with pool.acquire() as sandbox:
            lent.set()
            result = await sandbox.run(["sh", "-c", "sleep 30"], timeout=60)  # removed under it
        return "sandbox_error" if result.sandbox_error else "ran"

    async def waiter() -> None:
        async with pool.acquire():
            pass

    holding = asyncio.create_task(holder())
    await lent.wait()
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0.1)
    started = asyncio.get_running_loop().time()
    await pool.close()
    with pytest.raises(SandboxError, match="pool closed while waiting"):
        await waiting
    assert await holding == "sandbox_error"
    assert asyncio.get_running_loop().time() - started < 20  # not the 120 s acquire timeout
    assert_all_removed(pool, backend)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_cancelling_a_creation_at_any_point_leaves_nothing(backend: str) -> None:
    require_backend(backend)
    pool = create_pool(backend, size=1)
    await pool.backend.prepare()
    # The first few delays land inside the spawn itself (a process backend's `unshare` is being
    # started), where a cancel once left the namespace's first process running as an orphan.
    for delay in (0.0, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8):
        creation = asyncio.create_task(pool.backend.create())
        await asyncio.sleep(delay)
        creation.cancel()
        try:
            sandbox = await creation
        except asyncio.CancelledError:
            continue
        await sandbox.destroy()  # finished before the cancel arrived
    assert leftovers(backend, pool_id(pool)) == []
    await pool.backend.shutdown()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_cancelled_close_still_removes_everything(backend: str) -> None:
    require_backend(backend)
    pool = create_pool(backend, size=3)
    await pool.start()
    await taint_all(pool)
    closing = asyncio.create_task(pool.close())
    await asyncio.sleep(0.01)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing  # returns only once the close it started has finished
    assert_all_removed(pool, backend)


SIGINT_SCRIPT = """
import asyncio, os, signal
from agentrl.sandbox import create_pool

# A process started in the background by a non-interactive shell inherits SIGINT ignored, and
# Python then installs no KeyboardInterrupt handler: restore it, so this is Ctrl-C wherever the
# test suite itself was started from.
signal.signal(signal.SIGINT, signal.default_int_handler)

async def main():
    async with create_pool({backend!r}, size=3) as pool:
        print(getattr(pool.backend, "pool_id", ""), os.getpid(), flush=True)
        async def taint():
            async with pool.acquire() as sandbox:
                await sandbox.run(["sh", "-c", "sleep 5"], timeout=0.3)
        await asyncio.gather(*(taint() for _ in range(3)))
        while pool.stats().creating == 0:
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while replacements are being created
        await asyncio.sleep(60)

asyncio.run(main())
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_ctrl_c_while_replacing_leaves_nothing(backend: str) -> None:
    require_backend(backend)
    script = textwrap.dedent(SIGINT_SCRIPT.format(backend=backend))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "KeyboardInterrupt" in done.stderr, done.stderr
    pool_id_text, pid = done.stdout.split()[:2] if backend == "docker" else ("", done.stdout.split()[0])
    assert leftovers(backend, pool_id_text or None, owner_pid=int(pid)) == []
