"""LatencyEngine: step times from the profile, real token ids, versions, KV capacity, sessions, HTTP."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agentrl.errors import ConfigError
from agentrl.generation import SamplingParams
from agentrl.rollout.client import PolicyClient
from agentrl.rollout.manager import EnvManager
from agentrl.serving.engine_api import InvalidRequest
from agentrl.serving.latency_engine import LatencyEngine, LatencyProfile
from agentrl.sim.clock import run_virtual
from agentrl.sim.distributions import Constant, LogNormal
from agentrl.sim.env import LatencyEnv
from tests.policy_server_helpers import running_server

PROFILE = LatencyProfile(
    name="test",
    source="assumed: test numbers",
    decode_base_s=0.010,
    decode_per_seq_s=0.001,
    decode_per_ctx_token_s=1e-5,
    prefill_base_s=0.005,
    prefill_per_token_s=1e-4,
    kv_capacity_tokens=100_000,
    max_batch=8,
    max_len=4096,
    weight_sync_s=0.5,
)
POOL = range(10, 60)


def engine(profile: LatencyProfile = PROFILE, length: int = 10, **kwargs) -> LatencyEngine:
    return LatencyEngine(profile, response_tokens=Constant(length), eos_token_id=2, token_pool=POOL, **kwargs)


def test_one_request_takes_its_prefill_plus_one_decode_step_per_further_token():
    async def main():
        e = engine(length=10)
        await e.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        result = await e.generate(list(range(100)), SamplingParams(max_tokens=64))
        elapsed = loop.time() - t0
        await e.stop()
        return result, elapsed, e.stats

    result, elapsed, stats = run_virtual(main())
    # prefill samples token 1; tokens 2..10 take one decode step each at context 101..109
    decode = sum(PROFILE.decode_step_s(1, 101 + i) for i in range(9))
    assert elapsed == pytest.approx(PROFILE.prefill_s(100) + decode)
    assert stats.busy_s == pytest.approx(elapsed)
    assert len(result.token_ids) == 10 and result.token_ids[-1] == 2 and result.finish_reason == "stop"
    assert all(t in POOL for t in result.token_ids[:-1])
    assert result.versions == [0] * 10 and len(result.logprobs) == 10


def test_max_tokens_cuts_the_response_without_eos():
    async def main():
        e = engine(length=50)
        await e.start()
        result = await e.generate([5, 6, 7], SamplingParams(max_tokens=4))
        await e.stop()
        return result

    result = run_virtual(main())
    assert len(result.token_ids) == 4 and result.finish_reason == "length" and 2 not in result.token_ids


def test_a_request_arriving_mid_decode_joins_at_the_next_step_boundary():
    async def main():
        e = engine(length=40)
        await e.start()
        loop = asyncio.get_running_loop()
        first = asyncio.create_task(e.generate([1] * 10, SamplingParams(max_tokens=64)))
        await asyncio.sleep(0.1)
        t_join = loop.time()
        await e.generate([1] * 10, SamplingParams(max_tokens=64))
        second_done = loop.time()
        await first
        first_done = loop.time()
        await e.stop()
        return t_join, second_done, first_done, e.stats

    t_join, second_done, first_done, stats = run_virtual(main())
    # the second request ran beside the first (batch 2), not after it
    assert second_done < first_done + 0.5
    assert stats.generated_tokens == 80 and stats.finished == 2
    # alone it would take prefill + 39 decode steps at batch 1; beside another it takes longer
    alone = PROFILE.prefill_s(10) + sum(PROFILE.decode_step_s(1, 11 + i) for i in range(39))
    assert second_done - t_join > alone


def test_weight_update_waits_its_sync_time_and_stamps_the_new_version_on_later_tokens():
    async def main():
        e = engine(length=200)
        await e.start()
        job = asyncio.create_task(e.generate([1] * 5, SamplingParams(max_tokens=256)))
        await asyncio.sleep(0.5)
        assert await e.update_weights(None, 3) == 3
        with pytest.raises(InvalidRequest, match="stale version"):
            await e.update_weights(None, 2)
        assert await e.update_weights(None, 3) == 3  # equal: an idempotent re-push
        result = await job
        await e.stop()
        return result, e.stats

    result, stats = run_virtual(main())
    assert result.versions[0] == 0 and result.versions[-1] == 3
    assert result.versions == sorted(result.versions) and len(result.versions) == 200
    assert stats.weight_updates == 2 and stats.weight_sync_s == pytest.approx(1.0)


def test_kv_capacity_bounds_resident_context_and_everything_still_finishes():
    small = LatencyProfile(**{**PROFILE.to_dict(), "kv_capacity_tokens": 400, "max_batch": 64})

    async def main():
        e = engine(small, length=60)
        await e.start()
        peak = 0

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, e._resident)
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(
            *(e.generate([1] * 50, SamplingParams(max_tokens=64)) for _ in range(12))
        )
        watcher.cancel()
        await e.stop()
        return results, peak, e.stats

    results, peak, stats = run_virtual(main())
    assert all(len(r.token_ids) == 60 for r in results)
    assert peak <= 400
    assert stats.finished == 12


def test_a_session_prefills_only_the_tokens_after_its_kept_prefix():
    async def main():
        e = engine(length=5)
        await e.start()
        first = await e.generate(list(range(3, 103)), SamplingParams(), session_id="s")
        follow = list(range(3, 103)) + first.token_ids + [7] * 20
        second = await e.generate(follow, SamplingParams(), session_id="s")
        e.drop_sessions(["s"])
        third = await e.generate(follow, SamplingParams(), session_id="s")
        await e.stop()
        return second, third

    second, third = run_virtual(main())
    assert second.cached_prompt_tokens == 104  # prompt + all sampled tokens but the last
    assert third.cached_prompt_tokens == 0


def test_bad_requests_and_profiles_get_clear_errors(tmp_path):
    async def main():
        e = engine()
        with pytest.raises(Exception, match="not started"):
            await e.generate([1], SamplingParams())
        await e.start()
        with pytest.raises(InvalidRequest, match="empty"):
            await e.generate([], SamplingParams())
        with pytest.raises(InvalidRequest, match="max_tokens"):
            await e.generate([1], SamplingParams(max_tokens=0))
        await e.stop()

    run_virtual(main())
    bad = tmp_path / "p.json"
    bad.write_text('{"engine": {"name": "x", "source": "assumed"}}')
    with pytest.raises(ConfigError, match="lacks"):
        LatencyProfile.load(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        LatencyProfile.load(tmp_path / "missing.json")


async def test_served_over_http_the_client_and_manager_run_unchanged(tokenizer):
    fast = LatencyProfile(**{**PROFILE.to_dict(), "decode_base_s": 1e-4, "decode_per_ctx_token_s": 0.0})
    e = LatencyEngine(
        fast, response_tokens=Constant(6), eos_token_id=tokenizer.eos_token_ids[0], token_pool=range(20, 200)
    )
    async with running_server(e, tokenizer) as url:
        client = PolicyClient(url, tokenizer, sampling=SamplingParams(max_tokens=16))
        manager = EnvManager(
            lambda: LatencyEnv(turns=Constant(3), observation_tokens=Constant(5)), client, group_size=2
        )
        groups = await manager.run(range(3))
        await client.aclose()
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{url}/metrics")).json()
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(trajectories) == 6 and all(len(t.turns) == 3 for t in trajectories)
    assert all(len(turn.action_token_ids) == 6 for t in trajectories for turn in t.turns)
    assert metrics["engine"]["finished"] == 18 and metrics["engine"]["busy_s"] > 0


def test_a_cancelled_request_leaves_the_batch_and_frees_its_context():
    async def main():
        e = engine(length=100)
        await e.start()
        keep = asyncio.create_task(e.generate([1] * 20, SamplingParams(max_tokens=128)))
        drop = asyncio.create_task(e.generate([1] * 20, SamplingParams(max_tokens=128)))
        await asyncio.sleep(0.002)  # both are being prefilled
        drop.cancel()
        result = await keep
        await asyncio.sleep(0)
        resident, running = e._resident, e.running
        await e.stop()
        return result, resident, running, e.stats

    result, resident, running, stats = run_virtual(main())
    assert len(result.token_ids) == 100 and stats.finished == 1
    assert resident == 0 and running == 0


def test_with_chunked_prefill_a_new_request_does_not_stall_the_running_batch():
    chunked = LatencyProfile(**{**PROFILE.to_dict(), "chunked_prefill": True})

    async def main(profile):
        e = engine(profile, length=30)
        await e.start()
        loop = asyncio.get_running_loop()
        first = asyncio.create_task(e.generate([1] * 10, SamplingParams(max_tokens=64)))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(e.generate([1] * 200, SamplingParams(max_tokens=64)))
        await first
        first_done = loop.time()
        await second
        await e.stop()
        return first_done, e.stats

    (separate_done, separate), (riding_done, riding) = run_virtual(main(PROFILE)), run_virtual(main(chunked))
    assert separate.generated_tokens == riding.generated_tokens == 60
    # the running request keeps decoding during the newcomer's prefill instead of waiting for it
    assert riding_done < separate_done
    assert riding.prefilled_tokens == separate.prefilled_tokens == 210


def test_stream_gives_the_whole_response_as_one_final_chunk_and_metrics_report_it():
    async def main():
        e = engine(length=7)
        await e.start()
        chunks = [c async for c in e.stream([1, 2, 3], SamplingParams(max_tokens=16))]
        metrics = e.metrics()
        await e.stop()
        return chunks, metrics

    chunks, metrics = run_virtual(main())
    assert len(chunks) == 1 and chunks[0].finish_reason == "stop" and len(chunks[0].token_ids) == 7
    assert metrics["finished"] == 1 and metrics["running"] == 0 and metrics["modelled"] is True


def test_a_prompt_factor_gives_every_sample_of_one_prompt_the_same_length_scale():
    async def main():
        e = engine(length=100, prompt_factor=LogNormal(1.0, 1.0, cap=3.0, floor=0.1))
        await e.start()
        params = SamplingParams(max_tokens=1000)
        prompts = [[5, 6, seed] for seed in range(12)]
        lengths = [
            [len((await e.generate(prompt, params)).token_ids) for _ in range(3)] for prompt in prompts
        ]
        await e.stop()
        return lengths

    lengths = run_virtual(main())
    assert all(len(set(per_prompt)) == 1 for per_prompt in lengths)  # re-asked prompts repeat
    assert len({per_prompt[0] for per_prompt in lengths}) > 6  # different prompts differ
    assert all(10 <= per_prompt[0] <= 300 for per_prompt in lengths)  # 100 x [floor, cap]
    # Without a factor the same prompts keep the workload's own length.
    plain = run_virtual(_lengths_of(engine(length=100), [[5, 6, seed] for seed in range(4)]))
    assert plain == [100] * 4


async def _lengths_of(e: LatencyEngine, prompts: list[list[int]]) -> list[int]:
    await e.start()
    out = [len((await e.generate(p, SamplingParams(max_tokens=1000))).token_ids) for p in prompts]
    await e.stop()
    return out
