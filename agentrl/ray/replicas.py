"""Policy replicas as Ray actors, the router in front of them, and the pool that owns both.

What runs where:
- `PolicyReplica`: one actor per replica, holding an engine in its own process (the embedded
  `TorchEngine`, or `VLLMEngine` where vLLM is installed). Each sits in its own bundle of one
  placement group (`{"CPU": c, "GPU": g}` per bundle, SPREAD over nodes), so its resources are
  reserved before it starts and a restarted replica lands on the same reservation; the engine's
  own children inherit the group (`capture_child_tasks`).
- `Router`: one actor, pinned to the driver's node. Env workers ask it where each turn goes:
  the replica that served the episode's previous turn (it holds the KV prefix) while it lives,
  else the replica with the fewest turns in flight. Data never passes through it: the worker
  then calls that replica directly.
- `ReplicaPool`: in the driver (the trainer). It creates the group, the replicas and the router,
  fans every weight update out to all replicas with the learner's version, and restarts dead
  replicas (on the current weights and version) before the router sends them anything.

Weight updates and token versions: each engine applies an update between two decode steps and
stamps every token with the version of the weights that produced it. The router keeps sending
turns to a replica while it updates, and the token versions say exactly which tokens came
before and after (a turn spanning the update carries both). No token is ever stamped with a
version its weights did not have, which is the one promise the staleness buffer relies on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.errors import AgentRLError, InvalidArgumentError, PolicyError
from agentrl.generation import SamplingParams
from agentrl.ray.cluster import import_ray

logger = logging.getLogger(__name__)


class PolicyReplica:
    """One engine in one actor process. `start` must be awaited before `generate`."""

    def __init__(
        self, replica_id: int, model_dir: str, engine: str = "torch", threads: int | None = None
    ) -> None:
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.replica_id = replica_id
        self.model_dir = model_dir
        if engine == "torch":
            from agentrl.serving.engine import TorchEngine

            self.engine: Any = TorchEngine.from_pretrained(model_dir)
        elif engine == "vllm":
            from agentrl.serving.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(model_dir)
        else:
            raise AgentRLError(f"unknown engine {engine!r} (torch, vllm)")

    async def start(self, source: Mapping[str, Any] | str | None, version: int) -> dict[str, Any]:
        """Start the engine on `source` weights stamped `version` (None: the checkpoint, as is)."""
        import ray

        await self.engine.start()
        if source is not None or version != self.engine.version:
            await self.engine.update_weights(source if source is not None else self.model_dir, version)
        return {"node": ray.get_runtime_context().get_node_id(), "version": self.engine.version}

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, session_id: str | None
    ) -> dict[str, Any]:
        result = await self.engine.generate(prompt_token_ids, params, session_id=session_id)
        return dataclasses.asdict(result) | {"replica": self.replica_id}

    async def update_weights(self, source: Mapping[str, Any] | str, version: int) -> int:
        return int(await self.engine.update_weights(source, version))

    async def release(self, session_ids: list[str]) -> None:
        """Free the kept KV prefixes of ended episodes (the Engine protocol's `drop_sessions`)."""
        self.engine.drop_sessions(session_ids)

    async def load(self) -> dict[str, Any]:
        """Version, queue state and health (the pool's liveness probe): `health` is None while
        the engine works, else why not (an engine whose core died is restarted like a dead actor)."""
        return {
            "version": int(self.engine.version),
            "running": int(self.engine.running),
            "queued": int(self.engine.queue_depth),
            "health": self.engine.health(),
        }


class Router:
    """Least-loaded routing with session affinity; see the module docstring. An async actor."""

    def __init__(self, max_sessions: int = 200_000) -> None:
        self.max_sessions = max_sessions
        self._replicas: dict[int, Any] = {}
        self._incarnation: dict[int, int] = {}  # which start of the replica in a slot is live
        self._in_flight: dict[int, int] = {}
        self._versions: dict[int, int] = {}
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._dead: set[int] = set()
        self._changed = asyncio.Condition()
        self.routed = 0
        self.affine = 0

    async def add(self, replica_id: int, incarnation: int, handle: Any, version: int) -> None:
        """A replica is ready to serve (started, or restarted and brought to `version`)."""
        async with self._changed:
            self._replicas[replica_id] = handle
            self._incarnation[replica_id] = incarnation
            self._in_flight[replica_id] = 0
            self._versions[replica_id] = version
            self._dead.discard(replica_id)
            self._changed.notify_all()

    async def route(
        self, session_id: str | None, min_version: int = -1, timeout: float = 300.0
    ) -> tuple[int, int, Any]:
        """The replica for the next turn of `session_id`: (replica id, incarnation, handle).

        The episode's own replica while it lives (its versions only grow). Otherwise the least
        loaded replica known to be at `min_version` or newer (the newest version the episode has
        seen), so an episode that moves mid-update never steps back to older weights; waits (up
        to `timeout`) until there is one.
        """
        async with self._changed:
            chosen = self._sessions.get(session_id) if session_id is not None else None
            if chosen in self._replicas:
                self.affine += 1
            else:

                def eligible() -> list[int]:
                    return [r for r in self._replicas if self._versions[r] >= min_version]

                try:
                    async with asyncio.timeout(timeout):
                        await self._changed.wait_for(lambda: bool(eligible()))
                except TimeoutError:
                    raise PolicyError(
                        f"no live policy replica at version >= {min_version} for {timeout:.0f}s"
                    ) from None
                chosen = min(eligible(), key=lambda r: (self._in_flight[r], r))
            if session_id is not None:
                self._sessions[session_id] = chosen
                self._sessions.move_to_end(session_id)
                while len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
            self._in_flight[chosen] += 1
            self.routed += 1
            return chosen, self._incarnation[chosen], self._replicas[chosen]

    async def finish(self, replica_id: int, incarnation: int) -> None:
        if self._incarnation.get(replica_id) == incarnation and self._in_flight.get(replica_id, 0) > 0:
            self._in_flight[replica_id] -= 1

    async def set_load(self, replica_id: int, incarnation: int, load: int) -> None:
        """The replica's own count of turns running and queued, from the pool's probe.

        It replaces the router's count, which drifts when a caller dies between `route` and
        `finish` (an env worker killed mid-turn never reports its turns finished).
        """
        if self._incarnation.get(replica_id) == incarnation and replica_id in self._in_flight:
            self._in_flight[replica_id] = load

    async def report_dead(self, replica_id: int, incarnation: int) -> None:
        """Stop routing to a replica (a caller saw it die); its sessions go elsewhere next turn.

        A report about an earlier incarnation (a slow caller, after the restart) is ignored.
        """
        async with self._changed:
            if replica_id not in self._replicas or self._incarnation[replica_id] != incarnation:
                return
            del self._replicas[replica_id]
            self._in_flight.pop(replica_id, None)
            for session_id in [s for s, r in self._sessions.items() if r == replica_id]:
                del self._sessions[session_id]
            self._dead.add(replica_id)
            self._changed.notify_all()

    async def wait_dead(self, timeout: float) -> list[int]:
        """Replicas reported dead since the last call (waits up to `timeout` for one)."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(lambda: bool(self._dead))
            dead, self._dead = sorted(self._dead), set()
            return dead

    async def set_version(self, replica_id: int, version: int) -> None:
        async with self._changed:
            if replica_id in self._versions:
                self._versions[replica_id] = max(version, self._versions[replica_id])
                self._changed.notify_all()

    async def end_sessions(self, session_ids: list[str]) -> None:
        """Episodes ended: forget their affinity and free their kept prefixes on the replicas."""
        by_replica: dict[int, list[str]] = {}
        for session_id in session_ids:
            replica_id = self._sessions.pop(session_id, None)
            if replica_id in self._replicas:
                by_replica.setdefault(replica_id, []).append(session_id)
        for replica_id, ids in by_replica.items():
            self._replicas[replica_id].release.remote(ids)  # best effort, not awaited

    async def snapshot(self) -> dict[str, Any]:
        return {
            "live": sorted(self._replicas),
            "in_flight": dict(self._in_flight),
            "versions": dict(self._versions),
            "sessions": len(self._sessions),
            "routed": self.routed,
            "affine": self.affine,
        }


class ReplicaPool:
    """Replicas, router and placement for one run; lives in the driver. See the module docstring.

    Args:
        model_dir: the checkpoint every replica serves at start (same path on every node).
        replicas: how many engines.
        cpus_per_replica, gpus_per_replica: one placement-group bundle per replica.
        engine: "torch" (embedded) or "vllm".
        version: the version the starting weights carry (a resumed run continues its count).
        update_timeout: seconds a weight update may take on a replica before it is declared
            dead and restarted (a hung update must not hang training).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        replicas: int = 1,
        cpus_per_replica: float = 1.0,
        gpus_per_replica: float = 0.0,
        engine: str = "torch",
        version: int = 0,
        update_timeout: float = 300.0,
        probe_every: float = 1.0,
    ) -> None:
        if replicas < 1:
            raise InvalidArgumentError(f"replicas must be >= 1, got {replicas}")
        self.model_dir = str(Path(model_dir).resolve())
        self.replicas = replicas
        self.cpus = cpus_per_replica
        self.gpus = gpus_per_replica
        self.engine = engine
        self.version = version
        self.update_timeout = update_timeout
        self.probe_every = probe_every
        self.router: Any = None
        self.restarts = 0
        self.nodes: dict[int, str] = {}
        self._actors: dict[int, tuple[int, Any]] = {}  # replica id -> (incarnation, actor)
        self._incarnations = 0
        self._source: Any = None  # the newest weights (an object ref or a path); None: model_dir
        self._group: Any = None
        self._supervisor: asyncio.Task[None] | None = None

    async def start(self) -> ReplicaPool:
        ray = import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        bundle = {"CPU": self.cpus} | ({"GPU": self.gpus} if self.gpus else {})
        self._group = placement_group([bundle] * self.replicas, strategy="SPREAD")
        try:
            async with asyncio.timeout(120):
                await self._group.ready()
        except TimeoutError:
            raise AgentRLError(
                f"the cluster cannot place {self.replicas} replicas of {bundle}: see `ray status`"
            ) from None
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.router = (
            ray.remote(Router).options(num_cpus=0, scheduling_strategy=here, max_concurrency=10_000).remote()
        )
        await asyncio.gather(*(self._launch(replica_id) for replica_id in range(self.replicas)))
        self._supervisor = asyncio.create_task(self._supervise())
        return self

    def actor(self, replica_id: int) -> Any:
        """The actor handle of one replica (to inspect it, or to kill it in a fault test)."""
        return self._actors[replica_id][1]

    async def _launch(self, replica_id: int) -> None:
        """Start a replica in its bundle on the newest weights, then let the router use it."""
        ray = import_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        placement = PlacementGroupSchedulingStrategy(
            self._group, placement_group_bundle_index=replica_id, placement_group_capture_child_tasks=True
        )
        actor = (
            ray.remote(PolicyReplica)
            .options(
                num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=placement, max_concurrency=1000
            )
            .remote(replica_id, self.model_dir, self.engine, max(1, int(self.cpus)))
        )
        self._incarnations += 1
        incarnation = self._incarnations
        version = self.version
        try:
            info = await actor.start.remote(self._source, version)
        except BaseException:
            ray.kill(actor)
            raise
        self.nodes[replica_id] = info["node"]
        self._actors[replica_id] = (incarnation, actor)
        await self.router.add.remote(replica_id, incarnation, actor, version)
        if self.version != version:  # an update went out while this one was starting
            await self._update_one(replica_id, self._source, self.version)

    async def push(self, source: Mapping[str, Any] | str | Path, version: int) -> int:
        """Send new weights (a state dict, or a checkpoint dir on every node) to every replica.

        The state dict is put into the object store once; each replica reads it from there. A
        replica that fails or times out is restarted on these weights by the supervisor.
        """
        if version < self.version:
            raise AgentRLError(f"stale version {version}: the replicas are at version {self.version}")
        ray = import_ray()
        ref = str(source) if isinstance(source, str | Path) else ray.put(dict(source))
        self._source, self.version = ref, version
        await asyncio.gather(*(self._update_one(r, ref, version) for r in list(self._actors)))
        return version

    async def _update_one(self, replica_id: int, ref: Any, version: int) -> None:
        ray = import_ray()
        if replica_id not in self._actors:
            return  # down: the supervisor starts it on the newest weights
        incarnation, actor = self._actors[replica_id]
        try:
            async with asyncio.timeout(self.update_timeout):
                await actor.update_weights.remote(ref, version)
        except (TimeoutError, ray.exceptions.RayActorError) as exc:
            logger.warning("replica %d failed its weight update (%r); restarting it", replica_id, exc)
            ray.kill(actor)
            await self.router.report_dead.remote(replica_id, incarnation)
            return
        await self.router.set_version.remote(replica_id, version)

    async def _supervise(self) -> None:
        """Restart replicas reported dead; probe the others so an idle death is noticed too."""
        ray = import_ray()
        down: set[int] = set()
        while True:
            down.update(await self.router.wait_dead.remote(self.probe_every))
            for replica_id, (incarnation, actor) in list(self._actors.items()):
                if replica_id in down:
                    continue
                try:
                    async with asyncio.timeout(30):
                        load = await actor.load.remote()
                except (TimeoutError, ray.exceptions.RayActorError):
                    load = {"health": "no answer to the probe"}
                if load["health"] is not None:
                    logger.warning("policy replica %d is unhealthy: %s", replica_id, load["health"])
                    await self.router.report_dead.remote(replica_id, incarnation)
                    down.add(replica_id)
                    continue
                await self.router.set_load.remote(replica_id, incarnation, load["running"] + load["queued"])
            for replica_id in sorted(down):
                entry = self._actors.pop(replica_id, None)
                if entry is not None:
                    ray.kill(entry[1])
                logger.warning(
                    "policy replica %d is down; restarting it at version %d", replica_id, self.version
                )
                try:
                    await self._launch(replica_id)
                except Exception:
                    logger.exception("restarting replica %d failed; trying again", replica_id)
                    continue
                self.restarts += 1
                down.discard(replica_id)

    async def snapshot(self) -> dict[str, Any]:
        """The router's view (live replicas, loads, versions) plus restarts and the pushed version."""
        routing: dict[str, Any] = await self.router.snapshot.remote()
        return routing | {"restarts": self.restarts, "version": self.version}

    async def close(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
        self.stop()

    def stop(self) -> None:
        """Kill every replica and the router, free the placement group (no await: usable in a
        `finally` of synchronous code; a supervisor still running is cancelled, not awaited)."""
        ray = import_ray()
        if self._supervisor is not None:
            self._supervisor.cancel()
        for _, actor in self._actors.values():
            ray.kill(actor)
        if self.router is not None:
            ray.kill(self.router)
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
            self._group = None
        self._actors.clear()
        self.router = None

    async def __aenter__(self) -> ReplicaPool:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
