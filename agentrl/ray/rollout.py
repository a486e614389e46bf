"""`RayRollout`: the EnvManager's interface (`stream`, `run`, `stats`, `aclose`) over env workers.

    rollout = RayRollout(ManagerSpec("games/FrozenLake-v0", max_concurrency=4096),
                         PolicySpec("random"), workers=2)
    async for group in rollout.stream(range(4096)):   # any (async) iterable of seeds or Tasks
        buffer.add(group)
    await rollout.aclose()

What runs where: this object lives in the driver (the trainer or `agentrl rollout`). It starts
one `TaskQueue` actor pinned to the driver's node and `workers` `EnvWorker` actors placed with
Ray's SPREAD strategy (`num_cpus` alone would pack them onto one node), each running an
EnvManager with `max_concurrency / workers` episodes in flight. A feeder moves tasks from the
caller's source into the queue; one collector per worker long-polls `take()` and yields groups.

Accounting (`stats`, a `ManagerStats`) is kept here, per group, when the driver receives it:
its trajectories by stop reason plus its cancelled stragglers. A worker that dies takes its
unreported groups with it: each lease it held counts `group_size + redundancy` episodes as
ABORTED, and its task is queued again for the surviving workers (a new group, launched again).
So `launched == ended` when a stream completes, whatever died. Env steps are the workers' own
running totals (a dead worker's count stops at its last report).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any

from agentrl.errors import AgentRLError, InvalidArgumentError
from agentrl.ray.cluster import import_ray
from agentrl.ray.env_worker import EnvWorker, ManagerSpec, PolicySpec
from agentrl.ray.queue import Lease, TaskQueue
from agentrl.rollout.manager import ManagerStats, Task
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup

logger = logging.getLogger(__name__)

FEED_CHUNK = 256  # tasks per `put` from a synchronous source (an async one is fed one by one)


class RayRollout:
    """Plays groups on `workers` env-worker actors; see the module docstring."""

    def __init__(
        self,
        manager: ManagerSpec,
        policy: PolicySpec,
        *,
        workers: int = 2,
        cpus_per_worker: float = 1.0,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> None:
        if workers < 1:
            raise InvalidArgumentError(f"workers must be >= 1, got {workers}")
        self.spec = manager
        self.policy = policy
        self.workers = workers
        self.cpus_per_worker = cpus_per_worker
        self.on_trajectory = on_trajectory
        self.width = manager.group_size + manager.redundancy
        self.stats = ManagerStats()
        self.worker_nodes: dict[int, str] = {}
        self._prefix = uuid.uuid4().hex[:8]
        self._queue: Any = None
        self._actors: dict[int, Any] = {}
        self._env_steps: dict[int, int] = {}
        self._resampled: dict[int, int] = {}
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> RayRollout:
        """Create the queue and the workers (idempotent; `stream` calls it)."""
        if self._queue is not None:
            return self
        ray = import_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        per_worker = -(-self.spec.max_concurrency // self.workers)
        queue_cls = ray.remote(TaskQueue).options(
            num_cpus=0, scheduling_strategy=here, max_concurrency=self.workers * 4 + 16
        )
        self._queue = queue_cls.remote(
            self._prefix, max_pending=max(FEED_CHUNK, 2 * self.spec.max_concurrency)
        )
        worker_spec = ManagerSpec(**{**self.spec.__dict__, "max_concurrency": per_worker})
        worker_cls = ray.remote(EnvWorker).options(
            num_cpus=self.cpus_per_worker, scheduling_strategy="SPREAD", max_concurrency=1000
        )
        for worker_id in range(self.workers):
            self._actors[worker_id] = worker_cls.remote(worker_id, self._queue, worker_spec, self.policy)
        nodes = await asyncio.gather(*(actor.start.remote() for actor in self._actors.values()))
        self.worker_nodes = dict(zip(self._actors, nodes, strict=True))
        return self

    @property
    def resampled_turns(self) -> int:
        """Turns sampled again, whole, because the replica serving them died."""
        return sum(self._resampled.values())

    async def cpu_seconds(self) -> float:
        """CPU time used so far by the live workers' and the queue's processes (not Ray's daemons)."""
        actors = [*self._actors.values(), self._queue]
        seconds: list[float] = await asyncio.gather(*(actor.cpu_seconds.remote() for actor in actors))
        return sum(seconds)

    def actor(self, worker_id: int) -> Any:
        """The actor handle of one env worker (to inspect it, or to kill it in a fault test)."""
        return self._actors[worker_id]

    async def aclose(self) -> None:
        """Stop every worker and the queue; their running episodes are counted ABORTED here."""
        if self._closed:
            return
        self._closed = True
        ray = import_ray()
        for actor in self._actors.values():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(30):
                    ended = await actor.stop.remote()
                self.stats.launched += ended["aborted"]
                self.stats.by_reason[StopReason.ABORTED] += ended["aborted"]
                self.stats.groups_launched += ended["groups"]
            ray.kill(actor)
        if self._queue is not None:
            ray.kill(self._queue)

    async def __aenter__(self) -> RayRollout:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- streaming ------------------------------------------------------------------------

    async def run(self, tasks: AsyncIterable[int | Task] | Iterable[int | Task]) -> list[TrajectoryGroup]:
        return [group async for group in self.stream(tasks)]

    async def stream(
        self, tasks: AsyncIterable[int | Task] | Iterable[int | Task]
    ) -> AsyncIterator[TrajectoryGroup]:
        """Yield each group as the driver receives it (completion order, as EnvManager.stream)."""
        if self._closed:
            raise AgentRLError("RayRollout is closed")
        await self.start()
        out: asyncio.Queue[Any] = asyncio.Queue()
        feeder = asyncio.create_task(self._feed(tasks, out))
        collectors = {
            asyncio.create_task(self._collect(worker_id, actor, out))
            for worker_id, actor in self._actors.items()
        }
        live = len(collectors)
        try:
            while live:
                item = await out.get()
                if item is None:  # a collector finished
                    live -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
            if not self._actors:
                left = await self._queue.outstanding.remote()
                if left["pending"] or left["leased"]:
                    raise AgentRLError(f"every env worker died with work left ({left}); the rollout stops")
        finally:
            for task in (feeder, *collectors):
                task.cancel()
            await asyncio.gather(feeder, *collectors, return_exceptions=True)

    async def _feed(
        self, tasks: AsyncIterable[int | Task] | Iterable[int | Task], out: asyncio.Queue[Any]
    ) -> None:
        try:
            if isinstance(tasks, AsyncIterable):
                async for item in tasks:
                    await self._queue.put.remote([_as_task(item)])
            else:
                source = iter(tasks)
                while chunk := [_as_task(item) for item in itertools.islice(source, FEED_CHUNK)]:
                    await self._queue.put.remote(chunk)
            await self._queue.close.remote()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the task source failed: surface it to the consumer
            out.put_nowait(exc)

    async def _collect(self, worker_id: int, actor: Any, out: asyncio.Queue[Any]) -> None:
        ray = import_ray()
        try:
            while True:
                try:
                    reply = await actor.take.remote()
                except ray.exceptions.RayActorError as exc:
                    await self._worker_died(worker_id, exc)
                    return
                self._env_steps[worker_id] = reply["env_steps"]
                self._resampled[worker_id] = reply["resampled_turns"]
                self.stats.env_steps = sum(self._env_steps.values())
                groups: list[TrajectoryGroup] = reply["groups"]
                for group in groups:
                    self._account(group)
                if groups:
                    await self._queue.settle.remote([g.group_id for g in groups])
                for group in groups:
                    out.put_nowait(group)
                if reply["error"]:
                    out.put_nowait(AgentRLError(reply["error"]))
                    return
                if reply["done"]:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            out.put_nowait(exc)
        finally:
            out.put_nowait(None)

    def _account(self, group: TrajectoryGroup) -> None:
        ended = len(group.trajectories) + group.cancelled
        self.stats.launched += ended
        self.stats.groups_launched += 1
        self.stats.groups_completed += 1
        for trajectory in group.trajectories:
            self.stats.by_reason[trajectory.stop_reason] += 1
            if self.on_trajectory is not None:
                try:
                    self.on_trajectory(trajectory)
                except Exception:
                    logger.exception("on_trajectory hook raised; continuing")
        self.stats.by_reason[StopReason.CANCELLED] += group.cancelled

    async def _worker_died(self, worker_id: int, exc: BaseException) -> None:
        """Count the dead worker's leases as aborted groups and queue their tasks again."""
        lost: list[Lease] = await self._queue.requeue.remote(worker_id)
        del self._actors[worker_id]
        self.stats.groups_launched += len(lost)
        self.stats.launched += len(lost) * self.width
        self.stats.by_reason[StopReason.ABORTED] += len(lost) * self.width
        logger.warning(
            "env worker %d died (%s): %d running groups (%d episodes) aborted and queued again",
            worker_id,
            type(exc).__name__,
            len(lost),
            len(lost) * self.width,
        )


def _as_task(item: int | Task) -> Task:
    if isinstance(item, Task):
        return item
    if isinstance(item, int):
        return Task(seed=item)
    raise TypeError(f"a task source must yield int seeds or Task objects, got {type(item).__name__}")
