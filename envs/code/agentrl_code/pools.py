"""One sandbox pool per backend and event loop, shared by every code env on that loop.

Why shared: an env manager runs hundreds of code envs at once; if each started its own pool,
each would start its own containers. Instead the first env that needs a sandbox starts the pool,
the others borrow it, and the last env to close shuts it down (reference counting). Pools are
kept per event loop because a pool's queues and locks belong to the loop that created them
(the sync `reset`/`step` adapters give every env a private loop).
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field

from agentrl.sandbox import SandboxPool, create_pool


@dataclass
class _Shared:
    pool: SandboxPool | None = None
    refs: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Shared]] = (
    weakref.WeakKeyDictionary()
)


async def acquire_shared_pool(backend: str = "auto", size: int = 4) -> SandboxPool:
    """A started pool for `backend` on the running loop; pair every call with `release_shared_pool`.

    `size` applies when this call starts the pool; later callers share it as it is.
    """
    shared = _by_loop.setdefault(asyncio.get_running_loop(), {}).setdefault(backend, _Shared())
    async with shared.lock:
        if shared.pool is None:
            pool = create_pool(backend=backend, size=size)
            await pool.start()
            shared.pool = pool
        shared.refs += 1
        return shared.pool


async def release_shared_pool(pool: SandboxPool) -> None:
    """Give back a reference from `acquire_shared_pool`; the last one closes the pool."""
    pools = _by_loop.get(asyncio.get_running_loop(), {}).values()
    shared = next((entry for entry in pools if entry.pool is pool), None)
    if shared is None:  # not a shared pool of this loop: nothing to give back
        return
    async with shared.lock:
        shared.refs -= 1
        if shared.refs > 0:
            return
        shared.pool = None  # the next acquire starts a fresh pool
        await pool.close()


def shared_pool_refs(backend: str) -> int:
    """How many envs on the running loop hold the shared pool of `backend` (for tests and stats)."""
    shared = _by_loop.get(asyncio.get_running_loop(), {}).get(backend)
    return shared.refs if shared is not None and shared.pool is not None else 0
