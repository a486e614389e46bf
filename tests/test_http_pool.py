"""ShardedAsyncClient: requests spread over small pools, a new pool only when all are full."""

from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentrl.errors import PolicyError
from agentrl.rollout.http_pool import ShardedAsyncClient
from tests.policy_server_helpers import serve_app


async def test_pools_grow_only_when_full_and_stay_within_the_connection_budget():
    release = asyncio.Event()
    in_flight = 0
    peak = 0

    async def slow(request):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await release.wait()
        in_flight -= 1
        return JSONResponse({"n": request.query_params["n"]})

    app = Starlette(routes=[Route("/slow", slow)])
    async with serve_app(app) as url:
        client = ShardedAsyncClient(url, timeout=30, max_connections=12, connections_per_pool=4)
        release.set()
        for i in range(3):
            assert (await client.request("GET", "/slow", params={"n": i})).json() == {"n": str(i)}
        assert client.pools == 1  # one request at a time never opens a second pool
        release.clear()
        calls = [asyncio.create_task(client.request("GET", "/slow", params={"n": i})) for i in range(20)]
        while in_flight < 12:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert client.pools == 3 and in_flight == 12  # 12 connections in 3 pools; 8 requests queue
        release.set()
        responses = await asyncio.gather(*calls)
        assert [r.json()["n"] for r in responses] == [str(i) for i in range(20)]
        assert peak == 12 and client.pools == 3
        await client.aclose()
        with pytest.raises(PolicyError, match="closed"):
            await client.post("/slow")
