"""The embedded torch engine: exact greedy decoding, honest log-probs, sessions, live weight updates."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from agentrl.generation import SamplingParams
from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.engine import TorchEngine
from agentrl.serving.engine_api import EngineOverloaded, InvalidRequest, StaleVersion
from agentrl.serving.model import CausalLM

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
# The same checks run on a GPU with AGENTRL_TEST_DEVICE=cuda.
DEVICE = os.environ.get("AGENTRL_TEST_DEVICE", "cpu")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return init_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", vocab_size=1024, seed=3)


@pytest.fixture
async def engine(ckpt):
    eng = TorchEngine.from_pretrained(ckpt, device=DEVICE)
    eng.eos_token_ids = frozenset()  # random weights: do not let an early EOS shorten the checks
    await eng.start()
    yield eng
    await eng.stop()


def reference_greedy(model: CausalLM, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids], device=DEVICE))[0, -1].argmax()))
    return ids[len(prompt) :]


def full_logprobs(model: CausalLM, prompt: list[int], sampled: list[int]) -> list[float]:
    ids = torch.tensor([prompt + sampled], device=DEVICE)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids)[0].float(), -1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(sampled)]


PROMPTS = [[5, 9, 31, 7], list(range(40, 80)), [3] * 17, [11, 12]]


async def test_greedy_is_deterministic_and_matches_full_forward(engine):
    first = await asyncio.gather(*(engine.generate(p, GREEDY) for p in PROMPTS))
    again = await asyncio.gather(*(engine.generate(p, GREEDY) for p in PROMPTS))
    for p, a, b in zip(PROMPTS, first, again, strict=True):
        assert a.token_ids == b.token_ids == reference_greedy(engine.model, p, 12)
        assert a.finish_reason == "length" and a.versions == [0] * 12


@pytest.mark.parametrize("batched", [False, True])
async def test_logprobs_are_the_models_log_softmax(engine, batched):
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=7)
    if batched:
        results = await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS))
    else:
        results = [await engine.generate(p, params) for p in PROMPTS]
    for p, r in zip(PROMPTS, results, strict=True):
        torch.testing.assert_close(r.logprobs, full_logprobs(engine.model, p, r.token_ids), atol=2e-4, rtol=0)


async def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=123)
    alone = await engine.generate(PROMPTS[0], params)
    crowd = await asyncio.gather(*(engine.generate(p, params) for p in [PROMPTS[0], *PROMPTS[1:]] * 3))
    assert crowd[0].token_ids == alone.token_ids


async def test_top_p_logprobs_are_renormalised_over_the_nucleus(engine):
    r = await engine.generate(PROMPTS[1], SamplingParams(max_tokens=6, temperature=0.7, top_p=0.5, seed=1))
    ids = torch.tensor([PROMPTS[1] + r.token_ids], device=DEVICE)
    with torch.no_grad():
        logits = engine.model(ids)[0, len(PROMPTS[1]) - 1 : -1] / 0.7
    for i, (tok, lp) in enumerate(zip(r.token_ids, r.logprobs, strict=True)):  # tempered, then nucleus
        probs = torch.softmax(logits[i], -1)
        sorted_p, order = probs.sort(descending=True)
        keep = order[(sorted_p.cumsum(0) - sorted_p) < 0.5]
        assert tok in keep.tolist()
        expected = float(torch.log(probs[tok] / probs[keep].sum()))
        assert lp == pytest.approx(expected, abs=2e-4)


async def test_session_reuses_the_prefix_and_gives_the_same_tokens(engine):
    turn1 = await engine.generate(PROMPTS[1], GREEDY, session_id="ep")
    assert turn1.cached_prompt_tokens == 0
    history = PROMPTS[1] + turn1.token_ids + [7, 8, 9]
    turn2 = await engine.generate(history, GREEDY, session_id="ep")
    assert turn2.cached_prompt_tokens == len(PROMPTS[1]) + len(turn1.token_ids) - 1
    assert turn2.token_ids == reference_greedy(engine.model, history, 12)
    # A prompt that diverges from the kept prefix falls back to a full prefill, still exact.
    other = [1, 2, *history[2:]]
    turn3 = await engine.generate(other, GREEDY, session_id="ep")
    assert turn3.cached_prompt_tokens == 0
    assert turn3.token_ids == reference_greedy(engine.model, other, 12)


async def test_weight_update_mid_stream_switches_versions_and_weights(engine, ckpt):
    new_state = {k: v.clone() + 0.05 * torch.randn_like(v) for k, v in engine.model.state_dict().items()}
    new_model = CausalLM.from_pretrained(ckpt, device=DEVICE)
    new_model.load_state_dict(new_state)
    old_model = CausalLM.from_pretrained(ckpt, device=DEVICE)
    prompt = PROMPTS[1]
    task = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=200, temperature=0.0)))
    while engine.stats.generated_tokens < 5:
        await asyncio.sleep(0.001)
    assert await engine.update_weights(new_state, version=1) == 1
    r = await task
    switch = r.versions.index(1)
    assert switch > 0 and r.versions == [0] * switch + [1] * (len(r.versions) - switch)
    before = reference_greedy(old_model, prompt, switch)
    assert r.token_ids[:switch] == before
    after = reference_greedy(new_model, prompt + before, len(r.token_ids) - switch)
    assert r.token_ids[switch:] == after
    assert engine.version == 1
    later = await engine.generate(prompt, GREEDY)
    assert later.versions == [1] * 12 and later.token_ids == reference_greedy(new_model, prompt, 12)


async def test_weight_update_from_a_checkpoint_directory(engine, ckpt):
    version = await engine.update_weights(str(ckpt), version=7)
    assert version == engine.version == 7  # exactly the caller's number: the trainer owns it
    with pytest.raises(StaleVersion):
        await engine.update_weights(str(ckpt), version=6)
    assert engine.version == 7


async def test_stop_strings_and_stop_tokens(engine):
    free = await engine.generate(PROMPTS[0], GREEDY)
    stop_tok = free.token_ids[3]
    params = SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop_tok])
    r = await engine.generate(PROMPTS[0], params)
    assert r.finish_reason == "stop" and r.token_ids == free.token_ids[: free.token_ids.index(stop_tok) + 1]
    text = engine.decode(free.token_ids[:5])
    r = await engine.generate(PROMPTS[0], SamplingParams(max_tokens=12, temperature=0, stop=[text[-2:]]))
    assert r.finish_reason == "stop" and engine.decode(r.token_ids).endswith(text[-2:])


async def test_bad_requests_and_overload_are_refused(engine):
    with pytest.raises(InvalidRequest, match="empty"):
        await engine.generate([], GREEDY)
    with pytest.raises(InvalidRequest, match="top_p"):
        await engine.generate([1], SamplingParams(top_p=0))
    with pytest.raises(InvalidRequest, match="out of range"):
        await engine.generate([10**6], GREEDY)
    engine.max_queue = 0
    with pytest.raises(EngineOverloaded):
        await engine.generate([1, 2], GREEDY)


async def test_identical_prompts_share_one_prefill_and_sample_as_if_alone(engine):
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=s) for s in range(4)]
    alone = [await engine.generate(PROMPTS[1], p) for p in params]
    shared_before = engine.stats.shared_prompt_tokens
    together = await asyncio.gather(*(engine.generate(PROMPTS[1], p) for p in params))
    assert engine.stats.shared_prompt_tokens - shared_before == 3 * len(PROMPTS[1])
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)


async def test_a_stream_gives_the_same_tokens_as_generate(engine):
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=4, top_logprobs=3)
    whole = await engine.generate(PROMPTS[0], params)
    chunks = [c async for c in engine.stream(PROMPTS[0], params)]
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    assert [t for c in chunks for t in c.top_logprobs] == whole.top_logprobs
    assert chunks[-1].finish_reason == whole.finish_reason and all(
        c.finish_reason is None for c in chunks[:-1]
    )
    assert all(len(top) == 3 for top in whole.top_logprobs)


async def test_cancelled_requests_leave_at_the_next_step_and_are_counted(engine):
    tasks = [asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=1000))) for p in PROMPTS]
    while engine.running < len(PROMPTS):
        await asyncio.sleep(0.001)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for _ in range(500):
        if engine.running == 0:
            break
        await asyncio.sleep(0.002)
    assert engine.running == 0 and engine.stats.cancelled == len(PROMPTS) and engine.stats.finished == 0


async def test_the_kv_cache_and_session_store_stay_within_their_budgets(ckpt):
    probe = TorchEngine.from_pretrained(ckpt, device=DEVICE)
    row = probe.max_len * probe.bytes_per_token  # one full-context row: the smallest KV budget
    eng = TorchEngine.from_pretrained(ckpt, device=DEVICE, kv_cache_bytes=row, session_bytes=row // 4)
    eng.eos_token_ids = frozenset()
    await eng.start()
    try:
        prompt = list(range(5, 105))
        params = SamplingParams(max_tokens=150, temperature=0.0)  # reserves 250 positions: 8 of 16 fit
        results = await asyncio.gather(*(eng.generate(prompt, params, session_id=f"s{i}") for i in range(16)))
        assert all(r.finish_reason == "length" for r in results)
        assert 0 < eng.stats.kv_cache_peak_bytes <= row
        assert eng.metrics()["session_bytes"] <= row // 4 and eng.stats.session_evictions > 0
        reference = reference_greedy(eng.model, prompt, 20)
        assert all(r.token_ids[:20] == reference for r in results)  # budgeted, still exact
    finally:
        await eng.stop()
