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
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandbox._client import RunnerSandbox
from agentrl.sandbox._shield import finish_despite_cancel
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


@dataclass(frozen=True)
class PoolStats:
    """A pool's own accounting; `balanced` holds at every moment, not only at rest.

    Every sandbox whose creation finished is counted once in `created`, then is `alive` (idle,
    lent out or being reset) until its removal starts, `destroying` while it runs, `destroyed`
    after. So `created == alive + destroying + destroyed`; after `close()` alive, creating and
    destroying are 0, i.e. everything ever created was removed.
    """

    created: int  # creations that finished (a replacement counts again)
    replaced: int  # sandboxes removed because a run tainted them or their reset failed
    destroyed: int  # removals that finished (replaced ones and those removed at close)
    alive: int
    idle: int
    creating: int  # creations in flight
    destroying: int  # removals in flight

    @property
    def balanced(self) -> bool:
        return self.created == self.alive + self.destroying + self.destroyed


class WarmPool(SandboxPool):
    """Keeps `config.size` sandboxes; `acquire()` lends one, reset or replaced on return.

    Lifecycle guarantees (pinned by tests/test_sandbox_lifecycle.py): a creation or removal that
    is cancelled (pool close, a cancelled holder, Ctrl-C, an exception in the caller) still ends
    with the sandbox gone (see `_shield.py` and the backends' `create`/`destroy`); `close()`
    waits for creations and releases in flight and removes what they made.
    """

    def __init__(self, backend: Backend, config: SandboxConfig) -> None:
        self.backend = backend
        self.config = config
        self._idle: asyncio.Queue[RunnerSandbox] = asyncio.Queue()
        self._alive: set[RunnerSandbox] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # refills and releases in flight
        self._limiter = RateLimiter(config.creates_per_second, config.max_concurrent_creates)
        self._started = False
        self._closed = False
        self._closing = asyncio.Event()
        self._close_task: asyncio.Future[None] | None = None
        self._last_error: BaseException | None = None
        self.created = 0
        self.replaced = 0
        self.destroyed = 0
        self._creating = 0
        self._destroying = 0

    @property
    def size(self) -> int:
        return self.config.size

    @property
    def idle(self) -> int:
        return self._idle.qsize()

    def stats(self) -> PoolStats:
        return PoolStats(
            created=self.created,
            replaced=self.replaced,
            destroyed=self.destroyed,
            alive=len(self._alive),
            idle=self._idle.qsize(),
            creating=self._creating,
            destroying=self._destroying,
        )

    async def start(self) -> None:
        if self._started:
            return
        if self._closed:
            raise SandboxError("this pool was closed; create a new one")
        await self.backend.prepare()
        self._started = True
        try:
            results = await asyncio.gather(
                *(self._add_one() for _ in range(self.size)), return_exceptions=True
            )
        except BaseException:  # cancelled or failed start: `async with` will not call close() for us
            await self.close()
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if len(errors) == len(results):
            await self.close()
            raise SandboxError(
                f"{self.backend.name} pool: no sandbox could be created: {errors[0]}"
            ) from errors[0]
        for _ in errors:  # partial failure: keep what started, retry the rest in the background
            self._spawn(self._refill())

    async def _add_one(self) -> None:
        async with self._limiter.slot():
            if self._closed:
                return
            self._creating += 1
            try:
                sandbox = await self.backend.create()  # cleans up after itself if cancelled
            finally:
                self._creating -= 1
        # No await between the creation and this bookkeeping: nothing can slip through.
        self.created += 1
        self._alive.add(sandbox)
        if self._closed:  # closed while this creation was in flight: close() waits for us
            await self._discard(sandbox)
            return
        self._idle.put_nowait(sandbox)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `work` as a task that `close()` waits for."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
                with contextlib.suppress(TimeoutError):  # close() ends the wait early
                    await asyncio.wait_for(self._closing.wait(), delay)
                delay = min(delay * 2, 10.0)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[RunnerSandbox]:
        if not self._started:
            raise SandboxError("pool not started: `await pool.start()` or `async with pool:` first")
        if self._closed:
            raise SandboxError("pool is closed")
        sandbox = await self._next_idle()
        try:
            yield sandbox
        finally:
            # A task of the pool's own: a cancelled holder returns at once, the sandbox is still
            # reset or replaced, and close() waits for that to finish.
            await asyncio.shield(self._spawn(self._release(sandbox)))

    async def _next_idle(self) -> RunnerSandbox:
        """The next idle sandbox; a `SandboxError` on timeout or when the pool closes meanwhile."""
        getter = asyncio.ensure_future(self._idle.get())
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait(
                {getter, closing}, timeout=self.config.acquire_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:  # cancelled while waiting: a sandbox it got meanwhile goes back
            self._give_back_or_cancel(getter)
            raise
        finally:
            closing.cancel()
        if getter.done() and not getter.cancelled() and not self._closed:
            return getter.result()
        self._give_back_or_cancel(getter)  # closed at the same moment: close() removes it
        if self._closed:
            raise SandboxError("pool closed while waiting for a sandbox")
        why = f"; last creation error: {self._last_error}" if self._last_error else ""
        raise SandboxError(f"no sandbox free after {self.config.acquire_timeout}s{why}")

    def _give_back_or_cancel(self, getter: asyncio.Future[RunnerSandbox]) -> None:
        if getter.done() and not getter.cancelled():
            self._idle.put_nowait(getter.result())
        else:
            getter.cancel()

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
            except BaseException:  # cancelled mid-reset (Ctrl-C): remove it, then go on unwinding
                await self._discard(sandbox)
                raise
        if sandbox.tainted:
            self.replaced += 1
            await self._discard(sandbox)
            if not self._closed:
                self._spawn(self._refill())
        elif self._closed:  # closed during the reset
            await self._discard(sandbox)
        else:
            self._idle.put_nowait(sandbox)

    async def _discard(self, sandbox: RunnerSandbox) -> None:
        """Remove a sandbox; counted once however many paths reach it (release and close)."""
        if sandbox not in self._alive:
            await sandbox.destroy()  # idempotent: no second removal, no second count
            return
        self._alive.discard(sandbox)
        self._destroying += 1
        try:
            await sandbox.destroy()
        finally:
            self._destroying -= 1
            self.destroyed += 1

    async def close(self) -> None:
        """Remove every sandbox, after the creations and releases in flight have finished.

        Idempotent; concurrent callers all wait for the same close.
        """
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close())
        await finish_despite_cancel(self._close_task)

    async def _close(self) -> None:
        self._closed = True
        self._closing.set()
        try:
            await self._wait_for_tasks()
        finally:  # even when cancelled: whatever exists now is removed
            while not self._idle.empty():
                self._idle.get_nowait()
            await asyncio.gather(*(self._discard(s) for s in list(self._alive)), return_exceptions=True)
            await self._wait_for_tasks()  # a creation that finished meanwhile removes its sandbox
            await self.backend.shutdown()

    async def _wait_for_tasks(self) -> None:
        # asyncio.wait, not gather: cancelling close() must not cancel the creations it waits for.
        while self._tasks:
            await asyncio.wait(list(self._tasks))
