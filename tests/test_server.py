"""The real HTTP policy server: OpenAI routes, the token route, weight updates, errors, backpressure."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
import torch

from agentrl.serving.engine import TorchEngine
from tests.policy_server_helpers import running_server


async def test_openai_client_gets_a_chat_completion(ckpt, tokenizer):
    import openai

    async with running_server(TorchEngine.from_pretrained(ckpt), tokenizer) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none")
        reply = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=8,
            temperature=0,
            logprobs=True,
        )
        choice = reply.choices[0]
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1
        assert len(choice.logprobs.content) == reply.usage.completion_tokens
        models = await client.models.list()
        assert [m.id for m in models.data] == ["tiny"]
        done = await client.completions.create(model="tiny", prompt="The answer is", max_tokens=5, logprobs=0)
        assert len(done.choices[0].logprobs.token_logprobs) == done.usage.completion_tokens
        await client.close()


async def test_token_route_weights_health_and_metrics(ckpt, tokenizer, tmp_path):
    engine = TorchEngine.from_pretrained(ckpt)
    async with running_server(engine, tokenizer) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"prompt_token_ids": [5, 6, 7], "max_tokens": 4, "temperature": 0, "session_id": "s"}
        out = (await http.post("/v1/generate", json=body)).json()
        assert len(out["token_ids"]) == len(out["logprobs"]) == len(out["versions"]) >= 1
        assert out["versions"] == [0] * len(out["token_ids"])

        from safetensors.torch import save

        state = {k: v + 0.01 for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}
        r = await http.post("/v1/weights/state_dict", content=save(state))
        # The trainer owns the version: a push without one is refused.
        assert r.status_code == 400 and "X-Policy-Version" in r.json()["error"]["message"]
        r = await http.post("/v1/weights/state_dict", content=save(state), headers={"X-Policy-Version": "1"})
        assert r.json() == {"version": 1}
        r = await http.post("/v1/weights/load", json={"path": str(ckpt), "version": 2})
        assert r.json() == {"version": 2}
        r = await http.post("/v1/weights/load", json={"path": str(ckpt), "version": 1})
        assert r.status_code == 409 and "stale version" in r.json()["error"]["message"]
        norm = engine.model.model.norm.weight  # back to the checkpoint's (all-ones) norm weights
        torch.testing.assert_close(norm, torch.ones_like(norm))
        out = (await http.post("/v1/generate", json=body)).json()
        assert set(out["versions"]) == {2}

        assert (await http.get("/health")).json()["version"] == 2
        metrics = (await http.get("/metrics")).json()
        assert metrics["version"] == 2 and metrics["requests"]["generate"] == 2
        assert metrics["engine"]["weight_updates"] == 2 and "queue_depth" in metrics
        await http.post("/v1/generate", json=body | {"session_id": "t"})
        assert engine.kept_sessions == 2  # the KV prefixes of sessions s and t
        assert (await http.delete("/v1/sessions/s")).status_code == 200
        assert engine.kept_sessions == 1
        r = await http.post("/v1/sessions/release", json={"session_ids": ["t", "never-seen"]})
        assert r.status_code == 200 and engine.kept_sessions == 0
        r = await http.post("/v1/sessions/release", json={"session_ids": "t"})
        assert r.status_code == 400 and "session_ids" in r.json()["error"]["message"]


async def test_bad_requests_get_4xx_with_a_message(ckpt, tokenizer):
    async with (
        running_server(TorchEngine.from_pretrained(ckpt), tokenizer) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        r = await http.post("/v1/generate", content=b"{not json")
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = await http.post("/v1/generate", json={"prompt_token_ids": [1], "temperature": -1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
        r = await http.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
        assert r.status_code == 400 and "messages.0.role" in r.json()["error"]["message"]
        r = await http.post("/v1/generate", json={"prompt_token_ids": [10**7]})
        assert r.status_code == 400 and "out of range" in r.json()["error"]["message"]
        r = await http.post("/v1/weights/load", json={"path": "/nonexistent", "version": 1})
        assert r.status_code == 400
        r = await http.post("/v1/weights/state_dict", content=b"garbage", headers={"X-Policy-Version": "1"})
        assert r.status_code == 400


async def test_overload_gets_429(ckpt, tokenizer):
    engine = TorchEngine.from_pretrained(ckpt, max_batch=1, max_queue=1)
    async with running_server(engine, tokenizer) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"prompt_token_ids": [5, 6, 7], "max_tokens": 50, "temperature": 1.0, "stop_token_ids": []}
        engine.eos_token_ids = frozenset()
        responses = await asyncio.gather(*(http.post("/v1/generate", json=body) for _ in range(8)))
        codes = [r.status_code for r in responses]
        assert 200 in codes and 429 in codes
        rejected = next(r for r in responses if r.status_code == 429)
        assert "queue is full" in rejected.json()["error"]["message"]


def test_server_process_reports_its_cpu_time(ckpt):
    """`agentrl serve` as a child process: ready on /health, its CPU time readable, stopped cleanly."""
    from agentrl.serving.process import ServerProcess

    with ServerProcess(ckpt, threads=1, version=4) as server:
        assert httpx.get(f"{server.url}/health").json()["version"] == 4  # --policy-version
        group = server.pid
        first = server.cpu_seconds()
        assert first is not None and first > 0  # starting Python and loading the model took CPU
        body = {"prompt_token_ids": [5, 6, 7], "max_tokens": 8, "temperature": 1.0}
        for _ in range(5):
            httpx.post(f"{server.url}/v1/generate", json=body, timeout=60)
        assert server.cpu_seconds() >= first
    assert server.cpu_seconds() is None  # stopped
    with pytest.raises(ProcessLookupError):  # and nothing of its process group is left
        os.killpg(group, 0)


async def test_server_process_hands_its_keys_to_the_server_and_pushes_with_the_admin_key(ckpt):
    from agentrl.serving.model import CausalLM
    from agentrl.serving.process import ServerProcess

    state = CausalLM.from_pretrained(ckpt).state_dict()
    with ServerProcess(ckpt, threads=1, api_key="gen-key", admin_key="admin-key") as server:
        body = {"prompt_token_ids": [5, 6, 7], "max_tokens": 2}
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            assert (await http.post("/v1/generate", json=body)).status_code == 401
            ok = await http.post("/v1/generate", json=body, headers={"Authorization": "Bearer gen-key"})
            assert ok.status_code == 200
        assert await server.push(state, version=1) == 1  # the weight route takes the admin key
