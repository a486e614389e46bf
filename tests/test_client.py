"""PolicyClient: multi-turn episodes are exact token concatenations; the chat-template boundary."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from agentrl.generation import SamplingParams
from agentrl.rollout.client import PolicyClient
from agentrl.rollout.ledger import TokenLedger
from agentrl.rollout.protocol import PolicyInput
from agentrl.serving.engine import TorchEngine
from tests.policy_server_helpers import running_server


class RecordingEngine(TorchEngine):
    """The real engine, remembering the last prompt it was sent (to compare with the client)."""

    async def generate(self, prompt_token_ids, params, *, session_id=None):
        self.last_prompt = list(prompt_token_ids)
        self.last_result = await super().generate(prompt_token_ids, params, session_id=session_id)
        return self.last_result


@pytest.mark.parametrize("max_tokens", [3, 40])  # 3: turns end by length; 40: some may end at <|im_end|>
async def test_episode_tokens_are_exactly_what_was_sent_and_sampled(ckpt, tokenizer, max_tokens):
    engine = RecordingEngine.from_pretrained(ckpt)
    async with running_server(engine, tokenizer) as url:
        client = PolicyClient(
            url, tokenizer, sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)
        )
        messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": "obs 0"}]
        outputs = []
        for turn in range(4):
            out = await client(PolicyInput("ep-1", turn, messages, env=None))
            outputs.append(out)
            assert out.versions == [0] * len(out.token_ids) and len(out.logprobs) == len(out.token_ids)
            messages += [
                {"role": "assistant", "content": out.text},
                {"role": "user", "content": f"obs {turn + 1}"},
            ]
        everything = [t for o in outputs for t in o.prompt_token_ids + o.token_ids]
        assert (
            everything == engine.last_prompt + engine.last_result.token_ids == client.episode_tokens("ep-1")
        )
        # Turns 2.. re-encode only the new observation: the server kept the session's prefix.
        assert (
            engine.last_result.cached_prompt_tokens
            == len(engine.last_prompt) - len(outputs[-1].prompt_token_ids) - 1
        )
        # Turns that did not end with <|im_end|> were closed by the client before the next message.
        for prev, nxt in itertools.pairwise(outputs):
            closed = prev.token_ids[-1] == tokenizer.end_of_turn_id
            expected_head = tokenizer.encode(
                "\n<|im_start|>user\n" if closed else "<|im_end|>\n<|im_start|>user\n"
            )
            assert nxt.prompt_token_ids[: len(expected_head)] == expected_head
        await client.end_episode("ep-1")
        await client.aclose()  # waits for the background session release
        assert engine.kept_sessions == 0


async def test_a_seeded_client_samples_the_same_tokens_for_the_same_episode_and_turn(ckpt, tokenizer):
    async with running_server(TorchEngine.from_pretrained(ckpt), tokenizer) as url:
        params = SamplingParams(max_tokens=20, temperature=1.0)
        client = PolicyClient(url, tokenizer, sampling=params, seed=7)
        messages = [{"role": "user", "content": "go"}]

        def ask(episode_id: str, seed: int, index: int):
            return client(PolicyInput(episode_id, 0, messages, env=None, seed=seed, index=index))

        first = await ask("a", 3, 0)
        # the same (seed, index, turn) again, batched beside other requests this time
        again, other_index, other_seed = await asyncio.gather(ask("b", 3, 0), ask("c", 3, 1), ask("d", 4, 0))
        assert again.token_ids == first.token_ids and again.logprobs == pytest.approx(first.logprobs)
        assert other_index.token_ids != first.token_ids and other_seed.token_ids != first.token_ids
        await client.aclose()


def test_boundary_equals_apply_chat_template_for_canonical_eos_terminated_turns(tokenizer):
    """If each reply was sampled as its canonical tokens + <|im_end|>, the ledger's tokens equal
    `apply_chat_template` of the whole conversation: the separator "\\n" sits right after <|im_end|>."""
    ledger = TokenLedger(tokenizer)
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2 + 2 ?"}]
    replies = ["4", "It is 4, as said before.", "ok"]
    for i, reply in enumerate(replies):
        prompt = ledger.next_prompt(messages)
        sampled = ledger.action_tokens(reply)
        ledger.record(prompt, sampled, messages_seen=len(messages))
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"next {i}"}]
    whole = tokenizer.encode_chat(messages[:-1], add_generation_prompt=False)
    # The template ends the last assistant turn with "<|im_end|>\n"; the client stops at <|im_end|>.
    assert ledger.tokens + tokenizer.encode("\n") == whole
