"""The one task queue of a Ray rollout: groups go out to env workers as leases.

The driver `put`s tasks; each env worker's EnvManager pulls with `get` only when it has room
for a whole group (the manager's own back-pressure), so the queue never hands a worker more than
it can run. A task handed out is a *lease* (its id becomes the group's id) until the driver,
having received the finished group, calls `settle`. When a worker dies, `requeue` puts its
unsettled leases back at the front of the queue, for the surviving workers, under new ids.

`get` returns no lease (the worker's task source ends) only when the driver has closed the queue,
nothing is pending and no lease is outstanding: while any lease is out, the worker holding it
may still die and its groups may need a home, so idle workers keep waiting.

A plain class: `agentrl.ray.rollout` makes it an async actor (one per rollout, pinned to the
driver's node, with enough concurrency for every worker's waiting `get`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from agentrl.rollout.manager import Task


@dataclass(frozen=True)
class Lease:
    lease_id: str
    worker_id: int
    task: Task


class TaskQueue:
    def __init__(self, prefix: str, max_pending: int) -> None:
        self.prefix = prefix
        self.max_pending = max_pending
        self._pending: deque[Task] = deque()
        self._leases: dict[str, Lease] = {}
        self._counter = 0
        self._closed = False
        self._dead: set[int] = set()  # workers given up on: no lease may go to them any more
        self._changed = asyncio.Condition()

    async def put(self, tasks: list[Task]) -> None:
        """Add tasks; waits while `max_pending` are already waiting (the driver's back-pressure)."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._pending) < self.max_pending)
            self._pending.extend(tasks)
            self._changed.notify_all()

    async def close(self) -> None:
        """No more tasks will be put."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    async def get(self, worker_id: int, max_tasks: int = 1) -> list[Lease]:
        """Up to `max_tasks` tasks for `worker_id` (at least one), as leases; [] once all work is settled.

        A worker asks for as many as it has room for, so one round trip starts many groups.
        """
        async with self._changed:
            await self._changed.wait_for(lambda: self._pending or self._drained() or worker_id in self._dead)
            if worker_id in self._dead:  # a call the worker made before it died, still waiting here
                return []
            leases: list[Lease] = []
            while self._pending and len(leases) < max_tasks:
                task = self._pending.popleft()
                self._counter += 1
                lease_id = f"{self.prefix}-g{self._counter}"
                lease = Lease(lease_id, worker_id, Task(task.seed, task.options, group_id=lease_id))
                self._leases[lease_id] = lease
                leases.append(lease)
            self._changed.notify_all()  # a `put` may be waiting for room
            return leases

    async def settle(self, lease_ids: list[str]) -> None:
        """The driver received these groups: their leases are done."""
        async with self._changed:
            for lease_id in lease_ids:
                self._leases.pop(lease_id, None)
            self._changed.notify_all()

    async def requeue(self, worker_id: int) -> list[Lease]:
        """A worker died: put its unsettled tasks back first in line; return its lost leases.

        The worker is also barred from new leases: a `get` it sent before dying may still be
        waiting here, and must not take one of the tasks just put back.
        """
        async with self._changed:
            self._dead.add(worker_id)
            lost = [lease for lease in self._leases.values() if lease.worker_id == worker_id]
            for lease in lost:
                del self._leases[lease.lease_id]
            self._pending.extendleft(Task(le.task.seed, le.task.options) for le in reversed(lost))
            self._changed.notify_all()
            return lost

    async def outstanding(self) -> dict[str, int]:
        """Leases out and tasks waiting (for progress and tests)."""
        return {"leased": len(self._leases), "pending": len(self._pending)}

    async def cpu_seconds(self) -> float:
        return time.process_time()

    def _drained(self) -> bool:
        return self._closed and not self._pending and not self._leases
