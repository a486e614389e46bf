"""Warm start: expert episodes are tokenized like RL trajectories, and SFT learns the action format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from agentrl_trainers.sft import collect_expert_trajectories, sft_train, warm_start

from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.model import CausalLM
from agentrl.tokenizer import ChatTokenizer

ENV = "games/GuessNumber-v0"


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_checkpoint(tmp_path_factory.mktemp("base"), "tiny")


async def test_expert_tokens_are_the_rendered_conversation(base_model: Path) -> None:
    tok = ChatTokenizer(base_model)
    trajectories = await collect_expert_trajectories(ENV, tok, 4, seed_start=7)
    assert len(trajectories) == 4
    multi_turn = max(trajectories, key=lambda t: len(t.turns))
    assert len(multi_turn.turns) >= 2
    messages = [{"role": "system", "content": multi_turn.system_prompt}]
    for turn in multi_turn.turns:
        messages += [
            {"role": "user", "content": turn.observation},
            {"role": "assistant", "content": turn.action},
        ]
    rendered = tok.render(messages, add_generation_prompt=False)
    # The episode's tokens decode to the whole chat, up to the last end-of-turn token.
    assert tok.decode(multi_turn.token_ids()) == rendered[: rendered.rindex("<|im_end|>") + len("<|im_end|>")]
    # The loss covers exactly each action's text and its end-of-turn token.
    for turn in multi_turn.turns:
        assert turn.action_token_ids == [*tok.encode(turn.action), tok.end_of_turn_id]
    assert sum(multi_turn.loss_mask()) == sum(len(t.action_token_ids) for t in multi_turn.turns)


async def test_sft_lowers_the_action_loss(base_model: Path) -> None:
    tok = ChatTokenizer(base_model)
    trajectories = await collect_expert_trajectories(ENV, tok, 32, seed_start=100)
    torch.manual_seed(0)
    model = CausalLM.from_pretrained(base_model)
    result = sft_train(model, trajectories, epochs=4, batch_size=8, lr=3e-3)
    assert result.steps == 16
    assert result.final_loss < 0.4 * result.first_loss


async def test_warm_start_writes_a_servable_checkpoint(base_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft"
    result = await warm_start(base_model, out, ENV, episodes=8, seed_start=500)
    assert result.episodes == 8
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    ChatTokenizer(out)  # the chat template came along
    reloaded = CausalLM.from_pretrained(out)
    assert not torch.equal(reloaded.lm_head.weight, CausalLM.from_pretrained(base_model).lm_head.weight)
