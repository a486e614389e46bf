"""`RoutedPolicy`: the LLM policy of an env worker when the policy runs as Ray replicas.

It is the `PolicyClient` (same per-episode token ledger: each turn appends only the new
messages' tokens, history is never re-tokenized) with a different transport: instead of one
HTTP server, each turn asks the router which replica to use (the one holding the episode's KV
prefix, else the least loaded), then calls that replica directly.

Faults: if the replica dies during the turn, the router is told, and the whole turn is sampled
again, from the same exact token prefix, on another replica. Nothing of the lost attempt is in
the episode (the ledger only grows when a turn succeeds), so the episode's tokens stay exact;
the re-sampled tokens carry the version of the replica that sampled them. A turn still
unanswered after `turn_timeout` seconds raises `TimeoutError`, which ends the episode as
TIMEOUT (the manager's rule for a policy's own deadline).

The inherited HTTP pool is never used here (nothing is sent to `base_url`); the subclass exists
so that the token layout has one implementation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentrl.errors import PolicyError
from agentrl.generation import SamplingParams
from agentrl.ray.cluster import import_ray
from agentrl.rollout.client import RELEASE_DELAY, PolicyClient

UNUSED_URL = "http://replicas.invalid"  # PolicyClient wants a base URL; this transport sends none


class RoutedPolicy(PolicyClient):
    def __init__(
        self,
        router: Any,
        tokenizer: str | Path,
        *,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        turn_timeout: float = 600.0,
        max_reroutes: int = 8,
    ) -> None:
        super().__init__(UNUSED_URL, tokenizer, sampling=sampling, seed=seed, max_connections=1)
        self.router = router
        self.turn_timeout = turn_timeout
        self.max_reroutes = max_reroutes
        self.resampled_turns = 0  # turns sampled again because their replica died
        self._floors: dict[str, int] = {}  # per episode: the newest version among its tokens

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, session_id: str | None = None
    ) -> dict[str, Any]:
        ray = import_ray()
        for _ in range(self.max_reroutes + 1):
            floor = self._floors.get(session_id, -1) if session_id is not None else -1
            replica_id, incarnation, replica = await self.router.route.remote(session_id, floor)
            reply = replica.generate.remote(prompt_token_ids, params, session_id)
            try:
                async with asyncio.timeout(self.turn_timeout):
                    result: dict[str, Any] = await reply
                if session_id is not None and result["versions"]:
                    self._floors[session_id] = max(floor, *result["versions"])
                return result
            except TimeoutError:
                ray.cancel(reply)
                raise TimeoutError(
                    f"turn exceeded turn_timeout={self.turn_timeout}s on policy replica {replica_id}"
                ) from None
            except ray.exceptions.RayActorError:
                self.router.report_dead.remote(replica_id, incarnation)
                self.resampled_turns += 1
            finally:
                self.router.finish.remote(replica_id, incarnation)
        raise PolicyError(f"no policy replica answered after {self.max_reroutes} reroutes")

    async def end_episode(self, episode_id: str) -> None:
        self._floors.pop(episode_id, None)
        await super().end_episode(episode_id)

    async def _release_sessions(self) -> None:
        """Ended episodes: the router drops their affinity and frees their prefixes (best effort).

        Batched as in `PolicyClient`: a group ends together, so it costs one router call.
        """
        await asyncio.sleep(RELEASE_DELAY)
        ids, self._ended = self._ended, []
        if ids:
            self.router.end_sessions.remote(ids)
