"""An asyncio event loop on a virtual clock: when no callback is ready, time jumps to the next
timer instead of sleeping.

Why: a modelled workload (a latency-model engine, envs that `asyncio.sleep` their latency, a
simulated trainer) is all timers. On the virtual clock an hour of it runs in the seconds the Python
bookkeeping takes, and 8192 concurrent envs on 2 shared cores give the same figures as on an idle
machine, because CPU time is not time here. The price, stated wherever figures come from it: the
CPU cost of the manager, client and buffer themselves is not modelled (it counts as zero).

Only timers and callbacks are supported: real I/O (sockets, subprocesses) and threads
(`asyncio.to_thread`) cannot be awaited on a virtual clock, and a simulation that waits for
nothing at all raises instead of hanging.

    result = run_virtual(main())      # like asyncio.run, on the virtual clock
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

from agentrl.errors import AgentRLError

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Instead of blocking for `timeout`, advances the loop's virtual clock by it."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise AgentRLError(
                "virtual clock: nothing is scheduled and nothing can wake the loop (a deadlock, or "
                "real I/O or a thread awaited inside a simulation)"
            )
        self.loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """`time()` starts at 0 and moves only when the loop would otherwise sleep."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._virtual_now += seconds


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on a fresh virtual-clock loop."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(coro)
