"""A warm pool of sandboxes: kept at its size, rate-limited creation, replace-on-taint.

Backend-independent: a backend only says how to create one sandbox and how to reap what an
earlier crashed run left behind. WHY a pool at all: creating a sandbox (a container start, a
namespace setup) costs 0.3-1 s; a run in a ready sandbox costs a few ms plus the program itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from agentrl.errors import SandboxError
from agentrl.sandbox._client import RunnerSandbox
from agentrl.sandbox.base import SandboxPool
from agentrl.sandbox.config import SandboxConfig

log = logging.getLogger(__name__)


class Backend(ABC):
    """How to make sandboxes of one kind."""

    name: str

    @abstractmethod
    async def prepare(self) -> None:
        """Check prerequisites and reap sandboxes left by crashed runs. Called once per pool start."""

    @abstractmethod
    async def create(self) -> RunnerSandbox:
        """Create one sandbox whose runner has answered a ping."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Release backend-wide resources (clients, thread pools) after every sandbox is gone."""


class RateLimiter:
    """At most `rate` starts per second, at most `concurrency` in progress.

    WHY: refilling after a burst of tainted sandboxes (a batch of fork bombs) must not hammer the
    engine with dozens of simultaneous container creations.
    """

    def __init__(self, rate: float, concurrency: int) -> None:
        self._interval = 1.0 / rate
        self._next = 0.0
        self._lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(concurrency)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with self._slots:
            async with self._lock:
                now = time.monotonic()
                wait = self._next - now
                self._next = max(now, self._next) + self._interval
            if wait > 0:
                await asyncio.sleep(wait)
            yield


class WarmPool(SandboxPool):
    """Keeps `config.size` sandboxes; `acquire()` lends one, reset or replaced on return."""

    def __init__(self, backend: Backend, config: SandboxConfig) -> None:
        self.backend = backend
        self.config = config
        self._idle: asyncio.Queue[RunnerSandbox] = asyncio.Queue()
        self._alive: set[RunnerSandbox] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._limiter = RateLimiter(config.creates_per_second, config.max_concurrent_creates)
        self._started = False
        self._closed = False
        self._last_error: BaseException | None = None
        self.created = 0  # sandboxes created over the pool's life (a replaced one counts again)
        self.replaced = 0

    @property
    def size(self) -> int:
        return self.config.size

    @property
    def idle(self) -> int:
        return self._idle.qsize()

    async def start(self) -> None:
        if self._started:
            return
        if self._closed:
            raise SandboxError("this pool was closed; create a new one")
        await self.backend.prepare()
        self._started = True
        results = await asyncio.gather(*(self._add_one() for _ in range(self.size)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if len(errors) == len(results):
            await self.close()
            raise SandboxError(
                f"{self.backend.name} pool: no sandbox could be created: {errors[0]}"
            ) from errors[0]
        for _ in errors:  # partial failure: keep what started, retry the rest in the background
            self._spawn_refill()

    async def _add_one(self) -> None:
        async with self._limiter.slot():
            if self._closed:
                return
            sandbox = await self.backend.create()
        self.created += 1
        if self._closed:
            await sandbox.destroy()
            return
        self._alive.add(sandbox)
        self._idle.put_nowait(sandbox)

    def _spawn_refill(self) -> None:
        task = asyncio.get_running_loop().create_task(self._refill())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refill(self) -> None:
        delay = 0.5
        while not self._closed:
            try:
                await self._add_one()
                self._last_error = None
                return
            except Exception as exc:  # retried with backoff; surfaced by acquire() if it persists
                self._last_error = exc
                log.warning(
                    "%s pool: creating a sandbox failed (%s); retrying in %.1fs",
                    self.backend.name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[RunnerSandbox]:
        if not self._started:
            raise SandboxError("pool not started: `await pool.start()` or `async with pool:` first")
        if self._closed:
            raise SandboxError("pool is closed")
        try:
            sandbox = await asyncio.wait_for(self._idle.get(), self.config.acquire_timeout)
        except TimeoutError:
            why = f"; last creation error: {self._last_error}" if self._last_error else ""
            raise SandboxError(f"no sandbox free after {self.config.acquire_timeout}s{why}") from None
        try:
            yield sandbox
        finally:
            # Shielded: a cancelled holder must still hand the sandbox back (or have it replaced).
            await asyncio.shield(self._release(sandbox))

    async def _release(self, sandbox: RunnerSandbox) -> None:
        if self._closed:
            await self._discard(sandbox)
            return
        if not sandbox.tainted:
            try:
                await sandbox.reset(self.config.reset_timeout)
            except SandboxError as exc:
                log.warning(
                    "%s pool: reset of %s failed (%s); replacing it", self.backend.name, sandbox.name, exc
                )
                sandbox.tainted = True
        if sandbox.tainted:
            self.replaced += 1
            await self._discard(sandbox)
            self._spawn_refill()
        else:
            self._idle.put_nowait(sandbox)

    async def _discard(self, sandbox: RunnerSandbox) -> None:
        self._alive.discard(sandbox)
        await sandbox.destroy()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while not self._idle.empty():
            self._idle.get_nowait()
        await asyncio.gather(*(sandbox.destroy() for sandbox in list(self._alive)), return_exceptions=True)
        self._alive.clear()
        await self.backend.shutdown()
