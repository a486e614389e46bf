"""Load behaviour of the real server: cancelled clients free their slots, a burst's memory goes back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from agentrl.serving.engine import TorchEngine
from agentrl.serving.server import create_app
from tests.policy_server_helpers import serve_app


async def wait_for(predicate, timeout: float) -> float:
    """Seconds until `predicate()` (async) is true; fails after `timeout`."""
    t0 = time.perf_counter()
    while not await predicate():
        assert time.perf_counter() - t0 < timeout, "condition not reached in time"
        await asyncio.sleep(0.01)
    return time.perf_counter() - t0


async def test_64_cancelled_requests_free_their_slots_within_a_second(ckpt, tokenizer):
    engine = TorchEngine.from_pretrained(ckpt)
    engine.eos_token_ids = frozenset()  # nothing ends early: only the cancel can stop them
    limits = httpx.Limits(max_connections=128)
    async with (
        serve_app(create_app(engine, tokenizer, "tiny")) as url,
        httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http,
    ):
        plain = {"prompt_token_ids": list(range(5, 13)), "max_tokens": 1900}
        stream = {"prompt": list(range(5, 13)), "max_tokens": 1900, "stream": True}

        async def streamed() -> None:
            async with http.stream("POST", "/v1/completions", json=stream) as r:
                async for _ in r.aiter_bytes():
                    pass

        tasks = [asyncio.create_task(http.post("/v1/generate", json=plain)) for _ in range(56)]
        tasks += [asyncio.create_task(streamed()) for _ in range(8)]

        async def all_running() -> bool:
            return engine.running == 64

        await wait_for(all_running, 60)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

        async def none_running() -> bool:
            return (await http.get("/metrics")).json()["running"] == 0

        elapsed = await wait_for(none_running, 5)
        print(f"64 requests cancelled: running 0 after {elapsed:.3f} s")
        assert elapsed < 1.0, elapsed
        metrics = (await http.get("/metrics")).json()
        assert metrics["cancelled"] == 64 and metrics["engine"]["finished"] == 0
        assert metrics["disconnected"] == 64 and metrics["requests"].get("generate", 0) == 0


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


BURST_GROWTH_BOUND_MIB = 64  # RSS may stay at most this much above its level before the burst


async def test_a_burst_gives_its_memory_back(ckpt, tokenizer):
    """256 concurrent requests grow the KV cache to 256 rows x 512 positions (256 MiB for the tiny
    model); once the engine is idle, the process's RSS is back within the bound of its start.
    (One prompt for all: admitted together they share one prefill, which keeps the test fast.)"""
    engine = TorchEngine.from_pretrained(ckpt)
    engine.eos_token_ids = frozenset()
    body = {"prompt_token_ids": list(range(5, 305)), "max_tokens": 4, "temperature": 1.0}
    limits = httpx.Limits(max_connections=300)
    async with (
        serve_app(create_app(engine, tokenizer, "tiny")) as url,
        httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http,
    ):
        await http.post("/v1/generate", json=body)  # warm up: first-use allocations are not the burst's
        await asyncio.sleep(0.2)
        before = peak = rss_mib()
        sent = asyncio.gather(*(http.post("/v1/generate", json=body) for _ in range(256)))
        while not sent.done():
            peak = max(peak, rss_mib())
            await asyncio.sleep(0.01)
        assert all(r.status_code == 200 for r in await sent)
        await asyncio.sleep(0.2)
        after = rss_mib()
        shrinks = (await http.get("/metrics")).json()["engine"]["cache_shrinks"]
    print(f"RSS before the burst {before:.0f} MiB, peak {peak:.0f} MiB, idle after {after:.0f} MiB")
    assert shrinks >= 1 and peak > before + BURST_GROWTH_BOUND_MIB  # the burst did grow the cache
    assert after <= before + BURST_GROWTH_BOUND_MIB, (before, peak, after)
