"""A real pretrained model through the whole path: SmolLM2-135M-Instruct imported from its GGUF.

The checkpoint is imported once per test session (`smollm2` fixture in conftest.py). Generations
are greedy and short: the model is 135M parameters on a shared CPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.generation import SamplingParams
from agentrl.rollout.client import PolicyClient
from agentrl.rollout.ledger import TokenLedger
from agentrl.rollout.manager import EnvManager
from agentrl.serving.engine import TorchEngine
from agentrl.serving.model import CausalLM
from agentrl.tools import template_messages
from tests.policy_server_helpers import running_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
CHATS = [
    [{"role": "user", "content": "Hi there! What's 2+2?"}],
    [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "Tell me a joke about cats.\n\nKeep it short  please."},
        {"role": "assistant", "content": "Pourquoi le chat... ¿qué? 🐱"},
        {"role": "user", "content": "Again, with code: `print('x')`"},
    ],
    [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "18 C, sunny"},
    ],
]


def test_imported_checkpoint_matches_transformers_in_config_logits_and_tokens(smollm2, smollm2_tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ours = CausalLM.from_pretrained(smollm2)
    cfg = ours.config
    # the Llama features SmolLM2 uses, read from its GGUF metadata
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.tie_word_embeddings and ours.lm_head.weight is ours.model.embed_tokens.weight
    assert cfg.rope_theta == 100000.0 and cfg.rms_norm_eps == pytest.approx(1e-5)
    assert (cfg.vocab_size, cfg.num_hidden_layers) == (49152, 30)

    reference = AutoTokenizer.from_pretrained(str(smollm2))
    for chat in CHATS:
        tools = [WEATHER] if any(m.get("tool_calls") for m in chat) else None
        ids = smollm2_tokenizer.encode_chat(chat, add_generation_prompt=True, tools=tools)
        # transformers renders the same template on the default tool format's messages
        expected = reference.apply_chat_template(
            template_messages(chat, tools, native=False), add_generation_prompt=True, tokenize=False
        )
        assert ids == reference(expected, add_special_tokens=False)["input_ids"]

    hf = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    ids = torch.tensor([smollm2_tokenizer.encode_chat(CHATS[0])])
    with torch.no_grad():
        assert torch.allclose(ours(ids), hf(ids).logits, atol=1e-4)


def test_ledger_tokens_equal_the_rendered_conversation_with_tool_turns(smollm2_tokenizer):
    """Canonical replies (their own tokens + end-of-turn): the ledger's tokens are exactly the
    chat template applied to the whole conversation, tool calls and tool results included."""
    tokenizer = smollm2_tokenizer
    ledger = TokenLedger(tokenizer)
    messages = [{"role": "user", "content": "Weather in Paris and Rome?"}]
    second = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
    }
    replies = [
        ({"role": "assistant", "content": "Checking both.", "tool_calls": [CALL, second]}, ["18 C", "25 C"]),
        ({"role": "assistant", "content": "Paris 18 C, Rome 25 C."}, []),
    ]
    for reply, results in replies:
        prompt = ledger.next_prompt(messages, tools=[WEATHER])
        text = template_messages([reply], None, native=False)[0]["content"]
        ledger.record(prompt, ledger.action_tokens(text), messages_seen=len(messages))
        messages.append(reply)
        for call, result in zip(reply.get("tool_calls", []), results, strict=True):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    whole = tokenizer.encode_chat(messages, add_generation_prompt=False, tools=[WEATHER])
    assert ledger.tokens + tokenizer.encode(tokenizer.turn_separator) == whole


async def test_openai_client_with_tools_gets_tool_calls(smollm2, smollm2_tokenizer):
    openai = pytest.importorskip("openai")
    async with running_server(TorchEngine.from_pretrained(smollm2), smollm2_tokenizer, "smollm2") as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        question = {"role": "user", "content": "What is the weather in Paris?"}
        reply = await client.chat.completions.create(
            model="smollm2",
            messages=[question],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=24,
            temperature=0.0,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
            "city": "Paris"
        }
        assert call.id.startswith("call_") and call.type == "function"

        # the call and its result go back as history; with tool_choice="none" nothing is parsed
        history = [question, choice.message.model_dump(exclude_none=True)]
        history.append({"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"})
        follow = await client.chat.completions.create(
            model="smollm2",
            messages=history,
            tools=[WEATHER],
            tool_choice="none",
            max_tokens=6,
            temperature=0.0,
        )
        assert follow.choices[0].message.tool_calls is None and follow.choices[0].message.content

        with pytest.raises(openai.BadRequestError, match="not among the tools"):
            await client.chat.completions.create(
                model="smollm2",
                messages=[question],
                tools=[WEATHER],
                tool_choice={"type": "function", "function": {"name": "send_email"}},
            )
        await client.close()


class RecordingEngine(TorchEngine):
    """The real engine, keeping every (prompt, sampled tokens) pair per session."""

    async def generate(self, prompt_token_ids, params, *, session_id=None):
        result = await super().generate(prompt_token_ids, params, session_id=session_id)
        self.seen = getattr(self, "seen", {})
        self.seen.setdefault(session_id, []).append((list(prompt_token_ids), list(result.token_ids)))
        return result


async def test_a_tool_episode_records_exactly_what_the_server_received_and_sampled(
    smollm2, smollm2_tokenizer
):
    tokenizer = smollm2_tokenizer
    engine = RecordingEngine.from_pretrained(smollm2)
    async with running_server(engine, tokenizer, "smollm2") as url:
        client = PolicyClient(
            url,
            tokenizer,
            sampling=SamplingParams(max_tokens=20, temperature=0.0),
            tool_choice={"type": "function", "function": {"name": "calculate"}},  # SmolLM would not call
        )
        async with EnvManager("games/Calculator-v0", client, max_turns=3) as manager:
            (group,) = await manager.run([1])
        await client.aclose()
    (trajectory,) = group.trajectories
    assert trajectory.stop_reason.finished, trajectory.error
    calls = [call for turn in trajectory.turns for call in turn.info["tool_calls"]]
    assert len(calls) >= 3 and manager.stats.tool_calls == len(calls)

    requests = engine.seen[trajectory.episode_id]
    assert len(requests) == len(trajectory.turns)
    context: list[int] = []
    for turn, (prompt, sampled) in zip(trajectory.turns, requests, strict=True):
        assert prompt == context + turn.prompt_token_ids  # separators, tool messages, forced opening
        assert sampled == turn.action_token_ids and len(turn.action_logprobs) == len(sampled)
        context = prompt + sampled
    rendered = tokenizer.decode(context)
    assert rendered.count("<|im_start|>tool\n") >= len(trajectory.turns) - 1
    assert rendered.count('<tool_call>\n{"name": "calculate", "arguments": {"') == len(trajectory.turns)
    assert '"name": "calculate"' in rendered.split("<|im_start|>user")[0]  # the tools, in the system turn
