"""Finish cleanup work even when the task doing it is cancelled.

WHY: a sandbox is an outside resource (a container, a process namespace). If the task that creates
or removes one is cancelled half-way (a pool closing, a holder cancelled, Ctrl-C, which makes
`asyncio.run` cancel every task once), the engine may already have made the container, or the
removal may never be sent. So the steps that make or remove a sandbox run to their end: the
cancellation is remembered and raised again once the step is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def finish_despite_cancel(work: Awaitable[T]) -> T:
    """Await `work` to its end; if the caller is cancelled meanwhile, re-raise that afterwards.

    `work` should be a future that no one else cancels (e.g. an executor future, which
    `asyncio.run` does not cancel at shutdown, unlike tasks).
    """
    future = asyncio.ensure_future(work)
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.cancelled():  # the work itself was cancelled, not just this caller
                raise
            cancelled = True
        except BaseException:
            break  # the work failed: its exception is raised below (or the cancellation is)
    if cancelled:
        if not future.cancelled():
            future.exception()  # mark it retrieved: the caller's cancellation wins
        raise asyncio.CancelledError
    return future.result()
