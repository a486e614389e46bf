"""`ShardedAsyncClient`: many small httpx connection pools used as one.

Why not one `httpx.AsyncClient` with a big pool: httpcore walks every connection of a pool (and
polls each idle socket to see whether it expired) each time a request starts or ends, so the
client-side cost of one request grows with the number of requests in flight. Rollouts keep 64 to
thousands of generate requests open at once; with one pool of 64+ connections that walk was half
of the trainer process's CPU during rollout (py-spy of a guess_number training run). Small pools
keep the walk short: a request goes to the least busy pool, and a new pool is opened only when
every existing one is full, so a client that never has many requests in flight holds one pool.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from agentrl.errors import InvalidArgumentError, PolicyError


class ShardedAsyncClient:
    """The `request` / `post` subset of `httpx.AsyncClient` (what `PolicyClient` uses), over small pools."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        max_connections: int = 1024,
        connections_per_pool: int = 8,
    ) -> None:
        if max_connections < 1 or connections_per_pool < 1:
            raise InvalidArgumentError("max_connections and connections_per_pool must be at least 1")
        self.base_url = httpx.URL(base_url)
        self.timeout = timeout
        self.per_pool = min(connections_per_pool, max_connections)
        self.max_pools = -(-max_connections // self.per_pool)
        self._pools: list[httpx.AsyncClient] = []
        self._in_flight: list[int] = []
        self._closed = False

    def _pick(self) -> int:
        """The least busy pool; a new one when all are full and the connection budget allows."""
        if self._pools:
            index = min(range(len(self._pools)), key=self._in_flight.__getitem__)
            if self._in_flight[index] < self.per_pool or len(self._pools) == self.max_pools:
                return index
        limits = httpx.Limits(max_connections=self.per_pool, max_keepalive_connections=self.per_pool)
        self._pools.append(httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout, limits=limits))
        self._in_flight.append(0)
        return len(self._pools) - 1

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        if self._closed:
            raise PolicyError("the client has been closed")
        index = self._pick()
        self._in_flight[index] += 1
        try:
            return await self._pools[index].request(method, url, **kwargs)
        finally:
            self._in_flight[index] -= 1

    async def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.request("POST", url, **kwargs)

    @property
    def pools(self) -> int:
        return len(self._pools)

    async def aclose(self) -> None:
        self._closed = True
        pools, self._pools, self._in_flight = self._pools, [], []
        await asyncio.gather(*(pool.aclose() for pool in pools))
